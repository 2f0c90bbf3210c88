//! Who keeps a mount busy: the processes whose working directory, root,
//! executable, open files or mapped files are inside it, and the mounts
//! stacked inside it (what `fuser -vm` and `umount(8)`'s "target is busy"
//! mean).
//!
//! Invariants: only `/proc` is read, by `readlink` of its magic links and
//! the text of `maps`: nothing inside the mount is touched (a hung or dead
//! daemon would hang a `stat` there). The list is for the message: the
//! kernel's EBUSY is what decides whether an unmount happens, so a process
//! that enters or leaves between the two changes only what is named.
//!
//! Locks: none.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One process that holds the mount, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// How it holds the mount: "cwd", "root", "exe", "open file",
    /// "mapped file", each once.
    pub uses: Vec<&'static str>,
}

/// What keeps the mount at `mount_point` busy, as far as this process can
/// see: processes (other than this one) and mounts inside it.
#[derive(Debug, Default)]
pub struct Busy {
    pub holders: Vec<Holder>,
    pub submounts: Vec<PathBuf>,
    /// Other mounts of the same filesystem that an unmount here would
    /// leave standing (a bind mount, a private copy in another mount
    /// namespace): through them the daemon would go on serving while
    /// writes by path here bypass it.
    pub elsewhere: Vec<String>,
}

/// Whether `link` (a path as `/proc` shows it, with a " (deleted)" suffix
/// for a removed file) lies in `mount_point` or below it.
fn inside(link: &Path, mount_point: &Path) -> bool {
    link.starts_with(mount_point)
}

/// The holders of the mount at `mount_point` (absolute, canonical) and
/// the mounts below it. `daemon`, the mount's own daemon, is never one:
/// its descriptors are of the directory underneath, whose paths read the
/// same as the mount's.
pub fn busy(mount_point: &Path, daemon: Option<u32>) -> Busy {
    let me = std::process::id();
    let mut holders = Vec::new();
    for pid in pids()
        .into_iter()
        .filter(|p| *p != me && Some(*p) != daemon)
    {
        let base = PathBuf::from(format!("/proc/{pid}"));
        let mut uses: Vec<&'static str> = Vec::new();
        for (link, what) in [("cwd", "cwd"), ("root", "root"), ("exe", "exe")] {
            if fs::read_link(base.join(link)).is_ok_and(|t| inside(&t, mount_point)) {
                uses.push(what);
            }
        }
        if let Ok(fds) = fs::read_dir(base.join("fd"))
            && fds
                .flatten()
                .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| inside(&t, mount_point)))
        {
            uses.push("open file");
        }
        if let Ok(maps) = fs::read(base.join("maps"))
            && maps_inside(&maps, mount_point)
        {
            uses.push("mapped file");
        }
        if uses.is_empty() {
            continue;
        }
        let comm = fs::read_to_string(base.join("comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_else(|_| "?".to_string());
        holders.push(Holder { pid, comm, uses });
    }
    let submounts = super::mountinfo::mounts()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p != mount_point && p.starts_with(mount_point))
        .collect();
    Busy {
        holders,
        submounts,
        elsewhere: elsewhere(mount_point),
    }
}

/// One line of a mountinfo text: its device (`maj:min`, one per FUSE
/// connection), mount point (escaped as the kernel writes it) and
/// propagation tags (`shared:N`, `master:N`).
struct MountLine<'a> {
    dev: &'a str,
    point: &'a str,
    tags: Vec<&'a str>,
}

fn mount_lines(text: &str) -> Vec<MountLine<'_>> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            (sep >= 6).then(|| MountLine {
                dev: f[2],
                point: f[4],
                tags: f[6..sep].to_vec(),
            })
        })
        .collect()
}

