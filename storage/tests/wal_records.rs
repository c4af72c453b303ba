//! Write-ahead log records (`kiln_storage::wal`, ADR 0018) of real profiles: the corpus's pprof
//! files (`../shared/corpus`, built-in seeds without it) decoded and normalized as `/ingest`
//! does, written as records, read back whole, and mutated: no mutation may panic
//! (`KILN_FUZZ_ITERATIONS` mutations, default 2,000).

use std::collections::HashMap;

use kiln_otel::model::{LABEL_SERVICE_NAME, Labels, NormalizedProfile};
use kiln_otel::mutate::{Rng, mutate};
use kiln_otel::normalize::{IngestMeta, NormalizeLimits, normalize_pprof};
use kiln_storage::wal::{decode_write, encode_write, fuzz};

/// Normalized profiles of the pprof seeds, with the request labels `/ingest` would give.
fn profiles() -> Vec<NormalizedProfile> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
    let corpus = dir.is_dir().then_some(dir.as_path());
    if corpus.is_none() {
        eprintln!("{} is absent: built-in seeds only", dir.display());
    }
    let meta = IngestMeta {
        labels: Labels::from_pairs([(LABEL_SERVICE_NAME, "api"), ("pod", "api-1")]),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        display_names: HashMap::new(),
    };
    kiln_otel::fuzz::seeds::seeds("pprof", corpus)
        .iter()
        .filter_map(|bytes| kiln_otel::pprof::decode(bytes, 64 << 20).ok())
        .filter_map(|p| normalize_pprof(&p, &meta, &NormalizeLimits::default()).ok())
        .filter(|p| !p.series.is_empty())
        .collect()
}

#[test]
fn real_profiles_read_back_whole_and_under_their_tenant() {
    let profiles = profiles();
    assert!(!profiles.is_empty());
    let mut record = Vec::new();
    for (i, p) in profiles.iter().enumerate() {
        record.clear();
        let tenant = if i % 2 == 0 { "tenant-a" } else { "tenant-b" };
        encode_write(tenant, std::slice::from_ref(p), &mut record);
        let (got_tenant, got) = decode_write(&record).unwrap();
        assert_eq!(
            got_tenant, tenant,
            "profile {i}: the record names its tenant"
        );
        assert_eq!(got, std::slice::from_ref(p), "profile {i}");
    }
    // A request's profiles share one record.
    record.clear();
    encode_write("tenant-a", &profiles, &mut record);
    assert_eq!(decode_write(&record).unwrap().1, profiles);
}

#[test]
fn mutated_records_are_refused_or_safe() {
    let seeds: Vec<Vec<u8>> = profiles()
        .iter()
        .map(|p| {
            let mut record = Vec::new();
            encode_write("t", std::slice::from_ref(p), &mut record);
            record
        })
        .collect();
    let n: u64 = std::env::var("KILN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let mut decoded = 0;
    for i in 0..n {
        let mut rng = Rng::new(i);
        let seed = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())];
        let (input, what) = mutate(&mut rng, seed, other);
        let result = std::panic::catch_unwind(|| fuzz(&input));
        assert!(result.is_ok(), "mutation seed {i} ({what}) panicked");
        decoded += u64::from(decode_write(&input).is_ok());
    }
    eprintln!("{} seeds, {decoded} of {n} mutations decoded", seeds.len());
    // Mutated names, values and times still decode: the dataset path ran on them.
    assert!(n < 100 || decoded > 0, "no mutation decoded");
}
