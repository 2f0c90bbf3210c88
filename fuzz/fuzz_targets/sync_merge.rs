#![no_main]
// The body is skillfs_sync::fuzz_targets::merge (replayed by
// crates/sync/tests/fuzz_replay.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    skillfs_sync::fuzz_targets::merge(data);
});
