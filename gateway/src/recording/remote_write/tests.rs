use bytes::Bytes;
use kiln_proto::prometheus as pb;
use prost::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::*;

use axum::extract::State as AxumState;
use http::{HeaderMap, StatusCode};

fn sample(name: &str, job: &str, t: i64, v: f64) -> Sample {
    Sample {
        labels: vec![("job".into(), job.into()), ("__name__".into(), name.into())],
        timestamp_ms: t,
        value: v,
    }
}

fn dest(url: &str, tenant: &str) -> Destination {
    Destination {
        url: url.into(),
        tenant: tenant.into(),
    }
}

fn decode(body: &[u8]) -> pb::WriteRequest {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy block format");
    pb::WriteRequest::decode(&raw[..]).expect("a WriteRequest")
}

fn labels(ts: &pb::TimeSeries) -> Vec<(&str, &str)> {
    ts.labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect()
}

#[test]
fn encode_groups_sorts_and_describes() {
    let body = encode(&[
        sample("cpu_total", "b", 20, 2.0),
        sample("cpu_total", "a", 10, 1.0),
        sample("alloc_total", "a", 5, 7.0),
        sample("cpu_total", "b", 10, 1.5),
    ])
    .unwrap();
    let req = decode(&body);
    assert_eq!(req.timeseries.len(), 3);
    assert_eq!(
        labels(&req.timeseries[0]),
        [("__name__", "alloc_total"), ("job", "a")]
    );
    assert_eq!(
        labels(&req.timeseries[1]),
        [("__name__", "cpu_total"), ("job", "a")]
    );
    let b = &req.timeseries[2];
    assert_eq!(labels(b), [("__name__", "cpu_total"), ("job", "b")]);
    let points: Vec<(i64, f64)> = b.samples.iter().map(|s| (s.timestamp, s.value)).collect();
    assert_eq!(points, [(10, 1.5), (20, 2.0)]);
    let meta: Vec<(&str, i32)> = req
        .metadata
        .iter()
        .map(|m| (m.metric_family_name.as_str(), m.r#type))
        .collect();
    let counter = pb::metric_metadata::MetricType::Counter as i32;
    assert_eq!(meta, [("alloc_total", counter), ("cpu_total", counter)]);
}

#[test]
fn encode_keeps_the_first_of_a_repeated_label() {
    let mut s = sample("m", "a", 1, 1.0);
    s.labels.push(("job".into(), "z".into()));
    let req = decode(&encode(&[s]).unwrap());
    assert_eq!(
        labels(&req.timeseries[0]),
        [("__name__", "m"), ("job", "a")]
    );
}

#[test]
fn queue_survives_reopen_and_sets_torn_files_aside() {
    let dir = tempfile::tempdir().unwrap();
    let a = dest("http://a/api/v1/write", "t1");
    let q = RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap();
    q.push(&a, &[]).unwrap();
    assert_eq!(q.pending(), 0);
    q.push(&a, &[sample("m", "x", 1, 1.0)]).unwrap();
    q.push(&a, &[sample("m", "x", 2, 2.0), sample("m", "y", 2, 3.0)])
        .unwrap();
    let bytes = q.stats().pending_bytes();
    assert!(bytes > 0);
    assert_eq!(q.stats().samples_queued(), 3);
    drop(q);

    // A torn batch, a push cut short, and a file that is not the queue's.
    std::fs::write(
        dir.path().join("00000000000000000007.batch"),
        b"kiln-remote-write 1\n{\"destin",
    )
    .unwrap();
    std::fs::write(dir.path().join("00000000000000000008.tmp"), b"half").unwrap();
    std::fs::write(dir.path().join("README"), b"not a batch").unwrap();

    let q = RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(q.pending(), 2);
    assert_eq!(q.stats().pending_bytes(), bytes);
    assert_eq!(q.stats().batches_corrupt(), 1);
    assert!(dir.path().join("00000000000000000007.corrupt").exists());
    assert!(!dir.path().join("00000000000000000008.tmp").exists());
    assert!(dir.path().join("README").exists());

    // Numbering goes on past every file seen, so the order holds.
    q.push(&a, &[sample("m", "x", 3, 3.0)]).unwrap();
    let seqs: Vec<u64> = q.lock().batches.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, [0, 1, 9]);
    let last = q.lock().batches[2].clone();
    let (header, _) = read_header(&last.path).unwrap();
    assert_eq!(header.destination, a);
    assert_eq!(header.samples, 1);
}

#[test]
fn over_budget_drops_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let a = dest("http://a/api/v1/write", "t1");
    let one = |t| vec![sample("m", "x", t, 1.0)];
    let probe = RemoteWriteQueue::open(dir.path().join("probe"), u64::MAX).unwrap();
    probe.push(&a, &one(1)).unwrap();
    let size = probe.stats().pending_bytes();

    // Room for two batches of this size.
    let q = RemoteWriteQueue::open(dir.path().join("q"), 2 * size + size / 2).unwrap();
    for t in 1..=4 {
        q.push(&a, &one(t)).unwrap();
    }
    assert_eq!(q.pending(), 2);
    assert_eq!(q.stats().samples_dropped(), 2);
    assert_eq!(q.stats().pending_bytes(), 2 * size);
    let seqs: Vec<u64> = q.lock().batches.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, [2, 3]);
    let files = std::fs::read_dir(dir.path().join("q")).unwrap().count();
    assert_eq!(files, 2);

    // A batch larger than the whole budget is kept, alone.
    let big: Vec<Sample> = (0..200)
        .map(|t| sample("m", &format!("job-{t}"), t, (t as f64).sqrt()))
        .collect();
    q.push(&a, &big).unwrap();
    assert_eq!(q.pending(), 1);
    assert_eq!(q.stats().samples_dropped(), 4);
    assert!(q.stats().pending_bytes() > 2 * size);

    // Reopened with a smaller budget, the queue keeps only what fits (and the newest).
    let r = RemoteWriteQueue::open(dir.path().join("r"), u64::MAX).unwrap();
    for t in 1..=3 {
        r.push(&a, &one(t)).unwrap();
    }
    drop(r);
    let r = RemoteWriteQueue::open(dir.path().join("r"), size).unwrap();
    assert_eq!(r.pending(), 1);
    assert_eq!(r.stats().samples_dropped(), 2);
    assert_eq!(r.lock().batches[0].seq, 2);
}

