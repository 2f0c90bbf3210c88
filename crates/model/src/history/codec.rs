//! The history index as bytes, for a checkpoint (`crate::checkpoint`):
//! what a mount would fold from the journal, loaded instead of folded.
//!
//! Invariants: `decode(encode(h))` is `h`, field for field (the tables a
//! fold derives, `paths` and `children`, are rebuilt the way `intern`
//! builds them: a child's index is past its parent's, so ascending order
//! gives the same lists; the changes' places in time are not stored but
//! placed again from their recorded times by the decoding reader's clock,
//! as its fold of the journal would); anything `decode` cannot read whole is `None`,
//! never a partial index. Integers are LEB128 (ids and sizes are small).
//!
//! Locks: none; plain values.

use std::collections::HashMap;

use super::{HistoryIndex, PathHasher, PathIdx};
use skillfs_base::relpath::{ByteString, RelPath};
use skillfs_store::journal::{EntryState, Kind};

struct W(Vec<u8>);

impl W {
    fn u(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return;
            }
            self.0.push(b | 0x80);
        }
    }
    fn i(&mut self, v: i64) {
        self.u(((v << 1) ^ (v >> 63)) as u64);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn ids(&mut self, v: &[u64]) {
        self.u(v.len() as u64);
        let mut prev = 0;
        for &x in v {
            self.u(x.wrapping_sub(prev));
            prev = x;
        }
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn u(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn i(&mut self) -> Option<i64> {
        let z = self.u()?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    }
    fn len(&mut self) -> Option<usize> {
        let n = usize::try_from(self.u()?).ok()?;
        // No count may claim more than the bytes left could hold.
        (n <= self.0.len()).then_some(n)
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.len()?;
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b.to_vec())
    }
    fn ids(&mut self) -> Option<Vec<u64>> {
        let n = self.len()?;
        let mut out = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            prev = prev.wrapping_add(self.u()?);
            out.push(prev);
        }
        Some(out)
    }
}

fn put_state(w: &mut W, s: &EntryState) {
    w.u(match s.kind {
        Kind::File => 0,
        Kind::Dir => 1,
        Kind::Symlink => 2,
    });
    match s.blob.as_deref() {
        None => w.u(0),
        Some(b) => match skillfs_store::blobs::raw_id(b) {
            Some(raw) if skillfs_base::relpath::hex(&raw) == b => {
                w.u(1);
                w.0.extend_from_slice(&raw);
            }
            _ => {
                w.u(2);
                w.bytes(b.as_bytes());
            }
        },
    }
    w.u(s.size);
    w.u(u64::from(s.mode));
    w.u(u64::from(s.uid));
    w.u(u64::from(s.gid));
    w.0.extend_from_slice(&s.mtime_ns.to_le_bytes());
    match &s.target {
        None => w.u(0),
        Some(t) => {
            w.u(1);
            w.bytes(&t.0);
        }
    }
}

fn get_state(r: &mut R) -> Option<EntryState> {
    let kind = match r.u()? {
        0 => Kind::File,
        1 => Kind::Dir,
        2 => Kind::Symlink,
        _ => return None,
    };
    let blob = match r.u()? {
        0 => None,
        1 => {
            let (raw, rest) = r.0.split_at_checked(32)?;
            r.0 = rest;
            Some(skillfs_base::relpath::hex(raw))
        }
        2 => Some(String::from_utf8(r.bytes()?).ok()?),
        _ => return None,
    };
    let size = r.u()?;
    let mode = u32::try_from(r.u()?).ok()?;
    let uid = u32::try_from(r.u()?).ok()?;
    let gid = u32::try_from(r.u()?).ok()?;
    let (t, rest) = r.0.split_at_checked(16)?;
    r.0 = rest;
    let mtime_ns = i128::from_le_bytes(t.try_into().ok()?);
    let target = match r.u()? {
        0 => None,
        1 => Some(ByteString(r.bytes()?)),
        _ => return None,
    };
    Some(EntryState {
        kind,
        blob,
        size,
        mode,
        uid,
        gid,
        mtime_ns,
        target,
    })
}

