//! Inflation bombs: real `gcc -g` programs whose compressed `.debug_info` (zlib, zstd) claims
//! 3 GiB, re-pointed at a real stream of that many zeros. Opening, checking and storing them
//! is refused before anything is inflated, counted by the allocator; honest compressed files
//! still open, name what their uncompressed twins name, and weigh what they inflate to.

use kiln_storage::{Storage, StorageConfig};
use kiln_symbolize::budget::BudgetSlot;
use kiln_symbolize::store::{DebugStore, UploadError, UploadLimits, inspect};
use kiln_symbolize::testing::{self, Compression, Program};
use kiln_symbolize::{DebugFile, Error, Inflation, OpenLimits};
use peak_alloc::PeakAlloc;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const LIMITS: OpenLimits = OpenLimits {
    max_inflated_bytes: 512 << 20,
};

/// What the calls under test may take of the heap beyond what was live before them.
const HEAP_BOUND: usize = 32 << 20;

/// Runs `f`; the heap it took at its peak above what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let out = f();
    (out, HEAP.peak_usage().saturating_sub(before))
}

const DECLARED: u64 = 3 << 30;

#[test]
fn compressed_debug_info_that_claims_3_gib_is_refused_before_it_inflates() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    for how in [Compression::Zlib, Compression::Zstd] {
        let compressed = testing::compress(&built.full, how).unwrap();
        let bomb = testing::inflation_bomb(&compressed, how, DECLARED).unwrap();
        let path = dir.path().join(format!("bomb-{how:?}"));
        std::fs::write(&path, &bomb).unwrap();
        eprintln!(
            "{how:?}: a bomb of {} bytes declares {DECLARED}",
            bomb.len()
        );
        // The stream is real (a_small_bomb_really_inflates_and_is_held_to_the_ratio).
        let inflation = Inflation::of_file(&path).unwrap();
        assert_eq!(inflation.largest.as_ref().unwrap().0, ".debug_info");
        assert!(inflation.bytes >= DECLARED, "{inflation:?}");

        let (opened, peak) = peak_of(|| DebugFile::open(&path, LIMITS));
        let err = opened.unwrap_err();
        assert!(matches!(err, Error::Inflates { .. }), "{how:?}: {err}");
        let message = err.to_string();
        assert!(message.contains(".debug_info"), "{message}");
        assert!(
            message.contains("max_debuginfo_inflated_bytes"),
            "{message}"
        );
        assert!(peak < HEAP_BOUND, "{how:?}: opening took {peak} bytes");

        let (checked, peak) = peak_of(|| inspect(&path, LIMITS));
        assert!(
            matches!(checked, Err(UploadError::Inflates(_))),
            "{how:?}: {checked:?}"
        );
        assert!(
            peak < HEAP_BOUND,
            "{how:?}: the upload check took {peak} bytes"
        );

        let (_, peak) = peak_of(|| kiln_symbolize::fuzz::elf(&bomb));
        assert!(
            peak < HEAP_BOUND + 2 * bomb.len(),
            "{how:?}: the fuzz entry took {peak} bytes"
        );
    }
}

#[test]
fn a_small_bomb_really_inflates_and_is_held_to_the_ratio() {
    // The same construction at 64 MiB: within the bound but past the ratio for a small file;
    // `object` inflates it whole, so the streams the bombs carry are real ones.
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    for how in [Compression::Zlib, Compression::Zstd] {
        let compressed = testing::compress(&built.full, how).unwrap();
        let bomb = testing::inflation_bomb(&compressed, how, 64 << 20).unwrap();
        let path = dir.path().join(format!("small-{how:?}"));
        std::fs::write(&path, &bomb).unwrap();
        let limit = LIMITS.limit_for(bomb.len() as u64);
        assert!(
            limit < 64 << 20,
            "{how:?}: {} bytes may inflate to {limit}",
            bomb.len()
        );
        let err = DebugFile::open(&path, LIMITS).unwrap_err();
        assert!(matches!(err, Error::Inflates { .. }), "{how:?}: {err}");
        let bytes = object_inflates(&path);
        assert!(
            bytes >= 64 << 20,
            "{how:?}: the stream inflated to {bytes} bytes"
        );
    }
}

/// Bytes `.debug_info` of the file at `path` inflates to, read with `object` itself.
fn object_inflates(path: &std::path::Path) -> usize {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let section = file.section_by_name(".debug_info").unwrap();
    section.uncompressed_data().map(|d| d.len()).unwrap_or(0)
}

#[test]
fn honest_compressed_files_name_frames_and_weigh_what_they_inflate_to() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let plain = DebugFile::open(&built.full, LIMITS).unwrap();
    let addrs = testing::addresses_in(&built.full, &built.functions, 4);
    assert!(!addrs.is_empty());
    for how in [Compression::Zlib, Compression::Zstd] {
        let compressed = testing::compress(&built.full, how).unwrap();
        let inflation = Inflation::of_file(&compressed).unwrap();
        assert!(inflation.bytes > 0, "{how:?}: objcopy compressed nothing");
        let file = DebugFile::open(&compressed, LIMITS).unwrap();
        for &a in &addrs {
            assert_eq!(file.resolve(a), plain.resolve(a), "{how:?} at {a:#x}");
        }
        // The open-file cache weighs a file by what it holds, not by its compressed size.
        assert!(
            file.heap_bytes() as u64 >= inflation.bytes,
            "{how:?}: weighs {} for {} inflated",
            file.heap_bytes(),
            inflation.bytes
        );
    }
}

#[tokio::test]
async fn a_bomb_upload_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("data")))
        .await
        .unwrap();
    let store = DebugStore::new(storage.store().clone(), BudgetSlot::default());
    let limits = UploadLimits {
        max_file_bytes: 64 << 20,
        max_tenant_bytes: 1 << 30,
        max_inflated_bytes: 512 << 20,
    };
    for how in [Compression::Zlib, Compression::Zstd] {
        let compressed = testing::compress(&built.full, how).unwrap();
        let path = dir.path().join(format!("upload-{how:?}"));
        std::fs::write(
            &path,
            testing::inflation_bomb(&compressed, how, DECLARED).unwrap(),
        )
        .unwrap();
        let err = store
            .add("team-a", "bomb", &path, &[], limits)
            .await
            .unwrap_err();
        assert!(matches!(err, UploadError::Inflates(_)), "{how:?}: {err}");
        // The honest file is stored; a tenant bound lower than what it inflates to refuses it.
        let inflation = Inflation::of_file(&compressed).unwrap();
        let tight = UploadLimits {
            max_inflated_bytes: inflation.bytes - 1,
            ..limits
        };
        let err = store
            .add("team-a", "tight", &compressed, &[], tight)
            .await
            .unwrap_err();
        assert!(matches!(err, UploadError::Inflates(_)), "{how:?}: {err}");
        store
            .add("team-a", "honest", &compressed, &[], limits)
            .await
            .unwrap();
    }
    let names: Vec<String> = store
        .list("team-a")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n == "honest"), "{names:?}");
    assert!(store.list("team-b").await.unwrap().is_empty());
}
