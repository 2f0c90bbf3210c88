//! `RelPath`: a path relative to the skills root, as raw bytes.
//!
//! Invariants: no leading or trailing `/`, no empty, `.` or `..` component;
//! the empty path is the root itself. One exception, made only by
//! `from_bytes_unchecked`: in a mount over a home, a name outside the
//! versioned root is `..` or `../<path>` from it, and a park's or unpark's
//! hidden name in the journal may be one (read by [`hidden_deserialize`]). Names that are not UTF-8 round-trip
//! losslessly: in JSON a path is a string when it is valid UTF-8 and
//! `{"hex": "..."}` otherwise.
//!
//! Locks: none; these are values.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    pub fn root() -> RelPath {
        RelPath(Vec::new())
    }

    /// Parses a user-given relative path (`a/b`, `./a/b/`, `/a/b`).
    /// `None` when a component is `..`.
    pub fn parse(s: &[u8]) -> Option<RelPath> {
        let mut out = RelPath::root();
        for comp in s.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => return None,
                c => out = out.join(c),
            }
        }
        Some(out)
    }

    /// `b` as a path if it already is one as written: no leading or
    /// trailing `/`, no empty, `.` or `..` component, no NUL byte.
    pub fn canonical(b: Vec<u8>) -> Option<RelPath> {
        let sound = b.is_empty()
            || b.split(|&c| c == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0));
        sound.then_some(RelPath(b))
    }

    pub fn from_bytes_unchecked(b: Vec<u8>) -> RelPath {
        RelPath(b)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn join(&self, name: &[u8]) -> RelPath {
        let mut v = Vec::with_capacity(self.0.len() + 1 + name.len());
        v.extend_from_slice(&self.0);
        if !v.is_empty() {
            v.push(b'/');
        }
        v.extend_from_slice(name);
        RelPath(v)
    }

    pub fn parent(&self) -> Option<RelPath> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => RelPath(self.0[..i].to_vec()),
            None => RelPath::root(),
        })
    }

    pub fn file_name(&self) -> &[u8] {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/').filter(|c| !c.is_empty())
    }

    /// True when `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &RelPath) -> bool {
        if other.is_root() {
            return true;
        }
        self.0.starts_with(&other.0)
            && (self.0.len() == other.0.len() || self.0[other.0.len()] == b'/')
    }

    /// `self` with the prefix `from` replaced by `to` (`self` must start with `from`).
    pub fn rebase(&self, from: &RelPath, to: &RelPath) -> RelPath {
        let rest = &self.0[from.0.len()..];
        let rest = rest.strip_prefix(b"/").unwrap_or(rest);
        if rest.is_empty() {
            to.clone()
        } else {
            to.join(rest)
        }
    }

    /// The smallest key greater than every descendant of `self` in byte order
    /// (`a/b/` .. `a/b0`): descendants are exactly the range (self + "/", this).
    pub fn descendants_range(&self) -> (RelPath, RelPath) {
        if self.is_root() {
            return (RelPath(Vec::new()), RelPath(vec![0xff; 4097]));
        }
        let mut lo = self.0.clone();
        lo.push(b'/');
        let mut hi = self.0.clone();
        hi.push(b'/' + 1);
        (RelPath(lo), RelPath(hi))
    }

    pub fn to_os_string(&self) -> OsString {
        OsString::from_vec(self.0.clone())
    }

    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(&self.0)
    }
}

/// Shows the path as text, escaping bytes that are not UTF-8 as `\xNN`.
impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str(".");
        }
        // Shown, never interpreted: bytes that are not UTF-8, control
        // characters (a newline would forge a log line) and the backslash
        // that introduces them are escaped, so every name prints on one
        // line and no two names print alike.
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\\' => f.write_str("\\\\")?,
                    c if c.is_ascii_control() => write!(f, "\\x{:02x}", c as u32)?,
                    c if c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
                    c => write!(f, "{c}")?,
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        bytes_serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    /// Only a path as `Serialize` writes one (the invariants above, and no
    /// NUL byte): bytes read from a journal are not trusted to keep them.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let b = bytes_deserialize(d)?;
        RelPath::canonical(b).ok_or_else(|| {
            serde::de::Error::custom(
                "not a path relative to the root (an empty, `.` or `..` component, or a NUL byte)",
            )
        })
    }
}

/// A park's or unpark's hidden name as the journal holds it: a path as
/// [`RelPath`]'s `Deserialize` takes one, or, in a mount over a home, one
/// outside the versioned root: `..` alone or `../` and such a path.
/// Nothing else (`../..`, `a/..`, a `..` deeper in) is read as one.
pub fn hidden_deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RelPath>, D::Error> {
    let b = bytes_deserialize(d)?;
    let sound = match b.strip_prefix(b"..") {
        Some([]) => true,
        Some([b'/', rest @ ..]) => !rest.is_empty() && RelPath::canonical(rest.to_vec()).is_some(),
        _ => RelPath::canonical(b.clone()).is_some(),
    };
    if sound {
        Ok(Some(RelPath(b)))
    } else {
        Err(serde::de::Error::custom(
            "not a hidden name (a path from the root, or `../` and one from the home around it)",
        ))
    }
}

/// Serializes bytes as a JSON string when UTF-8, else as `{"hex": ".."}`.
pub fn bytes_serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(b) {
        Ok(text) => s.serialize_str(text),
        Err(_) => {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry("hex", &hex(b))?;
            m.end()
        }
    }
}

