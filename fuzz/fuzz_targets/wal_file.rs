#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_storage::fuzz::wal_file(data);
});
