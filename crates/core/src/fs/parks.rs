//! What is known of the parks of directories (`parked/<key>/`, where a
//! visible directory's hidden entries are attached): whether the park of
//! a directory exists, where known.
//!
//! Invariants, kept by `Parks`'s methods: a park known to be missing means
//! no name is attached to that directory, so a name missing inside it is
//! not looked for in `parked/`. Parks are made while mounted only by
//! `ensure_park` (which records it: `made`) and by the settler, and
//! removed only with their directory (`removed`) or by the settler: a
//! settler run forgets everything known (`forget_all`). Unknown is always
//! safe (the park is looked for).
//! Locks: a leaf, held only inside the methods (never across a probe of
//! the disk).

use super::*;

#[derive(Default)]
pub(super) struct Parks {
    /// By directory key: whether its park exists.
    known: Mutex<HashMap<String, bool>>,
}

impl Parks {
    /// Whether the park of `key` is known not to exist.
    pub(super) fn known_missing(&self, key: &str) -> bool {
        self.known.lock().get(key) == Some(&false)
    }

    /// Whether the park of `key` is known to exist.
    pub(super) fn known_made(&self, key: &str) -> bool {
        self.known.lock().get(key) == Some(&true)
    }

    /// Learns whether the park of `key` exists from `probe`, unless that
    /// is known already.
    pub(super) fn learn(
        &self,
        key: &str,
        probe: impl FnOnce() -> std::io::Result<bool>,
    ) -> std::io::Result<()> {
        if !self.known.lock().contains_key(key) {
            let exists = probe()?;
            self.known.lock().insert(key.to_string(), exists);
        }
        Ok(())
    }

    /// The park of `key` exists (seen, or just made by `ensure_park`).
    pub(super) fn made(&self, key: &str) {
        self.known.lock().insert(key.to_string(), true);
    }

    /// The park of `key` was removed, or moved away with its directory:
    /// nothing is known of it.
    pub(super) fn removed(&self, key: &str) {
        self.known.lock().remove(key);
    }

    /// The settler ran: it may have made or removed any park.
    pub(super) fn forget_all(&self) {
        self.known.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_learnt_or_made() {
        let parks = Parks::default();
        assert!(!parks.known_missing("k") && !parks.known_made("k"));
        parks.learn("k", || Ok(false)).unwrap();
        assert!(parks.known_missing("k") && !parks.known_made("k"));
        parks.made("k");
        assert!(parks.known_made("k") && !parks.known_missing("k"));
        parks.removed("k");
        assert!(!parks.known_missing("k") && !parks.known_made("k"));
    }

    #[test]
    fn what_is_known_is_not_probed_again() {
        let parks = Parks::default();
        parks.learn("k", || Ok(true)).unwrap();
        parks.learn("k", || panic!("probed a known park")).unwrap();
        assert!(parks.known_made("k"));
    }

    #[test]
    fn a_failed_probe_learns_nothing() {
        let parks = Parks::default();
        let err = parks.learn("k", || Err(std::io::Error::from_raw_os_error(libc::EIO)));
        assert!(err.is_err());
        assert!(!parks.known_missing("k") && !parks.known_made("k"));
    }

    #[test]
    fn a_settler_run_forgets_everything() {
        let parks = Parks::default();
        parks.made("a");
        parks.learn("b", || Ok(false)).unwrap();
        parks.forget_all();
        for k in ["a", "b"] {
            assert!(!parks.known_missing(k) && !parks.known_made(k));
        }
    }
}
