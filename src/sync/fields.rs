//! What a `git log -z` of the store's sync repository prints, read as it
//! comes: NUL-ended fields, each cut to a size its reader names, so that
//! another replica's words (a commit's subject, its author's name) cost
//! this process at most that much whatever their length, and a history
//! of any size is never held whole as text.
//!
//! Invariants: memory is bounded by the caps of the fields asked and
//! the reader's buffer, never by the field's length; a field cut short
//! says so (`Field::whole` false), so that a number or an object id is
//! never read from the start of a longer one. A reader that stops early
//! ends the git (its pipe closed, then the process killed and reaped).

use std::io::{self, BufRead, BufReader, Read};
use std::process::{ChildStdout, Command, Stdio};

use super::git::said;
use crate::error::{Exit, Failure};

/// One field, at most the cap it was read with.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Field {
    pub bytes: Vec<u8>,
    /// Nothing of it was cut.
    pub whole: bool,
}

impl Field {
    /// The field as text, cut to `chars` characters (lossy: a character
    /// cut in two by the byte cap shows as a replacement).
    pub fn text(&self, chars: usize) -> String {
        String::from_utf8_lossy(&self.bytes)
            .chars()
            .take(chars)
            .collect()
    }
}

/// NUL-ended fields of `r`.
pub(super) struct Fields<R> {
    r: R,
}

impl<R: BufRead> Fields<R> {
    pub fn new(r: R) -> Self {
        Fields { r }
    }

    /// The next field, its first `cap` bytes kept and the rest read past;
    /// `None` at the end. The last field needs no NUL after it.
    pub fn next(&mut self, cap: usize) -> io::Result<Option<Field>> {
        let mut bytes = Vec::new();
        let mut whole = true;
        let mut any = false;
        loop {
            let buf = match self.r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                return Ok(any.then_some(Field { bytes, whole }));
            }
            any = true;
            let (part, end) = match buf.iter().position(|&b| b == 0) {
                Some(at) => (&buf[..at], Some(at + 1)),
                None => (buf, None),
            };
            let room = cap.saturating_sub(bytes.len());
            if part.len() > room {
                whole = false;
            }
            bytes.extend_from_slice(&part[..part.len().min(room)]);
            let used = end.unwrap_or(part.len());
            self.r.consume(used);
            if end.is_some() {
                return Ok(Some(Field { bytes, whole }));
            }
        }
    }
}

/// Runs `c` (a git of the store's repository) and hands its output to
/// `read` as fields; its error output is kept (64 KiB of it) to say why
/// it failed. A git that cannot start is exit 1; one that fails, exit 4,
/// said as "git could not `doing`". `read` may stop before the end: the
/// git is then ended.
pub(super) fn git_fields<T>(
    mut c: Command,
    doing: &str,
    read: impl FnOnce(&mut Fields<BufReader<ChildStdout>>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git to {doing}: {e}")))?;
    let stderr = child.stderr.take();
    // Drained beside, so that a git that says much never stalls.
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut e) = stderr {
            let _ = (&mut e).take(64 << 10).read_to_end(&mut v);
            let _ = io::copy(&mut e, &mut io::sink());
        }
        v
    });
    /// Ends and reaps the git if the reader panics (and is disarmed
    /// otherwise): no process is left behind either way.
    struct Reap(Option<std::process::Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let stdout = child.stdout.take().expect("piped");
    let mut reap = Reap(Some(child));
    let mut fields = Fields::new(BufReader::with_capacity(64 << 10, stdout));
    let got = read(&mut fields);
    let finished = got.is_ok() && matches!(fields.next(0), Ok(None));
    drop(fields);
    let mut child = reap.0.take().expect("set above");
    if !finished {
        // Stopped early (or failed): the rest is not wanted.
        let _ = child.kill();
    }
    let status = child.wait();
    let stderr = err.join().unwrap_or_default();
    let value = got?;
    let status = status
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git to {doing}: {e}")))?;
    if finished && !status.success() {
        let out = std::process::Output {
            status,
            stdout: Vec::new(),
            stderr,
        };
        return Err(Failure::new(
            Exit::BadStore,
            format!("git could not {doing}: {}", said(&out)),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], cap: usize, buf: usize) -> Vec<Field> {
        let mut f = Fields::new(BufReader::with_capacity(buf, input));
        std::iter::from_fn(|| f.next(cap).unwrap()).collect()
    }

    fn field(b: &str, whole: bool) -> Field {
        Field {
            bytes: b.as_bytes().to_vec(),
            whole,
        }
    }

    /// Fields are cut to their cap whatever the reader's buffer, a cut
    /// one says so, and the next field starts where it should.
    #[test]
    fn fields_are_cut_to_their_cap_and_stay_apart() {
        let input = b"abc\0defghij\0\0klmnopqrstuvwxyz\0tail";
        for buf in [1, 2, 3, 5, 64] {
            assert_eq!(
                all(input, 4, buf),
                vec![
                    field("abc", true),
                    field("defg", false),
                    field("", true),
                    field("klmn", false),
                    field("tail", true),
                ],
                "buffer {buf}"
            );
        }
        assert_eq!(all(b"", 4, 8), vec![]);
        assert_eq!(all(b"x\0", 4, 8), vec![field("x", true)]);
        // A field's bytes beyond the cap are never held: a 16 MiB one
        // read with a cap of 8 keeps 8.
        let big = [vec![b'x'; 16 << 20], b"\0y".to_vec()].concat();
        let got = all(&big, 8, 64 << 10);
        assert_eq!(got.len(), 2);
        assert!(
            got[0].bytes.capacity() < 1024,
            "{}",
            got[0].bytes.capacity()
        );
        assert_eq!(got[1], field("y", true));
    }

    /// A git stopped early is ended, and its failure is said with its
    /// own words when it ran to its end.
    #[test]
    fn a_git_stopped_early_is_ended_and_a_failed_one_said() {
        // A writer that ignores SIGPIPE: only the kill ends it.
        let mut c = Command::new("sh");
        c.args(["-c", "trap '' PIPE; while :; do printf 'x\\0'; done"]);
        let t = std::time::Instant::now();
        let first = git_fields(c, "read", |f| Ok(f.next(8).unwrap())).unwrap();
        assert_eq!(first, Some(field("x", true)));
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        let mut c = Command::new("sh");
        c.args(["-c", "printf 'a\\0b'; echo nope >&2; exit 3"]);
        let e = git_fields(c, "read the thing", |f| {
            while f.next(8).unwrap().is_some() {}
            Ok(())
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("git could not read the thing: nope"),
            "{e}"
        );
    }
}