pub fn bytes_deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    // A visitor, not an untagged enum: an untagged enum buffers every
    // value before trying its forms, and paths are most of what a journal
    // read at mount parses.
    struct Bytes;
    impl<'de> serde::de::Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"a string, or {"hex": ".."}"#)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            Ok(v.as_bytes().to_vec())
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Vec<u8>, E> {
            Ok(v.into_bytes())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Vec<u8>, A::Error> {
            use serde::de::Error;
            let mut out = None;
            while let Some(key) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                if key != "hex" || out.is_some() {
                    return Err(A::Error::custom("bad hex path"));
                }
                let h: std::borrow::Cow<'de, str> = m.next_value()?;
                out = Some(unhex(&h).ok_or_else(|| A::Error::custom("bad hex path"))?);
            }
            out.ok_or_else(|| A::Error::custom("bad hex path"))
        }
    }
    d.deserialize_any(Bytes)
}

pub fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    /// A park's hidden name may lie in the home around the versioned
    /// root (`../aside`, as skillfs writes it), and nowhere further out.
    #[test]
    fn a_hidden_name_may_be_one_step_out_and_no_more() {
        #[derive(serde::Deserialize)]
        struct R {
            #[serde(default, deserialize_with = "hidden_deserialize")]
            hidden: Option<RelPath>,
        }
        let de = |j: &str| {
            serde_json::from_str::<R>(&format!(r#"{{"hidden":{j}}}"#))
                .ok()
                .map(|r| r.hidden.map(|p| p.0))
        };
        for good in [
            "..",
            "../aside",
            "../.skill-rollback-asides/x/s",
            ".git/x",
            "a",
            "..x/y",
        ] {
            assert_eq!(
                de(&format!("\"{good}\"")),
                Some(Some(good.as_bytes().to_vec())),
                "{good}"
            );
        }
        for bad in [
            "../..",
            "../../etc",
            "a/..",
            "../a/../b",
            "../",
            "..//a",
            "/a",
            "a/",
        ] {
            assert_eq!(de(&format!("\"{bad}\"")), None, "{bad}");
        }
        assert_eq!(serde_json::from_str::<R>("{}").unwrap().hidden, None);
    }

    /// A journal record's path is read only as a path (found by the
    /// `journal` fuzz target: fuzz/regressions/journal/rename-to-trailing-slash).
    #[test]
    fn only_a_canonical_path_deserializes() {
        let de = |j: &str| serde_json::from_str::<RelPath>(j).ok();
        assert_eq!(de(r#""a/b""#), RelPath::parse(b"a/b"));
        assert_eq!(de(r#""""#), Some(RelPath::root()));
        assert_eq!(
            de(r#"{"hex":"ff2f61"}"#).map(|p| p.0),
            Some(b"\xff/a".to_vec())
        );
        for bad in [
            r#""a/""#,
            r#""/a""#,
            r#""a//b""#,
            r#""./a""#,
            r#""a/.""#,
            r#""..""#,
            r#""a/../b""#,
            r#""a\u0000b""#,
            r#"{"hex":"2e2e2f61"}"#,
        ] {
            assert_eq!(de(bad), None, "{bad}");
        }
    }

    #[test]
    fn display_escapes_what_could_forge_or_confuse_a_line() {
        let p = RelPath::parse(b"cat/a\nb\\c\xff\x7f\xc2\x85d").unwrap();
        assert_eq!(p.to_string(), "cat/a\\x0ab\\\\c\\xff\\x7f\\u{85}d");
        assert_eq!(
            RelPath::parse(b"cat/SKILL.md").unwrap().to_string(),
            "cat/SKILL.md"
        );
    }

    use super::*;

    #[test]
    fn join_parent_name() {
        let p = RelPath::root().join(b"a").join(b"b");
        assert_eq!(p.as_bytes(), b"a/b");
        assert_eq!(p.parent().unwrap().as_bytes(), b"a");
        assert_eq!(p.file_name(), b"b");
        assert!(p.parent().unwrap().parent().unwrap().is_root());
    }

    #[test]
    fn starts_with_respects_components() {
        let ab = RelPath::parse(b"a/b").unwrap();
        assert!(RelPath::parse(b"a/b/c").unwrap().starts_with(&ab));
        assert!(ab.starts_with(&ab));
        assert!(!RelPath::parse(b"a/bc").unwrap().starts_with(&ab));
        assert_eq!(
            RelPath::parse(b"a/b/c")
                .unwrap()
                .rebase(&ab, &RelPath::parse(b"x").unwrap()),
            RelPath::parse(b"x/c").unwrap()
        );
    }

    #[test]
    fn non_utf8_round_trips_through_json() {
        let p = RelPath::parse(b"cat/\xff\xfename").unwrap();
        let j = serde_json::to_string(&p).unwrap();
        assert_eq!(j, r#"{"hex":"6361742ffffe6e616d65"}"#);
        let back: RelPath = serde_json::from_str(&j).unwrap();
        assert_eq!(back, p);
        let q = RelPath::parse("cat/naïve".as_bytes()).unwrap();
        let back: RelPath = serde_json::from_str(&serde_json::to_string(&q).unwrap()).unwrap();
        assert_eq!(back, q);
    }

    #[test]
    fn parse_rejects_dotdot() {
        assert!(RelPath::parse(b"a/../b").is_none());
        assert_eq!(RelPath::parse(b"/a//b/").unwrap().as_bytes(), b"a/b");
    }
}

/// Arbitrary bytes (a symlink target) with the same JSON form as [`RelPath`].
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ByteString(pub Vec<u8>);

impl fmt::Debug for ByteString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", RelPath(self.0.clone()))
    }
}

impl Serialize for ByteString {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        bytes_serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for ByteString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bytes_deserialize(d).map(ByteString)
    }
}