/// The other mounts of the filesystem mounted at `mount_point` that an
/// unmount of `mount_point` leaves standing: bind mounts in this mount
/// namespace, and copies in other namespaces that share no propagation
/// group with it (a peer or a slave of ours is unmounted with it, and the
/// kernel counts its users in the EBUSY).
pub fn elsewhere(mount_point: &Path) -> Vec<String> {
    let Ok(mine) = fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mine = String::from_utf8_lossy(&mine);
    let escaped = escape_mountinfo(mount_point);
    let lines = mount_lines(&mine);
    let Some(ours) = lines.iter().rev().find(|m| m.point == escaped) else {
        return Vec::new();
    };
    let dev = ours.dev.to_string();
    let group = ours
        .tags
        .iter()
        .find_map(|t| t.strip_prefix("shared:"))
        .map(str::to_string);
    let linked = |m: &MountLine| {
        group.as_deref().is_some_and(|g| {
            m.tags.iter().any(|t| {
                t.strip_prefix("shared:") == Some(g) || t.strip_prefix("master:") == Some(g)
            })
        })
    };
    let mut out: Vec<String> = lines
        .iter()
        .filter(|m| m.dev == dev && m.point != escaped)
        .map(|m| format!("the bind mount at {}", m.point))
        .collect();
    let my_ns = fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::BTreeSet::new();
    for pid in pids() {
        let Ok(ns) = fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if Some(&ns) == my_ns.as_ref() || !seen.insert(ns) {
            continue;
        }
        let Ok(text) = fs::read(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&text);
        if mount_lines(&text)
            .iter()
            .any(|m| m.dev == dev && !linked(m))
        {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push(format!(
                "a copy in the mount namespace of pid {pid} ({})",
                comm.trim_end()
            ));
        }
    }
    out
}

/// `p` as mountinfo writes it: space, tab, newline and backslash as
/// octal escapes, other bytes raw (compared after the same lossy UTF-8
/// reading as the file's).
fn escape_mountinfo(p: &Path) -> String {
    let mut v = Vec::new();
    for b in p.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => v.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => v.push(*b),
        }
    }
    String::from_utf8_lossy(&v).into_owned()
}

/// The pids `/proc` lists, in order.
fn pids() -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// Whether a `/proc/PID/maps` text maps a file inside `mount_point` (the
/// path is the sixth field, and may hold spaces).
fn maps_inside(maps: &[u8], mount_point: &Path) -> bool {
    maps.split(|b| *b == b'\n').any(|line| {
        let Some(at) = line.iter().position(|b| *b == b'/') else {
            return false;
        };
        // Only a line whose sixth field starts here: five fields before.
        let fields_before = line[..at]
            .split(|b| *b == b' ')
            .filter(|f| !f.is_empty())
            .count();
        fields_before == 5
            && inside(
                Path::new(std::ffi::OsStr::from_bytes(&line[at..])),
                mount_point,
            )
    })
}

impl Busy {
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.submounts.is_empty() && self.elsewhere.is_empty()
    }

    /// "pid 4242 (bash: cwd), pid 17 (python3: open file, mapped file),
    /// the mount at /x/y": at most `most` processes, then how many more.
    pub fn describe(&self, most: usize) -> String {
        let mut parts: Vec<String> = self
            .holders
            .iter()
            .take(most)
            .map(|h| format!("pid {} ({}: {})", h.pid, h.comm, h.uses.join(", ")))
            .collect();
        if self.holders.len() > most {
            parts.push(format!("{} more processes", self.holders.len() - most));
        }
        parts.extend(
            self.submounts
                .iter()
                .map(|m| format!("the mount at {}", m.display())),
        );
        parts.extend(self.elsewhere.iter().cloned());
        if parts.is_empty() {
            // The kernel said busy, but nothing this process may see holds
            // it (another user's process, another mount namespace).
            return "processes this user cannot see (try `fuser -vm` as root)".to_string();
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_path_is_the_sixth_field_even_with_spaces() {
        let mp = Path::new("/home/u/.hermes");
        let maps = b"7f00-7f01 r--p 00000000 00:2f 1234      /home/u/.hermes/skills/a b.md\n\
                     7f02-7f03 r-xp 00000000 08:01 99  /usr/lib/libc.so.6\n";
        assert!(maps_inside(maps, mp));
        assert!(!maps_inside(
            b"7f02-7f03 r-xp 00000000 08:01 99  /usr/lib/libc.so.6\n",
            mp
        ));
        // A path that only shares a prefix of the name is not inside.
        assert!(!maps_inside(
            b"7f00-7f01 r--p 00000000 00:2f 1 /home/u/.hermes2/x\n",
            mp
        ));
    }

    #[test]
    fn this_process_finds_another_whose_cwd_is_inside() {
        let d = std::env::temp_dir().join(format!("skillfs-holders-{}", std::process::id()));
        fs::create_dir_all(&d).expect("scratch dir");
        let d = d.canonicalize().expect("canonical");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(&d)
            .spawn()
            .expect("sleep runs");
        let b = busy(&d, None);
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_dir_all(&d);
        let h = b
            .holders
            .iter()
            .find(|h| h.pid == child.id())
            .expect("the child is named");
        assert_eq!(h.comm, "sleep");
        assert!(h.uses.contains(&"cwd"), "{h:?}");
        assert!(
            b.describe(5)
                .contains(&format!("pid {} (sleep: cwd", child.id()))
        );
    }
}
