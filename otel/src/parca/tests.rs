use super::testing::*;
use super::*;

fn read_ipc_all(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    read_ipc(bytes, 64 << 20)
}

fn sample(labels: &[(&str, &str)], stack: &[&str], value: i64) -> TestSample {
    TestSample {
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        stack: stack.iter().map(|n| TestFrame::function(n)).collect(),
        value,
        timestamp: 1_700_000_000_000_000_000,
    }
}

fn samples() -> Vec<TestSample> {
    let mut s = vec![
        sample(&[("comm", "api"), ("thread_id", "1")], &["leaf", "main"], 1),
        sample(&[("comm", "api"), ("thread_id", "2")], &["leaf", "main"], 1),
        sample(
            &[("comm", "api"), ("thread_id", "1")],
            &["other", "main"],
            3,
        ),
        sample(&[("comm", "db")], &["leaf", "main"], 5),
    ];
    s.push(TestSample {
        stack: vec![TestFrame::Native {
            address: 0xabc,
            mapping: "/usr/lib/libc.so.6".into(),
        }],
        ..sample(&[("comm", "db")], &[], 7)
    });
    s
}

fn totals(p: &NormalizedProfile) -> Vec<(String, i64)> {
    let mut t: Vec<(String, i64)> = p
        .series
        .iter()
        .map(|s| {
            (
                s.labels.get("comm").unwrap_or_default().to_owned(),
                s.total(),
            )
        })
        .collect();
    t.sort();
    t
}

#[test]
fn v1_sample_and_locations_records_normalize() {
    let batch = &read_ipc_all(&ipc(
        &v1_sample_record(&samples(), &TestType::default()),
        false,
    ))
    .unwrap()[0];
    assert_eq!(schema_version(batch), Some("v1"));
    assert!(!is_locations_record(batch));
    let record = decode_sample_record(batch).unwrap();
    let ids = record.stack_ids();
    assert_eq!(ids.len(), 3);
    let stacks: Vec<Vec<TestFrame>> = samples().iter().map(|s| s.stack.clone()).collect();
    let locations = &read_ipc_all(&ipc(&v1_locations_record(&stacks), false)).unwrap()[0];
    assert!(is_locations_record(locations));
    let by_id: FastMap<StackId, Stack> = decode_locations_record(locations)
        .unwrap()
        .into_iter()
        .collect();
    let p = normalize(&record, |id| by_id.get(id), 1, &NormalizeLimits::default()).unwrap();
    assert_eq!(totals(&p), vec![("api".into(), 5), ("db".into(), 12)]);
    let s = &p.series[0];
    assert_eq!(
        s.profile_type.id(),
        "parca_agent:samples:count:cpu:nanoseconds"
    );
    assert_eq!(s.labels.get(LABEL_NAME), Some("parca_agent"));
    assert_eq!(s.labels.get(LABEL_SERVICE_NAME), Some(UNKNOWN_SERVICE));
    assert_eq!(s.duration_nanos, 1_000_000_000);
    assert_eq!(s.time_nanos, 1_700_000_000_000_000_000);
    assert!(
        s.labels.get("thread_id").is_none(),
        "thread ids stay per sample"
    );
    assert!(
        s.samples
            .iter()
            .any(|x| x.labels == vec![("thread_id".into(), "2".into())])
    );
    let names: Vec<&str> = p.symbols.functions.iter().map(|f| &*f.name).collect();
    assert!(
        names.contains(&"leaf") && names.contains(&"libc.so.6 0xabc"),
        "{names:?}"
    );
    // A missing stack refuses the record.
    assert!(normalize(&record, |_| None, 1, &NormalizeLimits::default()).is_err());
}

