use crate::Error;
use crate::metastore::{BlockMeta, BlockQuery, Job, Metastore};

use super::*;

use crate::metastore::conformance::{block_id, entry, job};
use crate::testing::postgres_database;

crate::metastore_conformance_suite!({
    let url = postgres_database().await;
    (
        Postgres::connect(&PostgresConfig::new(url)).await.unwrap(),
        (),
    )
});

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Several processes starting at once migrate the schema once, and a second connection
/// sees the first one's entries (state lives in the database, not the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_share_one_database() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = tokio::join!(Postgres::connect(&config), Postgres::connect(&config));
    let (a, b) = (a.unwrap(), b.unwrap());
    let id = block_id(1, 1);
    let written = entry("t", &id, 0, 0, 5, 9, &[("s", CPU)]);
    a.add_blocks(vec![written.clone()]).await.unwrap();
    // The other process decodes it from the database: the same entry.
    let got = b.query_blocks(BlockQuery::all("t")).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(*got[0], written);
    assert!(
        b.query_blocks(BlockQuery::all("other"))
            .await
            .unwrap()
            .is_empty()
    );
    let err = b
        .add_blocks(vec![entry("t", &id, 0, 0, 5, 9, &[("s", CPU)])])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BlockExists { .. }), "{err}");
}

/// Membership on the database's clock: each process sees every live one, a process that
/// leaves is gone at once, one not heard from within the timeout is dead, and one that comes
/// back (a restart with the same instance id) is alive again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_alive_until_they_leave_or_go_quiet() {
    use crate::metastore::Member;
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let member = |id: &str, roles: &str| Member {
        id: id.into(),
        roles: roles.into(),
    };
    let (ingest, query) = (member("host:1", "ingest"), member("host:2", "query"));
    let timeout = std::time::Duration::from_secs(60);
    assert_eq!(
        a.heartbeat(&ingest, timeout).await.unwrap(),
        vec![ingest.clone()]
    );
    assert_eq!(
        b.heartbeat(&query, timeout).await.unwrap(),
        vec![ingest.clone(), query.clone()]
    );
    b.leave(&query.id).await.unwrap();
    assert_eq!(
        a.heartbeat(&ingest, timeout).await.unwrap(),
        vec![ingest.clone()]
    );
    // Back with other roles.
    let query = member("host:2", "ingest,query");
    assert_eq!(b.heartbeat(&query, timeout).await.unwrap().len(), 2);
    // Quiet for longer than the timeout: dead to the others.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let short = std::time::Duration::from_secs(1);
    assert_eq!(
        a.heartbeat(&ingest, short).await.unwrap(),
        vec![ingest.clone()]
    );
    assert_eq!(
        b.heartbeat(&query, short).await.unwrap(),
        vec![ingest, query]
    );
}

/// A cluster-wide lease has one holder at a time: the holder renews it and keeps its epoch,
/// the other waits, and takes it (a new epoch) once it expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_has_one_holder_until_it_expires() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let ttl = std::time::Duration::from_millis(800);
    let first = a.hold_lease("planner", "a", ttl).await.unwrap();
    assert!(first.is_some());
    assert_eq!(b.hold_lease("planner", "b", ttl).await.unwrap(), None);
    assert_eq!(a.hold_lease("planner", "a", ttl).await.unwrap(), first);
    assert!(
        b.hold_lease("sweep", "b", ttl).await.unwrap().is_some(),
        "leases are by name"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let taken = b.hold_lease("planner", "b", ttl).await.unwrap();
    assert_eq!(taken, first.map(|e| e + 1), "taken over, a new epoch");
    assert_eq!(a.hold_lease("planner", "a", ttl).await.unwrap(), None);
    a.release_lease("planner", "a").await.unwrap();
    assert_eq!(
        a.hold_lease("planner", "a", ttl).await.unwrap(),
        None,
        "not a's to give"
    );
    b.release_lease("planner", "b").await.unwrap();
    assert!(
        a.hold_lease("planner", "a", ttl).await.unwrap().is_some(),
        "given up"
    );
}

