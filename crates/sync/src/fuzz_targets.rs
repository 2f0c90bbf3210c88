//! The body of the `sync_merge` fuzz target (`fuzz/`, run by
//! `scripts/fuzz.sh`): trees and file contents as another replica's
//! fetched commits would give them, merged. The root's `tests/it/fuzz_replay.rs`
//! feeds it every kept crash input and seed under plain `cargo test`.
//!
//! Input: one entry a line, `<tree><kind><path>[\t<payload>]`: tree `0`
//! base, `1` ours, `2` theirs; kind `d` directory, `f` file, `x`
//! executable file, `l` symlink; the payload is a file's content (`\n`
//! written as the two characters `\` `n`) or a link's target.
//!
//! Locks: none.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::merge::{Contents, merge as merge_trees};
use crate::tree::{Entry, Tree};

struct Blobs(HashMap<String, Vec<u8>>);

impl Contents for Blobs {
    fn read(&self, blob: &str) -> Option<Vec<u8>> {
        self.0.get(blob).cloned()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The target: three trees read from `data`, merged; every text the merge
/// made is named by its hash, and a line merge of the first file's three
/// texts returns.
pub fn merge(data: &[u8]) {
    let mut trees = [Tree::new(), Tree::new(), Tree::new()];
    let mut blobs = Blobs(HashMap::new());
    let mut texts: [Option<String>; 3] = [None, None, None];
    for line in data.split(|&b| b == b'\n') {
        let [t, kind, rest @ ..] = line else {
            continue;
        };
        let Some(t) = t.checked_sub(b'0').map(usize::from).filter(|&t| t < 3) else {
            continue;
        };
        let (path, payload) = match rest.iter().position(|&b| b == b'\t') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &b""[..]),
        };
        let entry = match kind {
            b'd' => Entry::Dir,
            b'f' | b'x' => {
                let content = String::from_utf8_lossy(payload).replace("\\n", "\n");
                let blob = hex(&Sha256::digest(content.as_bytes()));
                if texts[t].is_none() {
                    texts[t] = Some(content.clone());
                }
                blobs.0.insert(blob.clone(), content.into_bytes());
                Entry::File {
                    blob,
                    exec: *kind == b'x',
                }
            }
            b'l' => Entry::Symlink {
                target: payload.to_vec(),
            },
            _ => continue,
        };
        trees[t].insert(path, entry);
    }
    let m = merge_trees(&trees[0], &trees[1], &trees[2], &blobs);
    for (name, bytes) in &m.new_blobs {
        assert_eq!(
            *name,
            hex(&Sha256::digest(bytes)),
            "a merged text is named by its hash"
        );
    }
    for (p, _) in m.tree.iter() {
        assert!(
            crate::tree::valid_path(p),
            "the merged tree holds only paths"
        );
    }
    let [b, o, t] = texts;
    let _ = crate::diff3::merge(
        b.as_deref().unwrap_or_default(),
        o.as_deref().unwrap_or_default(),
        t.as_deref().unwrap_or_default(),
    );
}

/// Valid inputs: their names and bytes (`fuzz/seeds/sync_merge/`).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let skill = |body: &str| format!("---\\nname: foo\\ndescription: d\\n---\\n{body}");
    vec![
        (
            "both-edit-one-skill".into(),
            format!(
                "0fcat/foo/SKILL.md\t{}\n1fcat/foo/SKILL.md\t{}\n2fcat/foo/SKILL.md\t{}\n\
                 2lcat/foo/ln\tSKILL.md\n1dcat/bar\n",
                skill("a\\nb\\nc\\n"),
                skill("A\\nb\\nc\\n"),
                skill("a\\nb\\nC\\n"),
            )
            .into_bytes(),
        ),
        (
            "overlap".into(),
            b"0fa/x\tone\\n\n1fa/x\ttwo\\n\n2fa/x\tthree\\n\n2xa/y\t#!/bin/sh\\n\n".to_vec(),
        ),
    ]
}