impl HistoryIndex {
    /// The index as bytes (see the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64 * self.times.len() + 1024));
        w.u(self.names.len() as u64);
        for (i, name) in self.names.iter().enumerate() {
            w.bytes(name.as_bytes());
            w.u(u64::from(self.parents[i]));
            let v = &self.versions[i];
            w.u(v.len() as u64);
            let mut prev = 0;
            for (seq, state) in v {
                w.u(seq - prev);
                prev = *seq;
                match state {
                    None => w.u(0),
                    Some(s) => {
                        w.u(1);
                        put_state(&mut w, s);
                    }
                }
            }
            w.ids(&self.touched[i]);
        }
        w.u(self.recorded.len() as u64);
        let mut prev = 0i64;
        for &t in &self.recorded {
            w.i(t.wrapping_sub(prev));
            prev = t;
        }
        w.u(self.forgotten.len() as u64);
        for &(a, b) in &self.forgotten {
            w.u(a);
            w.u(b);
        }
        w.ids(&self.removals);
        w.ids(&self.forgets);
        w.0
    }

    /// The index [`HistoryIndex::encode`] wrote, or `None` if the bytes
    /// are not one whole.
    pub fn decode(bytes: &[u8]) -> Option<HistoryIndex> {
        let mut r = R(bytes);
        let n = r.len()?;
        let mut h = HistoryIndex {
            paths: HashMap::with_capacity_and_hasher(n, PathHasher),
            names: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
            children: vec![Vec::new(); n],
            versions: Vec::with_capacity(n),
            touched: Vec::with_capacity(n),
            ..HistoryIndex::default()
        };
        for i in 0..n {
            let name = RelPath::parse(&r.bytes()?).or_else(|| (i == 0).then(RelPath::root))?;
            let parent = PathIdx::try_from(r.u()?).ok()?;
            if (i == 0) != name.is_root() || (i > 0 && parent as usize >= i) {
                return None;
            }
            if i > 0 {
                // A child's name is its parent's joined with one more name.
                if name.parent().as_ref() != Some(&h.names[parent as usize]) {
                    return None;
                }
                h.children[parent as usize].push(i as PathIdx);
            }
            if h.paths.insert(name.clone(), i as PathIdx).is_some() {
                return None;
            }
            h.names.push(name);
            h.parents.push(parent);
            let nv = r.len()?;
            let mut v = Vec::with_capacity(nv);
            let mut seq = 0u64;
            for _ in 0..nv {
                // From 1, never decreasing (one change may remove a path
                // and add it again: a rename over it).
                seq = seq.checked_add(r.u()?).filter(|&s| s > 0)?;
                let state = match r.u()? {
                    0 => None,
                    1 => Some(get_state(&mut r)?),
                    _ => return None,
                };
                v.push((seq, state));
            }
            h.versions.push(v);
            h.touched.push(r.ids()?);
        }
        let nt = r.len()?;
        h.recorded.reserve_exact(nt);
        let mut t = 0i64;
        for _ in 0..nt {
            t = t.wrapping_add(r.i()?);
            h.recorded.push(t);
        }
        // Placed by this reader's clock, as a fold of the journal would.
        h.settle_all(skillfs_base::time::now_ns());
        let nf = r.len()?;
        for _ in 0..nf {
            h.forgotten.push((r.u()?, r.u()?));
        }
        h.removals = r.ids()?;
        h.forgets = r.ids()?;
        h.valid().then_some(h).filter(|_| r.0.is_empty())
    }

    /// What a fold guarantees of the ids a decoded index holds: each list
    /// ascending and within `1..=last`, forgotten ranges disjoint and in
    /// order (a crafted checkpoint is refused, never believed).
    fn valid(&self) -> bool {
        let last = self.last();
        let ascending =
            |v: &[u64]| v.windows(2).all(|w| w[0] < w[1]) && v.iter().all(|&x| x >= 1 && x <= last);
        let mut prev_end = 0u64;
        let ranges = self.forgotten.iter().all(|&(a, b)| {
            let ok = a >= 1 && a <= b && b <= last && (prev_end == 0 || a > prev_end + 1);
            prev_end = b;
            ok
        });
        ranges
            && ascending(&self.removals)
            && ascending(&self.forgets)
            && self.touched.iter().all(|t| ascending(t))
            && self
                .versions
                .iter()
                .all(|v| v.last().is_none_or(|(s, _)| *s <= last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Fold;
    use skillfs_store::journal::{Op, Record};

    #[test]
    fn decode_gives_back_what_encode_took() {
        let st = |kind, blob: &str| Some(EntryState::sample(kind, &blob.repeat(64)));
        let mut link = EntryState::sample(Kind::Symlink, "");
        link.target = Some(ByteString(b"../x".to_vec()));
        link.mtime_ns = -5;
        let mut recs = vec![
            Record::sample(1, 10, Op::Mkdir, "a", None, st(Kind::Dir, "")),
            Record::sample(2, 5, Op::Create, "a/x", None, st(Kind::File, "1")),
            Record::sample(3, 30, Op::Symlink, "a/l", None, Some(link)),
            Record::sample(4, 40, Op::Rename, "a", Some("b"), None),
            Record::sample(5, 50, Op::Unlink, "b/x", None, None),
            Record::sample(6, 55, Op::Create, "b/y", None, st(Kind::File, "2")),
            Record::sample(7, 56, Op::Create, "b/z", None, st(Kind::File, "3")),
            // Over an existing path: two versions of b/z at one id.
            Record::sample(8, 57, Op::Rename, "b/y", Some("b/z"), None),
        ];
        let mut forget = Record::sample(9, 60, Op::Forget, "", None, None);
        forget.forgot = vec![[2, 3]];
        recs.push(forget);
        let h = Fold::replay(&recs).into_history();
        let bytes = h.encode();
        let d = HistoryIndex::decode(&bytes).expect("decodes");
        assert_eq!(d.names, h.names);
        assert_eq!(d.parents, h.parents);
        assert_eq!(d.children, h.children);
        assert_eq!(d.versions, h.versions);
        assert_eq!(d.touched, h.touched);
        assert_eq!(d.times, h.times);
        assert_eq!(d.recorded, h.recorded);
        assert_eq!(d.forgotten, h.forgotten);
        assert_eq!(d.removals, h.removals);
        assert_eq!(d.forgets, h.forgets);
        assert_eq!(d.paths.len(), h.paths.len());
        // Any cut is refused whole.
        for n in 0..bytes.len() {
            assert!(HistoryIndex::decode(&bytes[..n]).is_none(), "cut at {n}");
        }
    }
}
