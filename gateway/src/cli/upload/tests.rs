use kiln_otel::parca::testing::*;

use super::*;

fn sample(comm: &str, stack: &[&str], value: i64) -> TestSample {
    TestSample {
        labels: vec![("comm".into(), comm.into())],
        stack: stack.iter().map(|n| TestFrame::function(n)).collect(),
        value,
        timestamp: 1_700_000_000_000_000_000,
    }
}

fn v1_batch() -> PadataBatch {
    let samples = vec![
        sample("a", &["f", "main"], 2),
        sample("a", &["g", "main"], 3),
    ];
    let stacks: Vec<Vec<TestFrame>> = samples.iter().map(|s| s.stack.clone()).collect();
    PadataBatch::V1 {
        samples: ipc(&v1_sample_record(&samples, &TestType::default()), false),
        locations: ipc(&v1_locations_record(&stacks), false),
    }
}

fn v2_batch() -> PadataBatch {
    PadataBatch::V2(ipc(
        &v2_sample_record(&[sample("b", &["h", "main"], 5)], &TestType::default()),
        true,
    ))
}

#[test]
fn both_layouts_parse_and_a_torn_tail_is_ignored() {
    let parsed = parse(padata(&[v1_batch(), v1_batch()], true).into()).unwrap();
    assert_eq!(parsed.batches.len(), 2);
    assert_eq!(parsed.locations.len(), 2);
    assert_eq!(parsed.location_of.len(), 2);
    assert!(matches!(parsed.batches[0], Batch::V1 { .. }));
    let parsed = parse(padata(&[v2_batch(), v2_batch(), v2_batch()], true).into()).unwrap();
    assert_eq!(parsed.batches.len(), 3);
    assert!(parsed.locations.is_empty());
    let parsed = parse(padata(&[], true).into()).unwrap();
    assert!(parsed.batches.is_empty());
}

#[test]
fn a_count_past_the_frames_and_a_foreign_file_are_refused() {
    let mut bytes = padata(&[v2_batch()], false);
    bytes[7] = 2;
    let err = parse(bytes.into()).unwrap_err();
    assert!(
        format!("{err:#}").contains("ends inside a counted batch"),
        "{err:#}"
    );
    assert!(parse(Bytes::from_static(b"PK\x03\x04 not padata")).is_err());
    let mut bytes = padata(&[], false);
    bytes[5] = 1;
    assert!(format!("{:#}", parse(bytes.into()).unwrap_err()).contains("version 1"));
}

#[test]
fn recordings_come_in_timestamp_order() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "1700000100-7.padata.zst",
        "1700000000-9.padata",
        "1700000050-1.padata",
        "1700000050-1.padata.zst",
        "999-1.progress",
        "notes.txt",
    ] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let r = recordings(dir.path()).unwrap();
    let stems: Vec<&str> = r.iter().map(|r| r.stem.as_str()).collect();
    assert_eq!(stems, ["1700000000-9", "1700000050-1", "1700000100-7"]);
    assert!(r[1].path.to_string_lossy().ends_with("1700000050-1.padata"));
    assert_eq!(r[1].all.len(), 2);
    assert!(
        !dir.path().join("999-1.progress").exists(),
        "a stale progress record goes"
    );
}

#[test]
fn progress_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("1-1.progress");
    assert_eq!(read_progress(&p), 0);
    write_progress(dir.path(), &p, 7).unwrap();
    assert_eq!(read_progress(&p), 7);
}
