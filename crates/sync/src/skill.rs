//! What the agent's loader sees in a skill: a directory holding `SKILL.md`,
//! whose YAML frontmatter names it. A merge is checked against this before
//! it is applied, so it never makes a skill the loader cannot read or two
//! skills with one name.
//!
//! The frontmatter is found as the agent finds it (`agent/skill_utils.py`,
//! `parse_frontmatter`: one leading BOM skipped, `---` at the start, the
//! first `\n---` line after it closes it); its `name:` is read as a plain
//! `key: value` line, the agent's own fallback when YAML fails.
//!
//! Locks: none; pure functions.

use crate::tree::{Entry, Tree, parent};

pub const SKILL_MD: &[u8] = b"SKILL.md";

/// The frontmatter of a `SKILL.md`, if it has one that closes.
pub fn frontmatter(text: &str) -> Option<&str> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text.strip_prefix("---")?;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if at > 0 && line.trim_end() == "---" {
            return Some(&rest[..at]);
        }
        at += line.len();
    }
    None
}

/// The `name:` of a frontmatter, unquoted.
pub fn name(front: &str) -> Option<String> {
    front.lines().find_map(|l| {
        let v = l.strip_prefix("name:")?.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(v);
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// The directories of `tree` that are skills (they hold a `SKILL.md` file).
pub fn roots(tree: &Tree) -> Vec<Vec<u8>> {
    tree.iter()
        .filter(|(p, e)| {
            matches!(e, Entry::File { .. }) && p.rsplit(|&b| b == b'/').next() == Some(SKILL_MD)
        })
        .filter_map(|(p, _)| parent(p).map(<[u8]>::to_vec))
        .collect()
}

/// The name the loader gives the skill at `root`: its frontmatter's, else
/// its directory's.
pub fn skill_name(root: &[u8], skill_md: Option<&str>) -> String {
    skill_md
        .and_then(frontmatter)
        .and_then(name)
        .unwrap_or_else(|| {
            String::from_utf8_lossy(root.rsplit(|&b| b == b'/').next().unwrap_or(root)).into_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontmatter_and_name_as_the_agent_reads_them() {
        let md = "\u{feff}---\nname: \"pdf-tools\"\ndescription: x\n---\nbody\n";
        assert_eq!(
            frontmatter(md),
            Some("\nname: \"pdf-tools\"\ndescription: x\n")
        );
        assert_eq!(frontmatter(md).and_then(name).as_deref(), Some("pdf-tools"));
        assert_eq!(frontmatter("---\nname: a\nno end\n"), None);
        assert_eq!(frontmatter("# no frontmatter\n"), None);
        assert_eq!(skill_name(b"cat/tools", Some("# none\n")), "tools");
    }
}