/// Usage counters are the sum of what every process added; another tenant's stay apart, and
/// an erased tenant's are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_summed_over_processes() {
    use crate::metastore::UsageCount;
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let count = |tenant: &str, counter: &str, value| UsageCount {
        tenant: tenant.into(),
        counter: counter.into(),
        value,
    };
    let from_a = [count("t", "profiles", 3), count("t", "samples", 30)];
    let from_b = [count("t", "samples", 12), count("u", "profiles", 1)];
    let (x, y) = tokio::join!(a.add_usage(&from_a), b.add_usage(&from_b));
    x.unwrap();
    y.unwrap();
    a.add_usage(&[count("t", "profiles", 2)]).await.unwrap();
    let t = b.usage("t").await.unwrap().unwrap();
    assert_eq!(t.get("profiles"), Some(&5));
    assert_eq!(t.get("samples"), Some(&42));
    assert_eq!(b.usage("u").await.unwrap().unwrap().len(), 1);
    a.delete_tenant("t", 0, 0).await.unwrap();
    assert!(b.usage("t").await.unwrap().unwrap().is_empty());
    assert_eq!(
        b.usage("u").await.unwrap().unwrap().get("profiles"),
        Some(&1)
    );
}

/// Throttled minutes are the sum of what every process added, read by range; another tenant's
/// stay apart, month-old ones go as new ones come, and an erased tenant's are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_minutes_are_summed_over_processes() {
    use crate::metastore::{THROTTLED_KEPT_MS, ThrottledMinute};
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let m = |tenant: &str, minute_ms, refused| ThrottledMinute {
        tenant: tenant.into(),
        minute_ms,
        refused,
    };
    let t0 = 1_700_000_040_000;
    let (from_a, from_b) = (
        [m("t", t0, 2), m("t", t0 + 60_000, 1)],
        [m("t", t0, 3), m("u", t0, 7)],
    );
    let (x, y) = tokio::join!(a.add_throttled(&from_a), b.add_throttled(&from_b));
    x.unwrap();
    y.unwrap();
    assert_eq!(
        b.throttled("t", t0, t0 + 60_000).await.unwrap().unwrap(),
        vec![(t0, 5), (t0 + 60_000, 1)]
    );
    assert_eq!(
        a.throttled("t", t0 + 1, t0 + 60_000)
            .await
            .unwrap()
            .unwrap(),
        vec![(t0 + 60_000, 1)]
    );
    assert_eq!(
        a.throttled("u", 0, i64::MAX).await.unwrap().unwrap(),
        vec![(t0, 7)]
    );
    assert!(
        a.throttled("v", 0, i64::MAX)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    // A minute a month on drops the old ones.
    let later = t0 + THROTTLED_KEPT_MS + 120_000;
    a.add_throttled(&[m("u", later, 1)]).await.unwrap();
    assert!(
        a.throttled("t", 0, t0 + 60_000)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    a.delete_tenant("u", 0, 0).await.unwrap();
    assert!(
        b.throttled("u", 0, i64::MAX)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
}

/// Sessions shared by processes: one puts, another reads, lists and takes; they expire; a
/// tenant sees only its own; an erased tenant's are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_shared_until_taken_or_expired() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let minute = std::time::Duration::from_secs(60);
    a.put_session("t", "debuginfo/ab", b"one".to_vec(), minute)
        .await
        .unwrap();
    a.put_session("t", "debuginfo/cd", b"two".to_vec(), minute)
        .await
        .unwrap();
    a.put_session("t", "other/x", b"x".to_vec(), minute)
        .await
        .unwrap();
    assert_eq!(
        b.get_session("t", "debuginfo/ab").await.unwrap(),
        Some(b"one".to_vec())
    );
    assert_eq!(
        b.get_session("u", "debuginfo/ab").await.unwrap(),
        None,
        "another tenant"
    );
    let listed = b.sessions("t", "debuginfo/").await.unwrap();
    assert_eq!(
        listed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["debuginfo/ab", "debuginfo/cd"]
    );
    b.put_session("t", "debuginfo/ab", b"stored".to_vec(), minute)
        .await
        .unwrap();
    assert_eq!(
        a.take_session("t", "debuginfo/ab").await.unwrap(),
        Some(b"stored".to_vec())
    );
    assert_eq!(
        b.get_session("t", "debuginfo/ab").await.unwrap(),
        None,
        "taken"
    );
    let short = std::time::Duration::from_millis(300);
    a.put_session("t", "debuginfo/ef", b"brief".to_vec(), short)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        b.get_session("t", "debuginfo/ef").await.unwrap(),
        None,
        "expired"
    );
    assert_eq!(b.take_session("t", "debuginfo/ef").await.unwrap(), None);
    // Claims: of processes racing for a key, one makes it; an expired one may be claimed.
    let claims = (0..6).map(|i| {
        let m = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            m.claim_session("t", "batch/1", vec![i], short)
                .await
                .unwrap()
        }
    });
    let won = futures::future::join_all(claims).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        b.claim_session("t", "batch/1", vec![9], minute)
            .await
            .unwrap(),
        "expired"
    );
    assert!(
        !a.claim_session("t", "batch/1", vec![8], minute)
            .await
            .unwrap()
    );
    a.delete_tenant("t", 0, 0).await.unwrap();
    assert!(b.sessions("t", "").await.unwrap().is_empty());
}