/// Over the budget, the tenant holding the most bytes loses its oldest batches first: one
/// tenant's backlog (its receiver away) does not drop another's samples, however old.
#[test]
fn over_budget_the_largest_tenant_pays() {
    let dir = tempfile::tempdir().unwrap();
    let away = dest("http://away/api/v1/write", "t1");
    let here = dest("http://here/api/v1/write", "t2");
    let one = |t| vec![sample("m", "x", t, 1.0)];
    let probe = RemoteWriteQueue::open(dir.path().join("probe"), u64::MAX).unwrap();
    probe.push(&away, &one(1)).unwrap();
    let size = probe.stats().pending_bytes();

    // Room for four batches: t1 pushes ten, t2 one among them (the fourth).
    let q = RemoteWriteQueue::open(dir.path().join("q"), 4 * size + size / 2).unwrap();
    for t in 1..=10 {
        q.push(&away, &one(t)).unwrap();
        if t == 3 {
            q.push(&here, &one(t)).unwrap();
        }
    }
    let kept: Vec<(String, u64)> = q
        .lock()
        .batches
        .iter()
        .map(|b| (b.dest.tenant.clone(), b.seq))
        .collect();
    // t2's batch, older than any of t1's left, stays; t1 keeps its newest three.
    let want: Vec<(String, u64)> = [("t2", 3), ("t1", 8), ("t1", 9), ("t1", 10)]
        .into_iter()
        .map(|(t, seq)| (t.to_owned(), seq))
        .collect();
    assert_eq!(kept, want);
    assert_eq!(q.stats().samples_dropped(), 7);
}

/// A remote write receiver answering with `script`'s statuses, then 204.
#[derive(Default)]
struct Receiver {
    script: Mutex<HashMap<String, VecDeque<StatusCode>>>,
    /// Every request: tenant, headers, decoded body and the status answered.
    seen: Mutex<Vec<(String, HeaderMap, pb::WriteRequest, StatusCode)>>,
}

