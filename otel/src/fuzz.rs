//! One entry per decoder for fuzzing: each takes arbitrary bytes through the decoder and the
//! normalization a request of that format gets, with the default limits, and must return
//! (`Ok` or `Err`) without panicking, overflowing its stack or allocating past its limits.
//!
//! The `cargo fuzz` targets of `fuzz/` call these (coverage-guided, run by hand: `fuzz/README.md`),
//! and `tests/fuzz_entries.rs` runs each over seeds and seeded mutations in the test command.

use std::collections::HashMap;

use crate::labels::AppName;
use crate::model::{LABEL_SERVICE_NAME, Labels};
use crate::normalize::{self, IngestMeta, NormalizeLimits};
use crate::parca::{self, Stack, StackId};
use crate::{folded, jfr, otlp, otlp_json, pprof, speedscope};

#[cfg(any(test, feature = "testing"))]
pub mod seeds;

/// Most bytes a decoder inflates to here (the default tenant limit is larger; fuzzing wants speed).
const MAX_INFLATED: usize = 16 << 20;

/// A fixed time for the profiles made (1 700 000 000 s).
const NOW_NANOS: i64 = 1_700_000_000_000_000_000;

/// Every fuzz entry, by the name its `cargo fuzz` target has.
pub const ENTRIES: [(&str, fn(&[u8])); 10] = [
    ("pprof", pprof),
    ("otlp_protobuf", otlp_protobuf),
    ("otlp_json", otlp_json),
    ("jfr", jfr),
    ("speedscope", speedscope),
    ("folded", folded),
    ("parca_arrow", parca_arrow),
    ("push", push),
    ("parca_raw", parca_raw),
    ("record", record),
];

fn meta() -> IngestMeta {
    IngestMeta {
        labels: Labels::from_pairs([(LABEL_SERVICE_NAME, "fuzz")]),
        time_nanos: NOW_NANOS,
        duration_nanos: 10_000_000_000,
        display_names: HashMap::new(),
    }
}

fn app() -> AppName {
    AppName {
        app: "fuzz.cpu".into(),
        labels: Labels::default(),
    }
}

/// pprof, plain or gzip (`/ingest?format=pprof`, push, Parca `WriteRaw`, ad-hoc uploads).
pub fn pprof(data: &[u8]) {
    let Ok(mut p) = pprof::decode(data, MAX_INFLATED) else {
        return;
    };
    let _ = normalize::normalize_pprof(&p, &meta(), &NormalizeLimits::default());
    // The .NET repair runs on untrusted profiles too.
    if pprof::repair_dotnet(&mut p) {
        let _ = normalize::normalize_pprof(&p, &meta(), &NormalizeLimits::default());
    }
}

/// OTLP profiles, binary protobuf (HTTP and gRPC).
pub fn otlp_protobuf(data: &[u8]) {
    // As the gateway reads it: an older layout rewritten first.
    let Ok((_, data)) = otlp::layout::to_current(data) else {
        return;
    };
    let Ok(req) = kiln_proto::wire::decode(&data[..]) else {
        return;
    };
    let _ = otlp::convert(&req, NOW_NANOS, &NormalizeLimits::default());
}

/// OTLP profiles, protobuf JSON.
pub fn otlp_json(data: &[u8]) {
    let Ok(req) = otlp_json::parse_request(data) else {
        return;
    };
    let _ = otlp::convert(&req, NOW_NANOS, &NormalizeLimits::default());
}

/// A JFR recording, plain or gzip, without a labels snapshot; the first byte chooses the sample
/// rate the request would give (none, or 1 to 255 Hz).
pub fn jfr(data: &[u8]) {
    let Some((&rate, recording)) = data.split_first() else {
        return;
    };
    let Ok(recording) = crate::compress::maybe_inflate(recording, MAX_INFLATED) else {
        return;
    };
    let rate = (rate != 0).then_some(u32::from(rate));
    let labels = jfr::LabelsSnapshot::default();
    let _ = jfr::parse(
        &recording,
        &labels,
        rate,
        &meta(),
        &NormalizeLimits::default(),
    );
}

/// A speedscope document.
pub fn speedscope(data: &[u8]) {
    let _ = speedscope::parse(data, &app(), 100, &meta(), &NormalizeLimits::default());
}

/// Folded stacks and the lines format.
pub fn folded(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(stacks) = folded::parse_folded(text) {
        let _ =
            folded::from_text_stacks(&stacks, &app(), 100, &meta(), &NormalizeLimits::default());
    }
    let lines = folded::parse_lines(text);
    let _ = folded::from_text_stacks(&lines, &app(), 100, &meta(), &NormalizeLimits::default());
}

/// A Parca agent's Arrow IPC stream (`WriteArrow`, `Write`): locations records and sample
/// records, v1 and v2.
pub fn parca_arrow(data: &[u8]) {
    let Ok(batches) = parca::read_ipc(data, MAX_INFLATED) else {
        return;
    };
    let mut stacks: HashMap<StackId, Stack> = HashMap::new();
    let mut records = Vec::new();
    for b in &batches {
        if parca::is_locations_record(b) {
            let _ = parca::locations_record_ids(b);
            if let Ok(found) = parca::decode_locations_record(b) {
                stacks.extend(found);
            }
        } else if let Ok(r) = parca::decode_sample_record(b) {
            records.push(r);
        }
    }
    for r in &records {
        let _ = parca::normalize(
            r,
            |id| stacks.get(id),
            NOW_NANOS,
            &NormalizeLimits::default(),
        );
    }
    let _ = parca::read_unknown_ids(data);
}

/// A `push.v1` request (Connect or gRPC body): each sample's pprof as `/ingest` reads it.
pub fn push(data: &[u8]) {
    let Ok(req) = kiln_proto::wire::decode::<kiln_proto::push::v1::PushRequest, _>(data) else {
        return;
    };
    for series in &req.series {
        for sample in &series.samples {
            pprof(&sample.raw_profile);
        }
    }
}

/// A Parca `WriteRaw` request: each sample's pprof as `/ingest` reads it.
pub fn parca_raw(data: &[u8]) {
    use kiln_proto::parca::profilestore::v1alpha1::WriteRawRequest;
    let Ok(req) = kiln_proto::wire::decode::<WriteRawRequest, _>(data) else {
        return;
    };
    for series in &req.series {
        for sample in &series.samples {
            pprof(&sample.raw_profile);
        }
    }
}

/// A write-ahead log record ([`crate::record`]), read back and decoded as a replay does.
pub fn record(data: &[u8]) {
    let Ok((_, mut r)) = crate::record::Record::decode(data) else {
        return;
    };
    r.max_decompressed_bytes = r.max_decompressed_bytes.min(MAX_INFLATED);
    let _ = r.profiles();
}
