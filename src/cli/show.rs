//! `show`, `diff` and `restore`: which version an ID names (this store's
//! id or alias, or another replica's `REPLICA:ID`) and the path in it.

use std::path::Path;

use super::Where;
use super::{locate, missing};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;

/// `skillfs show ID:PATH` or `show ID PATH`.
pub fn show(spec: &str, path: Option<&Path>, at: &Where) -> Result<(), Failure> {
    let (id, path) = match path {
        Some(p) => (spec, p),
        None => split_show(spec)?,
    };
    let t = locate::locate(at, Some(path))?;
    let (id, path) = match replica_version(id, &t.layout) {
        Some(v) => return crate::sync::show_version(&t.layout, v, &t.rel(path)?),
        // An all-digit REPLICA no replica has: this store's id.
        None if crate::sync::parse_version(id).is_some() && spec != id => {
            let (id, p) = crate::commands::split_spec(spec)?;
            (id, std::path::Path::new(p))
        }
        None => (id, path),
    };
    let t = locate::locate(at, Some(path))?;
    let rel = t.rel(path)?;
    let st = crate::commands::Store::open(t.layout.clone())?;
    missing::present(&t, &st, path, &rel, st.resolve(id)?)?;
    crate::commands::show(&st, id, &rel)
}

/// `skillfs diff ID [ID] [PATH]`.
pub fn diff(id: &str, rest: &[String], at: &Where) -> Result<(), Failure> {
    let looks_like_id = |t: &str| {
        crate::history::parse_alias(t, crate::time::now_ns()).is_some()
            || crate::sync::parse_version(t).is_some()
    };
    let (b, path) = match rest {
        [] => (None, None),
        [x] if looks_like_id(x) => (Some(x.as_str()), None),
        [x] => (None, Some(x.as_str())),
        [x, y] => (Some(x.as_str()), Some(y.as_str())),
        _ => return Err(Failure::new(Exit::Usage, "diff takes ID [ID] [PATH]")),
    };
    let path = path.map(std::path::Path::new);
    let t = locate::locate(at, path)?;
    let replica = |i: &str| replica_version(i, &t.layout).is_some();
    if replica(id) || b.is_some_and(replica) {
        return diff_replicas(&t, id, b, path);
    }
    let rel = match path {
        None => RelPath::root(),
        Some(p) => t.rel(p)?,
    };
    let st = crate::commands::Store::open(t.layout.clone())?;
    if let Some(p) = path
        && st.index.idx(&rel).is_none()
    {
        // Never in history: said with the path as resolved. (One
        // with versions elsewhere is said by `diff` itself.)
        missing::present(&t, &st, p, &rel, st.resolve(id)?)?;
    }
    crate::commands::diff(&st, id, b, &rel)
}

/// `diff` where a side is another replica's version: modes compared as
/// git keeps them (a file executable or not), each side read where it is
/// (this store's blobs, or the sync repository's git).
fn diff_replicas(
    t: &locate::Target,
    a: &str,
    b: Option<&str>,
    path: Option<&Path>,
) -> Result<(), Failure> {
    let rel = match path {
        None => RelPath::root(),
        Some(p) => t.rel(p)?,
    };
    let st = crate::commands::Store::open(t.layout.clone())?;
    let mut theirs = Vec::new();
    let mut side = |spec: &str| -> Result<crate::commands::DiffSide, Failure> {
        Ok(match replica_version(spec, &t.layout) {
            Some(v) => {
                let their = crate::sync::their_version(&t.layout, v)?;
                let side = their.side(&rel);
                theirs.push(their);
                side
            }
            None => crate::commands::local_side(&st, st.resolve(spec)?, &rel, true),
        })
    };
    let old = side(a)?;
    let new = match b {
        Some(b) => side(b)?,
        None => crate::commands::local_side(&st, st.index.last(), &rel, true),
    };
    crate::commands::print_diff(&old, &new, &rel, &|blob| {
        let here = st.content_of(blob);
        if here.is_ok() || !theirs.iter().any(|t| t.has(blob)) {
            // This store's, or nobody's: a missing or damaged blob of this
            // store is said as a local diff says it.
            return here.map(Some);
        }
        // `None`: git has it, too large to hold whole.
        Ok(theirs.iter().find_map(|t| t.read(blob)))
    })
}

/// `id` as another replica's version (`REPLICA:ID`), unless its REPLICA
/// is all digits and names no replica the store keeps: then it may be
/// this store's own id (`show`'s `ID:PATH` with a PATH starting with
/// digits and a colon).
fn replica_version<'a>(id: &'a str, layout: &crate::store::Layout) -> Option<(&'a str, u64)> {
    crate::sync::parse_version(id).filter(|(r, _)| {
        !r.bytes().all(|b| b.is_ascii_digit()) || crate::sync::keeps_replica(layout, r)
    })
}

/// `show`'s one argument as ID and PATH: `ID:PATH`, or an ID alone,
/// which is refused with the two forms that work.
fn split_show(spec: &str) -> Result<(&str, &std::path::Path), Failure> {
    // Another replica's version first: its `REPLICA:ID` holds a colon.
    if let Some((_, path)) = crate::sync::parse_version_path(spec) {
        return Ok((
            &spec[..spec.len() - path.len() - 1],
            std::path::Path::new(path),
        ));
    }
    if crate::sync::parse_version(spec).is_some() {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "'{spec}' is a replica's version with no PATH: give `skillfs show {spec}:PATH` \
                 or `skillfs show {spec} PATH`"
            ),
        ));
    }
    if crate::history::parse_alias(spec, crate::time::now_ns()).is_some() {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "'{spec}' is an id with no PATH: give `skillfs show {spec}:PATH` or \
                 `skillfs show {spec} PATH` (`{spec}:` shows the top of the tree)"
            ),
        ));
    }
    let (id, path) = crate::commands::split_spec(spec)?;
    Ok((id, std::path::Path::new(path)))
}

pub fn restore(id: &str, path: &std::path::Path, at: &Where) -> Result<(), Failure> {
    let t = locate::locate(at, Some(path))?;
    t.live_mount()?;
    let rel = t.rel(path)?;
    if let Some(v) = replica_version(id, &t.layout) {
        let said = crate::sync::restore_version(&t.layout, &t.root, v, &rel)?;
        println!("{}", crate::error::one_line(said));
        return Ok(());
    }
    let store = crate::commands::Store::open(t.layout.clone())?;
    let id = store.resolve(id)?;
    missing::present(&t, &store, path, &rel, id)?;
    let done = crate::commands::restore(&store, &t.root, id, &rel)?;
    let when = store
        .index
        .time_of(id)
        .map(crate::time::format_utc)
        .unwrap_or_default();
    let parents = match done.parents.as_slice() {
        [] => String::new(),
        [one] => format!("; made its missing parent {one}"),
        many => format!(
            "; made its missing parents {}",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    println!(
        "restored {rel} as of change {id} ({when}): files {}, directories {}, symlinks {}{parents}{}",
        done.files,
        done.dirs,
        done.symlinks,
        if done.replaced {
            "; what it replaced stays in history"
        } else {
            ""
        }
    );
    Ok(())
}