/// `max_series` counted over every process: two processes admitting a tenant's new series
/// never take it past the limit together; series already active pass; quiet ones stop
/// counting after the window, unless touched; other tenants count apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_series_are_counted_for_every_process() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let hour = std::time::Duration::from_secs(3600);
    assert!(a.admit_series("t", &[1, 2, 2], 3, hour).await.unwrap());
    assert!(b.admit_series("t", &[3], 3, hour).await.unwrap());
    assert!(
        !b.admit_series("t", &[4], 3, hour).await.unwrap(),
        "a fourth"
    );
    assert!(
        a.admit_series("t", &[1, 3], 3, hour).await.unwrap(),
        "active"
    );
    assert!(b.admit_series("other", &[4, 5, 6], 3, hour).await.unwrap());
    // Racing: of ten admissions of one new series each, three fit under a limit of 6.
    let races = (10..20u64).map(|h| {
        let m = if h % 2 == 0 { a.clone() } else { b.clone() };
        async move { m.admit_series("t", &[h], 6, hour).await.unwrap() }
    });
    let admitted = futures::future::join_all(races).await;
    assert_eq!(admitted.iter().filter(|ok| **ok).count(), 3);
    // Past a short window the quiet series stop counting; a touched one stays.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    a.touch_series("t", &[1]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let second = std::time::Duration::from_secs(1);
    assert!(
        a.admit_series("t", &[30], 2, second).await.unwrap(),
        "1 and 30"
    );
    assert!(!a.admit_series("t", &[31], 2, second).await.unwrap());
    // An erased tenant's series are gone.
    a.delete_tenant("t", 0, 0).await.unwrap();
    assert!(a.admit_series("t", &[40, 41], 2, hour).await.unwrap());
}

