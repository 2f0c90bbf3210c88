//! The fuzz targets' kept inputs under plain `cargo test` (no libFuzzer,
//! stable Rust): every file in `fuzz/regressions/<target>/` (a crash once
//! found, and fixed) and in `fuzz/seeds/<target>/`, and every seed the
//! code makes now, fed to the same function the libFuzzer target calls
//! (`skillfs::fuzz_targets`). A crash fixed stays fixed in CI without a
//! fuzzer. `SKILLFS_WRITE_SEEDS=1` writes the seeds into `fuzz/seeds/`.
//! The sync merge's target is `skillfs_sync::fuzz_targets::merge`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use skillfs::fuzz_targets::{TARGETS, Target, seeds};

/// The sync merge (a crate of its own, below no other) as a target.
fn sync_merge(data: &[u8]) -> bool {
    skillfs_sync::fuzz_targets::merge(data);
    true
}

/// Every target: the application's, and the sync merge.
fn targets() -> Vec<(&'static str, Target)> {
    let mut v = TARGETS.to_vec();
    v.push(("sync_merge", sync_merge));
    v
}

/// Every seed the code makes now: its target, name and bytes.
fn all_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut v = seeds();
    v.extend(
        skillfs_sync::fuzz_targets::seeds()
            .into_iter()
            .map(|(n, b)| ("sync_merge", n, b)),
    );
    v
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted.
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Removes the directory the targets made on this thread
/// (`$TMPDIR/skillfs-fuzz-<pid>-<thread>`; the other tests' are theirs).
fn clean_scratch() {
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let mine = format!("skillfs-fuzz-{}-{thread}", std::process::id());
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(mine));
}

/// Runs `f` on `data`: whether it was taken whole, or its panic as a
/// line naming `what`.
fn run(f: Target, what: &str, data: &[u8]) -> Result<bool, String> {
    catch_unwind(AssertUnwindSafe(|| f(data))).map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what}: {msg}")
    })
}

#[test]
fn every_kept_crash_input_and_seed_runs_clean() {
    let mut failed = Vec::new();
    let mut ran = 0;
    for (target, f) in targets() {
        for kind in ["regressions", "seeds"] {
            for path in inputs(kind, target) {
                let data = std::fs::read(&path).unwrap();
                ran += 1;
                failed.extend(run(f, &path.display().to_string(), &data).err());
            }
        }
    }
    clean_scratch();
    assert!(
        failed.is_empty(),
        "{} of {ran} inputs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(ran > 0, "no input under fuzz/seeds or fuzz/regressions");
}

#[test]
fn the_seeds_made_now_run_clean_and_are_the_ones_kept() {
    let write = std::env::var_os("SKILLFS_WRITE_SEEDS").is_some();
    let mut failed = Vec::new();
    let targets = targets();
    for (target, name, data) in all_seeds() {
        let f = targets
            .iter()
            .find(|(t, _)| *t == target)
            .expect("a target")
            .1;
        let what = format!("seed {target}/{name}");
        match run(f, &what, &data) {
            Ok(true) => {}
            Ok(false) => failed.push(format!("{what}: not taken whole (a seed must be)")),
            Err(e) => failed.push(e),
        }
        let kept = fuzz_dir().join("seeds").join(target).join(&name);
        if write {
            std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
            std::fs::write(&kept, &data).unwrap();
        } else {
            assert!(
                kept.is_file(),
                "{} is missing: SKILLFS_WRITE_SEEDS=1 writes it",
                kept.display()
            );
        }
    }
    clean_scratch();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn every_target_has_a_libfuzzer_binary() {
    for (target, _) in targets() {
        let bin = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        assert!(bin.is_file(), "{} is missing", bin.display());
    }
}
