#![no_main]
// The body is skillfs::fuzz_targets::journal_line (replayed by tests/it/fuzz_replay.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    skillfs::fuzz_targets::journal_line(data);
});