/// Compactors racing for one queue: every job is leased to exactly one of them, and
/// planners racing to claim the same blocks create each job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_planners_and_compactors_never_share_work() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let m = Postgres::connect(&config).await.unwrap();
    let blocks: Vec<BlockMeta> = (0..40u128)
        .map(|n| entry("t", &block_id(1, n), 0, 0, 5, 9, &[("s", CPU)]))
        .collect();
    m.add_blocks(blocks).await.unwrap();
    let queued = m.queued_blocks().await.unwrap();
    let jobs: Vec<Job> = queued
        .chunks(4)
        .map(|c| Job {
            id: 0,
            tenant: "t".into(),
            partition: c[0].partition,
            shard: 0,
            level: 0,
            sources: c.to_vec(),
            owner: String::new(),
            lease_expires_ms: 0,
            attempts: 0,
        })
        .collect();
    // Four planners offer the same ten jobs at once.
    let planners = (0..4).map(|_| {
        let (m, jobs) = (m.clone(), jobs.clone());
        tokio::spawn(async move { m.add_jobs(jobs).await.unwrap() })
    });
    let created: usize = futures::future::join_all(planners)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .sum();
    assert_eq!(created, 10);
    // Four compactors lease until the queue is empty.
    let compactors = (0..4).map(|i| {
        let m = m.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Some(job) = m
                .lease_job(
                    &format!("c{i}"),
                    1_000,
                    60_000,
                    crate::format::tiers::ALL_LEVELS,
                )
                .await
                .unwrap()
            {
                mine.push(job.id);
            }
            mine
        })
    });
    let mut leased: Vec<u64> = futures::future::join_all(compactors)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    leased.sort_unstable();
    let mut all: Vec<u64> = m.jobs().await.unwrap().iter().map(|j| j.id).collect();
    all.sort_unstable();
    assert_eq!(leased, all, "each job leased exactly once");
}

/// Retention's DELETE plus VACUUM keeps the tables from growing across cycles of ingest
/// and removal, as PostgreSQL reuses the space VACUUM frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_keeps_tables_from_growing() {
    let url = postgres_database().await;
    let m = Postgres::connect(&PostgresConfig::new(url)).await.unwrap();
    let services: Vec<(String, &str)> = (0..40).map(|i| (format!("svc-{i}"), CPU)).collect();
    let series: Vec<(&str, &str)> = services.iter().map(|(s, p)| (s.as_str(), *p)).collect();
    let size = async || -> i64 {
        m.client()
            .await
            .unwrap()
            .query_one("SELECT pg_total_relation_size('kiln_blocks')", &[])
            .await
            .unwrap()
            .get(0)
    };
    let mut sizes = Vec::new();
    for cycle in 0..3u128 {
        for batch in 0..10u128 {
            let blocks = (0..100u128)
                .map(|n| {
                    let id = block_id(1, cycle * 10_000 + batch * 100 + n);
                    entry("t", &id, 1, 0, 5, 9, &series)
                })
                .collect();
            m.add_blocks(blocks).await.unwrap();
        }
        sizes.push(size().await);
        m.delete_tenant("t", 0, 0).await.unwrap();
        let ids: Vec<String> = m
            .due_tombstones(u64::MAX, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        m.forget_tombstones(&ids).await.unwrap();
        m.shrink().await.unwrap();
    }
    assert!(
        sizes[2] < sizes[0] * 3 / 2,
        "kiln_blocks grew across cycles: {sizes:?} bytes"
    );
    assert!(
        m.query_blocks(BlockQuery::all("t"))
            .await
            .unwrap()
            .is_empty()
    );
}

