//! Bad input gets a clear error with the right status, never a panic; the server keeps serving
//! and nothing acknowledged earlier is lost.

use std::io::Write;

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[test]
fn bad_input_is_refused_clearly_and_nothing_is_lost() -> Result<()> {
    let kiln = Kiln::start(&[
        "--max-body-bytes",
        "1048576",
        "--max-decompressed-bytes",
        "8388608",
    ])?;
    let tenant = "bad-input";
    let (s, b) = kiln.ingest(tenant, "name=good.cpu", b"main;work 7\n".to_vec(), &[])?;
    ensure!(s == 200, "{s} {b}");
    let before = kiln.flamegraph(tenant, CPU, "{}")?;
    ensure!(before.total == 70_000_000);

    // A real pprof, to truncate.
    let mut p = kiln_proto::google::v1::Profile {
        string_table: vec!["".into(), "cpu".into(), "nanoseconds".into(), "main".into()],
        ..Default::default()
    };
    p.sample_type
        .push(kiln_proto::google::v1::ValueType { r#type: 1, unit: 2 });
    p.function.push(kiln_proto::google::v1::Function {
        id: 1,
        name: 3,
        ..Default::default()
    });
    p.location.push(kiln_proto::google::v1::Location {
        id: 1,
        line: vec![kiln_proto::google::v1::Line {
            function_id: 1,
            line: 1,
        }],
        ..Default::default()
    });
    p.sample.push(kiln_proto::google::v1::Sample {
        location_id: vec![1],
        value: vec![5],
        label: vec![],
    });
    let pprof = prost::Message::encode_to_vec(&p);

    // 512 gzip members of 1 MiB of zeros each: half a megabyte on the wire, 512 MiB inflated.
    let member = gzip(&vec![0u8; 1 << 20]);
    let bomb: Vec<u8> = member
        .iter()
        .copied()
        .cycle()
        .take(member.len() * 512)
        .collect();
    ensure!(
        bomb.len() < 1 << 20,
        "the bomb is small on the wire: {}",
        bomb.len()
    );
    let cases: Vec<(&str, String, Vec<u8>, Vec<(&str, &str)>, u16, &str)> = vec![
        (
            "truncated protobuf",
            "name=x&format=pprof".into(),
            pprof[..pprof.len() - 2].to_vec(),
            vec![],
            400,
            "invalid pprof protobuf",
        ),
        (
            "wrong content type",
            "name=x&format=pprof".into(),
            pprof.clone(),
            vec![("Content-Type", "application/json")],
            415,
            "content type",
        ),
        (
            "unknown format",
            "name=x&format=pdf".into(),
            pprof.clone(),
            vec![],
            400,
            "format \\\"pdf\\\" is not supported",
        ),
        (
            "empty body",
            "name=x&format=pprof".into(),
            vec![],
            vec![],
            400,
            "empty",
        ),
        (
            "gzip bomb",
            "name=x&format=pprof".into(),
            bomb.clone(),
            vec![],
            413,
            "decompressed profile exceeds",
        ),
        (
            "gzip bomb as Content-Encoding",
            "name=x&format=pprof".into(),
            bomb,
            vec![("Content-Encoding", "gzip")],
            413,
            "exceeds",
        ),
        (
            "over-size body",
            "name=x&format=pprof".into(),
            vec![1u8; 2 << 20],
            vec![],
            413,
            "request body exceeds",
        ),
        (
            "invalid UTF-8 label value",
            "name=app%7Benv%3D%FF%FE%7D".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "not valid UTF-8",
        ),
        (
            "malformed name",
            "name=app%7Benv%3Dprod".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "malformed name",
        ),
        (
            "missing name",
            "format=pprof".into(),
            pprof.clone(),
            vec![],
            400,
            "name parameter is required",
        ),
        (
            "bad folded line",
            "name=app.cpu".into(),
            b"a;b notanumber".to_vec(),
            vec![],
            400,
            "line 1",
        ),
        (
            "unknown text profile type",
            "name=my.app".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "unknown profile type",
        ),
        (
            "bad time",
            "name=app&from=yesterday".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "is not a time",
        ),
        (
            "time past what a query can reach",
            "name=app.cpu&from=9223372036854775807".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "outside the range Kiln accepts",
        ),
        (
            "time before 2000",
            "name=app.cpu&from=86400".into(),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "outside the range Kiln accepts",
        ),
        (
            "time a week from now",
            format!(
                "name=app.cpu&from={}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
                    + 7 * 24 * 3600
            ),
            b"a;b 1".to_vec(),
            vec![],
            400,
            "outside the range Kiln accepts",
        ),
    ];
    for (what, query, body, headers, want, needle) in cases {
        let (status, text) = kiln.ingest(tenant, &query, body, &headers)?;
        ensure!(status == want, "{what}: got {status} ({text}), want {want}");
        ensure!(
            text.contains(needle),
            "{what}: {text:?} does not say {needle:?}"
        );
        ensure!(
            text.starts_with('{'),
            "{what}: the error body is JSON: {text}"
        );
        ensure!(kiln.is_ready(), "{what}: the server stopped serving");
    }
    let resp = kiln
        .http()
        .post(kiln.url("/ingest?name=app"))
        .body("a;b 1")
        .send()?;
    ensure!(
        resp.status().as_u16() == 401,
        "no tenant: {}",
        resp.status()
    );
    ensure!(resp.text()?.contains("X-Scope-OrgID"));

    // The bomb did not blow up memory (it inflates to 512 MiB; the limit is 8 MiB).
    let rss = rss_kib(kiln.pid());
    ensure!(
        rss < 512 * 1024,
        "kiln RSS is {rss} KiB after the gzip bomb"
    );

    // Connect: a wrong content type and a truncated request.
    let resp = kiln
        .http()
        .post(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "text/plain")
        .body("{}")
        .send()?;
    ensure!(resp.status().as_u16() == 415);
    let resp = kiln
        .http()
        .post(kiln.url("/push.v1.PusherService/Push"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/proto")
        .body(vec![0x0a, 0x10, 0x01])
        .send()?;
    ensure!(resp.status().as_u16() == 400);
    let text = resp.text()?;
    ensure!(text.contains("\"code\":\"invalid_argument\""), "{text}");
    let resp = kiln
        .http()
        .post(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/json")
        .body(r#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{a=}","start":1,"end":2}"#)
        .send()?;
    ensure!(resp.status().as_u16() == 400);
    ensure!(resp.text()?.contains("invalid label selector"));

    // Nothing acknowledged earlier was lost, and nothing refused was stored.
    let after = kiln.flamegraph(tenant, CPU, "{}")?;
    ensure!(
        after.total == before.total,
        "{} != {}",
        after.total,
        before.total
    );
    ensure!(after.names == before.names);
    kiln.assert_tenant_empty("bad-input-other")?;
    Ok(())
}