async fn receive(
    AxumState(r): AxumState<Arc<Receiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let tenant = headers
        .get("x-scope-orgid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = r
        .script
        .lock()
        .unwrap()
        .get_mut(&tenant)
        .and_then(|s| s.pop_front())
        .unwrap_or(StatusCode::NO_CONTENT);
    let req = decode(&body);
    r.seen.lock().unwrap().push((tenant, headers, req, status));
    let body = if status.is_success() {
        String::new()
    } else {
        "out of order sample".repeat(20)
    };
    (status, body)
}

async fn start_receiver(script: &[(&str, &[StatusCode])]) -> (Arc<Receiver>, String) {
    let receiver = Arc::new(Receiver::default());
    for (tenant, statuses) in script {
        receiver
            .script
            .lock()
            .unwrap()
            .insert(tenant.to_string(), statuses.iter().copied().collect());
    }
    let app = axum::Router::new()
        .route("/api/v1/write", axum::routing::post(receive))
        .with_state(Arc::clone(&receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/v1/write", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, url)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn short(q: RemoteWriteQueue) -> Arc<RemoteWriteQueue> {
    Arc::new(q.with_backoff(Duration::from_millis(10), Duration::from_millis(40)))
}

#[tokio::test]
async fn sends_in_order_exactly_once_through_retries() {
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let (receiver, url) = start_receiver(&[("t1", &[unavailable, unavailable])]).await;
    let dir = tempfile::tempdir().unwrap();
    let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
    let a = dest(&url, "t1");
    for t in 1..=3 {
        q.push(&a, &[sample("m", "x", t, t as f64)]).unwrap();
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
        let _ = stopped.await;
    }));
    until("the queue is empty", || q.pending() == 0).await;
    // A push while running is sent promptly.
    q.push(&a, &[sample("m", "x", 4, 4.0)]).unwrap();
    until("the late batch is sent", || q.pending() == 0).await;
    let _ = stop.send(());
    runner.await.unwrap();

    let seen = receiver.seen.lock().unwrap();
    let statuses: Vec<u16> = seen.iter().map(|s| s.3.as_u16()).collect();
    assert_eq!(statuses, [503, 503, 204, 204, 204, 204]);
    let delivered: Vec<i64> = seen
        .iter()
        .filter(|s| s.3.is_success())
        .map(|s| s.2.timeseries[0].samples[0].timestamp)
        .collect();
    assert_eq!(delivered, [1, 2, 3, 4]);
    for (tenant, headers, _, _) in seen.iter() {
        assert_eq!(tenant, "t1");
        assert_eq!(headers["content-encoding"], "snappy");
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["x-prometheus-remote-write-version"], "0.1.0");
        assert_eq!(
            headers["user-agent"],
            concat!("kiln/", env!("CARGO_PKG_VERSION"))
        );
    }
    assert_eq!(q.stats().samples_sent(), 4);
    assert_eq!(q.stats().send_failures(), 2);
    assert_eq!(q.stats().samples_rejected(), 0);
    assert_eq!(q.stats().pending_bytes(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_refused_batch_is_counted_and_removed() {
    // Too many requests is worth a retry; a bad request is not.
    let script = [StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_REQUEST];
    let (receiver, url) = start_receiver(&[("t1", &script)]).await;
    let dir = tempfile::tempdir().unwrap();
    let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
    let a = dest(&url, "t1");
    q.push(&a, &[sample("m", "x", 1, 1.0), sample("m", "y", 1, 1.0)])
        .unwrap();
    q.push(&a, &[sample("m", "x", 2, 2.0)]).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
        let _ = stopped.await;
    }));
    until("the queue is empty", || q.pending() == 0).await;
    let _ = stop.send(());
    runner.await.unwrap();

    assert_eq!(q.stats().samples_rejected(), 2);
    assert_eq!(q.stats().samples_sent(), 1);
    assert_eq!(q.stats().send_failures(), 1);
    let seen = receiver.seen.lock().unwrap();
    let attempts: Vec<(u16, i64)> = seen
        .iter()
        .map(|s| (s.3.as_u16(), s.2.timeseries[0].samples[0].timestamp))
        .collect();
    assert_eq!(attempts, [(429, 1), (400, 1), (204, 2)]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_failing_destination_does_not_hold_back_another() {
    let down = [StatusCode::INTERNAL_SERVER_ERROR; 1000];
    let (receiver, url) = start_receiver(&[("down", &down)]).await;
    let dir = tempfile::tempdir().unwrap();
    let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
    let (bad, good) = (dest(&url, "down"), dest(&url, "up"));
    q.push(&bad, &[sample("m", "x", 1, 1.0)]).unwrap();
    q.push(&good, &[sample("m", "x", 1, 1.0)]).unwrap();
    q.push(&bad, &[sample("m", "x", 2, 2.0)]).unwrap();
    q.push(&good, &[sample("m", "x", 2, 2.0)]).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
        let _ = stopped.await;
    }));
    until("the healthy destination is served", || {
        q.stats().samples_sent() == 2
    })
    .await;
    until("the failing destination is retried", || {
        q.stats().send_failures() >= 3
    })
    .await;
    let _ = stop.send(());
    runner.await.unwrap();

    assert_eq!(q.pending(), 2);
    let seen = receiver.seen.lock().unwrap();
    // The failing destination's second batch never went before its first.
    assert!(
        seen.iter()
            .filter(|s| s.0 == "down")
            .all(|s| s.2.timeseries[0].samples[0].timestamp == 1)
    );
    let up: Vec<i64> = seen
        .iter()
        .filter(|s| s.0 == "up")
        .map(|s| s.2.timeseries[0].samples[0].timestamp)
        .collect();
    assert_eq!(up, [1, 2]);
}

#[test]
fn urls_are_logged_without_credentials() {
    assert_eq!(
        redacted("https://user:secret@mimir.example/api/v1/push"),
        "https://mimir.example/api/v1/push"
    );
}