/// TLS as libpq's `sslmode` says, against the suite's server (`ssl=on`, a CA of its own):
/// `disable` is plain, `prefer` (the default) and `require` encrypt without checking the
/// certificate, `verify-ca` checks the chain, `verify-full` the host name too, and a client
/// certificate is presented when named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_follows_libpq_sslmode() {
    let tls = std::path::PathBuf::from(
        std::env::var("KILN_TEST_POSTGRES_TLS")
            .expect("KILN_TEST_POSTGRES_TLS (scripts/test-services.sh sets it)"),
    );
    let file = |name: &str| tls.join(name).display().to_string();
    let url = postgres_database().await;
    let open = |url: String| async move { Postgres::connect(&PostgresConfig::new(url)).await };
    // Whether the connection is encrypted, and the client certificate's subject.
    let session = |m: Postgres| async move {
        let row = m
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT ssl, coalesce(client_dn, '') FROM pg_stat_ssl
                 WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, bool>(0), row.get::<_, String>(1))
    };
    let plain = open(format!("{url}?sslmode=disable")).await.unwrap();
    assert_eq!(session(plain).await, (false, String::new()));
    for params in ["", "?sslmode=require", "?sslmode=allow"] {
        let m = open(format!("{url}{params}")).await.unwrap();
        assert_eq!(session(m).await, (true, String::new()), "{params:?}");
    }
    let ca = file("ca.pem");
    let verified = open(format!("{url}?sslmode=verify-full&sslrootcert={ca}"))
        .await
        .unwrap();
    assert!(session(verified).await.0);
    // A root that did not sign the server's certificate.
    let wrong = file("client.pem");
    let err = open(format!("{url}?sslmode=verify-ca&sslrootcert={wrong}"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MetastoreUnavailable(_)), "{err}");
    // Reached by another name: verify-ca takes it, verify-full does not.
    let renamed = url.replace("@127.0.0.1:", "@db.example:");
    assert_ne!(renamed, url);
    let hostaddr = "hostaddr=127.0.0.1";
    let by_chain = open(format!(
        "{renamed}?{hostaddr}&sslmode=verify-ca&sslrootcert={ca}"
    ))
    .await
    .unwrap();
    assert!(session(by_chain).await.0);
    let err = open(format!(
        "{renamed}?{hostaddr}&sslmode=verify-full&sslrootcert={ca}"
    ))
    .await
    .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    // A client certificate, presented when the server asks.
    let (cert, key) = (file("client.pem"), file("client.key"));
    let with_cert = open(format!(
        "{url}?sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"
    ))
    .await
    .unwrap();
    assert_eq!(session(with_cert).await, (true, "/CN=kiln-client".into()));
}

/// Recording sums are committed with the level-0 job that counted them, and only then; a seal
/// takes off what it read (sums added since stay), queues its points in order, and commits
/// nothing once its lease has changed hands; an erased tenant's rows go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_sums_commit_with_their_job_and_seals_are_fenced() {
    use crate::metastore::{LeaseFence, OutboxPoint, RecordedSum};
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = (
        Postgres::connect(&config).await.unwrap(),
        Postgres::connect(&config).await.unwrap(),
    );
    let sum = |interval_ms, value| RecordedSum {
        rule: "r".into(),
        series: "[[\"pod\",\"a\"]]".into(),
        interval_ms,
        value,
    };
    let src = block_id(1, 1);
    a.add_blocks(vec![entry("t", &src, 0, 1, 5, 9, &[("s", CPU)])])
        .await
        .unwrap();
    a.add_jobs(vec![job("t", a.queued_blocks().await.unwrap())])
        .await
        .unwrap();
    let first = a.lease_job("w1", 1000, 10, 0..1).await.unwrap().unwrap();
    let second = b
        .lease_job("w2", 2000, 10_000, 0..1)
        .await
        .unwrap()
        .unwrap();
    let output = |n| entry("t", &block_id(2, n), 1, 1, 5, 9, &[("s", CPU)]);
    // The first holder's lease expired: its sums are not committed.
    let err = a
        .complete_job_recorded(&first, "w1", vec![output(1)], &[sum(0, 5)], 2001, 1000)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert!(a.recording_sums("t", i64::MAX).await.unwrap().is_empty());
    b.complete_job_recorded(
        &second,
        "w2",
        vec![output(2)],
        &[sum(0, 5), sum(0, 2), sum(1000, 7)],
        2002,
        1000,
    )
    .await
    .unwrap();
    assert_eq!(
        a.recording_sums("t", 1000).await.unwrap(),
        vec![sum(0, 7)],
        "one row per key, before 1000 only"
    );
    assert_eq!(a.recording_tenants().await.unwrap(), vec!["t".to_owned()]);

    let ttl = std::time::Duration::from_secs(30);
    let epoch = a.hold_lease("recording", "a", ttl).await.unwrap().unwrap();
    let fence = |holder: &str, epoch| LeaseFence {
        name: "recording".into(),
        holder: holder.into(),
        epoch,
    };
    let point = |time_ms, value| OutboxPoint {
        seq: 0,
        tenant: "t".into(),
        destination: "http://127.0.0.1:1/api/v1/write".into(),
        labels: "[]".into(),
        time_ms,
        value,
    };
    let read = a.recording_sums("t", 1000).await.unwrap();
    // A sum another job adds between the seal's read and its commit stays.
    let extra = output(3);
    a.add_blocks(vec![entry("t", &block_id(3, 1), 0, 1, 5, 9, &[("s", CPU)])])
        .await
        .unwrap();
    a.add_jobs(vec![job("t", a.queued_blocks().await.unwrap())])
        .await
        .unwrap();
    let late = a
        .lease_job("w1", 3000, 10_000, 0..1)
        .await
        .unwrap()
        .unwrap();
    a.complete_job_recorded(&late, "w1", vec![extra], &[sum(0, 1)], 3001, 1000)
        .await
        .unwrap();
    assert!(
        !b.commit_recording_seal(&fence("b", epoch), "t", b"{}", &read, &[point(0, 1)])
            .await
            .unwrap(),
        "b does not hold the lease"
    );
    assert!(
        !a.commit_recording_seal(&fence("a", epoch + 1), "t", b"{}", &read, &[point(0, 1)])
            .await
            .unwrap(),
        "a stale or future epoch commits nothing"
    );
    assert_eq!(a.recording_state("t").await.unwrap(), None);
    assert!(
        a.commit_recording_seal(
            &fence("a", epoch),
            "t",
            b"{\"sealed\":1}",
            &read,
            &[point(0, 0), point(1000, 7)],
        )
        .await
        .unwrap()
    );
    assert_eq!(
        a.recording_sums("t", i64::MAX).await.unwrap(),
        vec![sum(0, 1), sum(1000, 7)],
        "the seal took off 7, the later job's 1 stays"
    );
    assert_eq!(
        b.recording_state("t").await.unwrap().as_deref(),
        Some(&b"{\"sealed\":1}"[..])
    );
    let outbox = b.recording_outbox(10).await.unwrap();
    assert_eq!(
        outbox
            .iter()
            .map(|p| (p.time_ms, p.value))
            .collect::<Vec<_>>(),
        vec![(0, 0), (1000, 7)],
        "in the order sealed"
    );
    b.remove_recording_outbox(&[outbox[0].seq]).await.unwrap();
    assert_eq!(b.recording_outbox(10).await.unwrap().len(), 1);
    a.delete_tenant("t", 4000, 0).await.unwrap();
    assert!(a.recording_tenants().await.unwrap().is_empty());
    assert!(a.recording_outbox(10).await.unwrap().is_empty());
}