#[test]
fn v2_lz4_record_normalizes() {
    let ty = TestType {
        producer: "memory".into(),
        sample_type: "alloc_space".into(),
        sample_unit: "bytes".into(),
        period_type: "space".into(),
        period_unit: "bytes".into(),
        period: 512 * 1024,
        duration: 0,
    };
    let bytes = ipc(&v2_sample_record(&samples(), &ty), true);
    let batch = &read_ipc_all(&bytes).unwrap()[0];
    assert_eq!(schema_version(batch), Some("v2"));
    let record = decode_sample_record(batch).unwrap();
    assert_eq!(record.stacks.len(), 3);
    let p = normalize(&record, |_| None, 1, &NormalizeLimits::default()).unwrap();
    assert_eq!(totals(&p), vec![("api".into(), 5), ("db".into(), 12)]);
    assert_eq!(
        p.series[0].profile_type.id(),
        "memory:alloc_space:bytes:space:bytes"
    );
    assert_eq!(p.series[0].duration_nanos, 0);
    let frames: Vec<Vec<&str>> = p
        .series
        .iter()
        .flat_map(|s| &s.samples)
        .map(|x| p.symbols.frame_names(&x.stack).collect())
        .collect();
    assert!(frames.contains(&vec!["leaf", "main"]), "{frames:?}");
}

#[test]
fn stack_requests_round_trip() {
    let ids = [[1u8; 16], [2u8; 16]];
    assert_eq!(
        read_unknown_ids(&unknown_ids_record(&ids).unwrap()).unwrap(),
        ids
    );
    assert!(read_unknown_ids(&[]).unwrap().is_empty());
}

#[test]
fn bad_input_is_refused_not_a_panic() {
    assert!(read_ipc_all(b"not arrow").is_err());
    let batch = v1_sample_record(&samples(), &TestType::default());
    let cut = batch.project(&[0, 1]).unwrap();
    assert!(decode_sample_record(&cut).is_err());
}

/// Where the compressed buffers are in an IPC stream: (stream offset, length), of record and
/// dictionary batches.
fn compressed_buffers(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        let word = |at: usize| i32::from_le_bytes(stream[at..at + 4].try_into().unwrap());
        if pos + 8 > stream.len() || word(pos + 4) == 0 {
            return out;
        }
        let len = word(pos + 4) as usize;
        let message = arrow::ipc::root_as_message(&stream[pos + 8..pos + 8 + len]).unwrap();
        let body = pos + 8 + len;
        let batch = message
            .header_as_record_batch()
            .or_else(|| message.header_as_dictionary_batch().and_then(|d| d.data()));
        if let Some(batch) = batch
            && batch.compression().is_some()
        {
            for b in batch.buffers().unwrap() {
                if b.length() >= 8 {
                    out.push((body + b.offset() as usize, b.length() as usize));
                }
            }
        }
        pos = body + message.bodyLength() as usize;
    }
}

#[test]
fn forged_buffer_lengths_are_refused_before_arrow_reads_them() {
    let ty = TestType::default();
    let stream = ipc(&v2_sample_record(&samples(), &ty), true);
    let buffers = compressed_buffers(&stream);
    assert!(!buffers.is_empty());
    let declared = |s: &[u8], at: usize| i64::from_le_bytes(s[at..at + 8].try_into().unwrap());
    // The whole stream uncompressed, to the byte: within a limit of exactly that, over one less.
    let total: i64 = buffers
        .iter()
        .map(|&(at, len)| match declared(&stream, at) {
            -1 => len as i64 - 8,
            n => n,
        })
        .sum();
    assert!(read_ipc(&stream, total as usize).is_ok());
    assert!(matches!(
        read_ipc(&stream, (total - 1) as usize),
        Err(Error::TooLarge { .. })
    ));
    for &(at, _) in &buffers {
        let real = declared(&stream, at);
        if real <= 0 {
            continue;
        }
        // Huge (arrow allocated it up front and aborted), larger or smaller than the data.
        for forged in [i64::MAX / 16, 1 << 40, real + 1, real - 1] {
            let mut bad = stream.clone();
            bad[at..at + 8].copy_from_slice(&forged.to_le_bytes());
            let err = read_ipc(&bad, 64 << 20).unwrap_err();
            assert!(
                matches!(err, Error::TooLarge { .. }) || err.to_string().contains("declares"),
                "{forged}: {err}"
            );
        }
    }
}

#[test]
fn buffers_outside_their_message_are_refused() {
    let stream = ipc(&v1_sample_record(&samples(), &TestType::default()), false);
    // Every byte of the stream raised in turn: no panic, and an error or the same batches.
    for at in 0..stream.len() {
        let mut bad = stream.clone();
        bad[at] = bad[at].wrapping_add(0x40);
        let _ = read_ipc(&bad, 64 << 20);
    }
}
