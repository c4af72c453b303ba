//! The fuzz entry of the ELF reader: identification, then every lookup path (DWARF, Go's line
//! table, symbol tables, address mapping) over arbitrary bytes. It must return without a panic
//! and within a bounded heap; the `cargo fuzz` target `elf` and the mutation test
//! `tests/mutated.rs` run it.

use crate::{DebugFile, MappingRange, OpenLimits, identify};

/// What the entry lets a file inflate: [`crate::debug_file::MAX_INFLATION_RATIO`] times its
/// size, at most 64 MiB. The mutation test holds the entry's heap to that and the input.
pub const LIMITS: OpenLimits = OpenLimits {
    max_inflated_bytes: 64 << 20,
};

/// Runs the reader over `data` (written to a temporary file, as uploads are, to be mapped).
pub fn elf(data: &[u8]) {
    let Ok(info) = identify(data) else {
        return;
    };
    let _ = info.ids();
    let path = std::env::temp_dir().join(format!(
        "kiln-fuzz-elf-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(file) = DebugFile::open(&path, LIMITS) {
        let mapping = MappingRange {
            start: 0x40_0000,
            limit: 0x80_0000,
            offset: 0x1000,
        };
        for address in [0, 0x1000, 0x1139, 0x40_1000, 0x48_0fc0, u64::MAX] {
            let _ = file.resolve(address);
            let _ = file.resolve(file.file_address(mapping, address));
        }
    }
    let _ = std::fs::remove_file(&path);
}