/// Registrations racing a deletion from other connections (processes): every entry left holds
/// a write received after the deletion. A registration either ends before the deletion,
/// which then removes what it added, or reads the deletion's mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_racing_a_deletion_leave_only_later_writes() {
    let url = postgres_database().await;
    let config = PostgresConfig::new(url);
    let (a, b) = tokio::join!(Postgres::connect(&config), Postgres::connect(&config));
    let (a, b) = (Arc::new(a.unwrap()), Arc::new(b.unwrap()));
    const AT: u64 = 1_700_000_000_000;
    let mut received = std::collections::HashMap::new();
    let mut adds = Vec::new();
    for n in 0..60u64 {
        let id = block_id(AT + 1, u128::from(n) + 1);
        // Half received by the deletion, half after.
        let ms = if n % 2 == 0 { AT - n } else { AT + n };
        received.insert(id.clone(), ms);
        let mut e = entry("t", &id, 0, 0, 5, 9, &[("s", CPU)]);
        e.received_ms = ms;
        let m = Arc::clone(&a);
        adds.push(tokio::spawn(async move { m.add_blocks(vec![e]).await }));
        if n == 30 {
            b.delete_tenant("t", AT, 0).await.unwrap();
        }
    }
    for add in adds {
        add.await.unwrap().unwrap();
    }
    let left = b.query_blocks(BlockQuery::all("t")).await.unwrap();
    assert!(!left.is_empty(), "later writes are kept");
    for e in &left {
        assert!(
            received[&e.id] > AT,
            "{} was received by the deletion",
            e.id
        );
    }
}
