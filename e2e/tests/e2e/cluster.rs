//! Kiln as a cluster, with the real binary: three `--roles ingest`, two `--roles query` and one
//! `--roles compact` process on the suite's PostgreSQL (over TLS, `verify-full`) and S3 server,
//! behind Debian's haproxy running `deploy/haproxy/kiln.cfg` (HTTP mode, round-robin per
//! request, no stickiness).
//!
//! Through the proxy: every process is a member of the cluster; HTTP and gRPC (h2c) writes
//! reach every ingest process; both query processes answer flame graphs and series equal to a
//! single process's that took the same profiles; a Parca agent's debug-file upload whose calls
//! reach different processes names frames on a query process; a resumed `kiln upload` stores
//! no batch twice; concurrent changes of a tenant's settings all hold; a tenant's accepted ingest rate is within
//! ±15 % of its limit however its writes are spread; its series never pass its limit; an ingest process killed with SIGKILL
//! mid-stream loses and duplicates no acknowledged profile; a rolling restart of every process
//! under load loses no acknowledged write; a recording rule's Prometheus counter equals the
//! acknowledged sums with processes killed in between; another tenant sees nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::haproxy::{Haproxy, haproxy_bin};
use kiln_e2e::{Kiln, OPERATOR, token};

use super::scale_out::{answers, ingest_all};
use kiln_proto::google::v1 as pprof;
use kiln_proto::push::v1::pusher_service_client::PusherServiceClient;
use kiln_proto::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_proto::querier::v1 as q;
use kiln_proto::settings::v1 as st;
use kiln_proto::types::v1::LabelPair;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// One sample of a folded profile at `/ingest`'s default 100 Hz, in nanoseconds.
const SAMPLE_NS: i64 = 10_000_000;

/// Six processes on one metastore and one bucket, and the proxy in front.
struct Cluster {
    ingest: Vec<Kiln>,
    query: Vec<Kiln>,
    compact: Kiln,
    proxy: Haproxy,
    /// A client of the proxy.
    front: Kiln,
    _tenants: tempfile::TempDir,
}

/// Tenant `limited`'s ingest rate (bytes a second, decompressed) and burst.
const LIMITED_RATE: u64 = 64 << 10;
const LIMITED_BURST: u64 = 8 << 10;
/// Tenant `few`'s `max_series`.
const FEW_SERIES: usize = 30;

impl Cluster {
    /// Starts the cluster; `None` (the test says it is skipped) where haproxy is not installed.
    fn start() -> Result<Option<Self>> {
        Self::start_with(&[])
    }

    /// [`Cluster::start`], every process with `extra` flags too.
    fn start_with(extra: &[&str]) -> Result<Option<Self>> {
        if haproxy_bin().is_none() {
            kiln_otel::skip::missing("haproxy");
            return Ok(None);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Over TLS, the server's certificate checked against the suite's CA.
        let pg = format!(
            "{}?sslmode=verify-full&sslrootcert={}/ca.pem",
            rt.block_on(kiln_storage::testing::postgres_database()),
            std::env::var("KILN_TEST_POSTGRES_TLS")
                .context("KILN_TEST_POSTGRES_TLS (scripts/test-services.sh sets it)")?
        );
        let (s3_url, env) = s3_env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let tenants = tempfile::tempdir()?;
        let tenants_file = tenants.path().join("tenants.toml");
        std::fs::write(
            &tenants_file,
            format!(
                "[tenants.limited]\ningest_rate_bytes = {LIMITED_RATE}\n\
                 ingest_burst_bytes = {LIMITED_BURST}\n\
                 [tenants.few]\nmax_series = {FEW_SERIES}\n"
            ),
        )?;
        let tenants_file = tenants_file.display().to_string();
        let shared = [
            "--tenants",
            tenants_file.as_str(),
            "--auth",
            "trusted-header",
            "--admin-tenant",
            OPERATOR,
            "--metastore",
            pg.as_str(),
            "--object-store",
            s3_url.as_str(),
            "--shards",
            "1",
            // The proxy checks /ready every 500 ms and takes a process out after two failures.
            "--shutdown-delay",
            "1500ms",
        ];
        let start = |roles: &str| {
            let mut flags = shared.to_vec();
            flags.extend(extra);
            flags.extend(["--roles", roles]);
            Kiln::start_with_env(&flags, &env)
        };
        let ingest = (0..3)
            .map(|_| start("ingest"))
            .collect::<Result<Vec<_>>>()?;
        let query = (0..2).map(|_| start("query")).collect::<Result<Vec<_>>>()?;
        let compact = start("compact")?;
        let proxy = Haproxy::start(
            [ingest[0].port, ingest[1].port, ingest[2].port],
            [query[0].port, query[1].port],
        )?;
        let front = Kiln::attach(proxy.port)?;
        Ok(Some(Self {
            ingest,
            query,
            compact,
            proxy,
            front,
            _tenants: tenants,
        }))
    }

    /// The servers of `backend` the proxy sent requests to (from its log).
    fn servers_used(&self, backend: &str) -> BTreeSet<String> {
        self.proxy
            .log_text()
            .split_whitespace()
            .filter_map(|w| w.strip_prefix(&format!("{backend}/")))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until every process counts the cluster's live members by role as `want`
    /// (ingest, query, compact), from its `kiln_cluster_members` gauge.
    fn wait_members(&self, want: [usize; 3]) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for k in self.ingest.iter().chain(&self.query).chain([&self.compact]) {
            loop {
                let text = k.metrics_text()?;
                let counted = ["ingest", "query", "compact"].map(|role| {
                    text.lines()
                        .find_map(|l| {
                            l.strip_prefix(&format!("kiln_cluster_members{{role=\"{role}\"}} "))
                        })
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                });
                if counted == want {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    bail!(
                        "process {} counts {counted:?} members, not {want:?}",
                        k.port
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }
}

/// The suite's S3 bucket as `--object-store` and the environment that reaches it.
pub(super) fn s3_env() -> (String, Vec<(String, String)>) {
    let (s3_url, s3_options) = kiln_storage::testing::s3_location();
    let mut env: Vec<(String, String)> = s3_options
        .iter()
        .map(|(k, v)| (k.to_ascii_uppercase(), v.clone()))
        .collect();
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    (s3_url, env)
}

/// A process of `roles` on the PostgreSQL metastore `pg` and the object store `s3` (an
/// [`s3_env`]: each call of it is a new prefix), with `flags` besides.
fn start_on_shared(
    pg: &str,
    s3: &(String, Vec<(String, String)>),
    flags: &[&str],
    roles: &str,
) -> Result<Kiln> {
    let (s3_url, env) = s3;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut all = flags.to_vec();
    all.extend([
        "--metastore",
        pg,
        "--object-store",
        s3_url.as_str(),
        "--roles",
        roles,
    ]);
    Kiln::start_with_env(&all, &env)
}

/// Each frame's self value in a flame graph (levels of `[offset, total, self, name]`).
fn self_by_name(fg: &q::FlameGraph) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    for level in &fg.levels {
        for node in level.values.chunks(4) {
            *out.entry(fg.names[node[3] as usize].clone()).or_default() += node[2];
        }
    }
    out
}

/// A pprof of one CPU sample of `main;leaf`.
fn pprof_of(leaf: &str) -> Vec<u8> {
    let line = |function_id| pprof::Line {
        function_id,
        line: 1,
    };
    let p = pprof::Profile {
        string_table: ["", "cpu", "nanoseconds", "main", leaf]
            .map(String::from)
            .to_vec(),
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: SAMPLE_NS,
        function: (1..=2)
            .map(|id| pprof::Function {
                id,
                name: 2 + id as i64,
                ..Default::default()
            })
            .collect(),
        location: (1..=2)
            .map(|id| pprof::Location {
                id,
                line: vec![line(id)],
                ..Default::default()
            })
            .collect(),
        sample: vec![pprof::Sample {
            location_id: vec![2, 1],
            value: vec![SAMPLE_NS],
            label: vec![],
        }],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    prost::Message::encode_to_vec(&p)
}

/// gRPC through the proxy: `push.v1` over h2c, each call balanced on its own.
fn push_over_grpc(port: u16, tenant: &str, calls: usize) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))?
            .connect()
            .await?;
        let mut pusher = PusherServiceClient::new(channel);
        for i in 0..calls {
            let mut req = tonic::Request::new(PushRequest {
                series: vec![RawProfileSeries {
                    labels: vec![
                        LabelPair {
                            name: "__name__".into(),
                            value: "process_cpu".into(),
                        },
                        LabelPair {
                            name: "service_name".into(),
                            value: "pushed".into(),
                        },
                    ],
                    samples: vec![RawSample {
                        raw_profile: pprof_of(&format!("pushed_{i}")).into(),
                        id: String::new(),
                    }],
                    annotations: vec![],
                }],
            });
            req.metadata_mut()
                .insert("x-scope-orgid", tenant.parse().expect("a tenant id"));
            pusher
                .push(req)
                .await
                .with_context(|| format!("push {i}"))?;
        }
        Ok(())
    })
}

#[test]
fn a_cluster_behind_haproxy_answers_as_one_process() -> Result<()> {
    let Some(mut cluster) = Cluster::start()? else {
        return Ok(());
    };
    // Every process counts six members: three ingest, two query, one compact.
    cluster.wait_members([3, 2, 1])?;

    let single = Kiln::start(&["--compaction", "false"])?;
    ingest_all(&single)?;
    ingest_all(&cluster.front)?;
    let used = cluster.servers_used("ingest");
    ensure!(used.len() == 3, "the proxy spread writes over {used:?}");

    // Every query process, and the proxy, answers as the single process does.
    let want = answers(&single)?;
    ensure!(want.all.total > 0 && want.beta.total == 7 * 4 * SAMPLE_NS);
    for (i, k) in cluster.query.iter().enumerate() {
        ensure!(answers(k)? == want, "query process {i}");
    }
    ensure!(answers(&cluster.front)? == want, "through the proxy");
    ensure!(cluster.servers_used("query").len() == 2);

    // gRPC passes the proxy (h2c both ways) to every ingest process.
    push_over_grpc(cluster.proxy.port, "grpc", 6)?;
    let pushed = self_by_name(&cluster.front.flamegraph("grpc", CPU, "{}")?);
    for i in 0..6 {
        ensure!(
            pushed.get(&format!("pushed_{i}")) == Some(&SAMPLE_NS),
            "push {i}: {pushed:?}"
        );
    }

    // A tenant sending three times its rate, spread over the ingest processes by the proxy,
    // has its rate accepted (each process takes a third), within ±15 %.
    let accepted = Arc::new(AtomicUsize::new(0));
    let body = format!("main;{} 1\n", "x".repeat(4000)).into_bytes();
    let window = Duration::from_secs(12);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for w in 0..3 {
            let (accepted, front, body) = (accepted.clone(), &cluster.front, body.clone());
            s.spawn(move || {
                // 3 × 16 requests of 4 KB a second: three times 64 KiB/s.
                let mut n = 0u64;
                while started.elapsed() < window {
                    let query = format!("name=limited.cpu&from={}", 1_700_000_000 + n * 3 + w);
                    if let Ok((200, _)) = front.ingest("limited", &query, body.clone(), &[]) {
                        accepted.fetch_add(body.len(), Ordering::Relaxed);
                    }
                    n += 1;
                    let next = Duration::from_millis(n * 1000 / 16);
                    if let Some(wait) = next.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            });
        }
    });
    let rate = accepted.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let ratio = rate / LIMITED_RATE as f64;
    eprintln!("cluster: tenant limited accepted {ratio:.2}× its rate");
    ensure!(
        (0.85..=1.15).contains(&ratio),
        "accepted {ratio:.2}× the rate limit across three ingest processes"
    );

    // A tenant's series limit holds for the cluster: of 90 new series spread over the ingest
    // processes by two clients, exactly the limit is admitted and stored.
    let admitted = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..2 {
            let (admitted, front) = (&admitted, &cluster.front);
            s.spawn(move || {
                for i in (w..90).step_by(2) {
                    let query = format!("name=svc{i}.cpu&from=1700000000");
                    if let Ok((200, _)) = front.ingest("few", &query, b"main 1\n".to_vec(), &[]) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    ensure!(
        admitted.load(Ordering::Relaxed) == FEW_SERIES,
        "{} series admitted, the limit is {FEW_SERIES}",
        admitted.load(Ordering::Relaxed)
    );
    let services: q::SelectSeriesResponse = cluster.front.connect(
        "few",
        "/querier.v1.QuerierService/SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: 1_699_999_000_000,
            end: 1_700_001_000_000,
            step: 60.0,
            group_by: vec!["service_name".into()],
            ..Default::default()
        },
    )?;
    ensure!(
        services.series.len() == FEW_SERIES,
        "{} stored",
        services.series.len()
    );

    // Changes of one tenant's settings made at once through the proxy reach both query
    // processes; each reads, changes and writes the tenant's document under the tenant's
    // cluster-wide lock, so none is lost.
    std::thread::scope(|s| -> Result<()> {
        let calls: Vec<_> = (0..12)
            .map(|i| {
                let front = &cluster.front;
                s.spawn(move || {
                    front.connect::<_, st::SetSettingsResponse>(
                        "alpha",
                        "/settings.v1.SettingsService/Set",
                        &st::SetSettingsRequest {
                            setting: Some(st::Setting {
                                name: format!("panel{i}"),
                                value: format!("{{\"n\":{i}}}"),
                                modified_at: 0,
                            }),
                        },
                    )
                })
            })
            .collect();
        for c in calls {
            c.join().expect("a settings call")?;
        }
        Ok(())
    })?;
    for k in &cluster.query {
        let got: st::GetSettingsResponse = k.connect(
            "alpha",
            "/settings.v1.SettingsService/Get",
            &st::GetSettingsRequest {},
        )?;
        let names: BTreeSet<String> = got.settings.into_iter().map(|s| s.name).collect();
        let want: BTreeSet<String> = (0..12).map(|i| format!("panel{i}")).collect();
        ensure!(names == want, "settings kept: {names:?}");
        let other: st::GetSettingsResponse = k.connect(
            "beta",
            "/settings.v1.SettingsService/Get",
            &st::GetSettingsRequest {},
        )?;
        ensure!(other.settings.is_empty(), "beta sees alpha's settings");
    }

    // A Parca agent's debug-file upload whose calls the proxy spreads over the ingest
    // processes succeeds, and a query process names the frames.
    super::symbolize::parca_upload_names_frames_elsewhere(&cluster.front, &cluster.query[1])?;

    // `kiln upload` through the proxy, killed twice and resumed: a batch sent again reaches
    // another process, which stores it no second time.
    super::parca::interrupted_upload_resumes(&cluster.front, 5, [1500, 2700]).map_err(|e| {
        let tails: Vec<String> = cluster
            .ingest
            .iter()
            .map(|k| {
                let log = k.log_text();
                log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
            })
            .collect();
        anyhow::anyhow!(
            "{e}\n{}\n{}",
            tails.join("\n--\n"),
            cluster
                .proxy
                .log_text()
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;

    // SIGKILL of an ingest process while two clients write through the proxy: every write
    // answered 200 is stored once; the others at most once.
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicUsize::new(0));
    let total = 240usize;
    std::thread::scope(|s| -> Result<()> {
        for w in 0..2 {
            let (acked, sent, front) = (acked.clone(), sent.clone(), &cluster.front);
            s.spawn(move || {
                for n in (w..total).step_by(2) {
                    sent.fetch_add(1, Ordering::Relaxed);
                    let body = format!("main;p{n} 1\n").into_bytes();
                    let query = format!("name=crash.cpu&from={}", 1_700_000_000 + n);
                    if let Ok((200, _)) = front.ingest("crash", &query, body, &[]) {
                        acked.lock().unwrap().push(n);
                    }
                }
            });
        }
        while sent.load(Ordering::Relaxed) < total / 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        cluster.ingest[1].kill()?;
        Ok(())
    })?;
    let acked = acked.lock().unwrap().clone();
    ensure!(
        acked.len() * 10 >= total * 8,
        "only {} of {total} writes acknowledged",
        acked.len()
    );
    let stored = self_by_name(&cluster.front.flamegraph("crash", CPU, "{}")?);
    for n in 0..total {
        let value = stored.get(&format!("p{n}")).copied().unwrap_or(0);
        if acked.contains(&n) {
            ensure!(value == SAMPLE_NS, "acknowledged p{n} stored as {value}");
        } else {
            ensure!(value == 0 || value == SAMPLE_NS, "p{n} stored as {value}");
        }
    }
    // The killed process comes back on its data and port; the proxy sends to it again.
    cluster.ingest[1].start_again()?;

    // A rolling restart of every process (SIGTERM, then started again on its port and data)
    // while two clients write through the proxy: each process answers /ready with 503 for its
    // shutdown delay while it still serves, so the proxy takes it out first; every write
    // answered 200 is stored once.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (acked, failed) = (std::sync::Mutex::new(Vec::new()), AtomicUsize::new(0));
    std::thread::scope(|s| -> Result<()> {
        for w in 0..2u64 {
            let (stop, acked, failed, front) = (&stop, &acked, &failed, &cluster.front);
            s.spawn(move || {
                let mut n = w;
                while !stop.load(Ordering::Relaxed) {
                    let body = format!("main;r{n} 1\n").into_bytes();
                    let query = format!("name=rolling.cpu&from={}", 1_700_000_000 + n);
                    match front.ingest("rolling", &query, body, &[]) {
                        Ok((200, _)) => acked.lock().unwrap().push(n),
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    n += 2;
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        let restart = |k: &mut Kiln| -> Result<()> {
            k.restart()?;
            // Up again for the proxy's health checks (every 500 ms).
            std::thread::sleep(Duration::from_millis(1200));
            Ok(())
        };
        let result = (|| -> Result<()> {
            for k in cluster.ingest.iter_mut().chain(cluster.query.iter_mut()) {
                restart(k)?;
            }
            restart(&mut cluster.compact)
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })?;
    let acked = acked.into_inner().unwrap();
    let failed = failed.load(Ordering::Relaxed);
    eprintln!(
        "cluster: rolling restart: {} writes acknowledged, {failed} refused or failed",
        acked.len()
    );
    ensure!(
        failed * 100 <= acked.len(),
        "{failed} of {} writes failed during the rolling restart",
        acked.len() + failed
    );
    let stored = self_by_name(&cluster.front.flamegraph("rolling", CPU, "{}")?);
    for n in &acked {
        let value = stored.get(&format!("r{n}")).copied().unwrap_or(0);
        ensure!(value == SAMPLE_NS, "acknowledged r{n} stored as {value}");
    }
    cluster.wait_members([3, 2, 1])?;

    // Tenant walls: no tenant sees another's frames, through any process.
    for k in cluster.query.iter().chain([&cluster.front]) {
        let beta = k.flamegraph("beta", CPU, "{}")?;
        ensure!(
            !beta
                .names
                .iter()
                .any(|n| n.starts_with("work") || n.starts_with('p') || n.starts_with("pushed")),
            "beta sees other tenants' frames: {:?}",
            beta.names
        );
        let alpha = self_by_name(&k.flamegraph("alpha", CPU, "{}")?);
        ensure!(
            !alpha
                .keys()
                .any(|n| n == "beta_only" || n.starts_with("pushed")),
            "alpha sees other tenants' frames"
        );
        k.assert_tenant_empty("gamma")?;
    }
    if cluster.ingest.iter().any(|k| !k.is_ready()) {
        bail!("an ingest process is down");
    }
    Ok(())
}

/// A rolling restart's step: after SIGTERM a process answers `/ready` with 503 at once and
/// still serves for `--shutdown-delay`, so a load balancer takes it out before its port
/// closes; then it exits cleanly with what it acknowledged stored.
#[test]
fn a_leaving_process_is_unready_while_it_still_serves() -> Result<()> {
    let mut kiln = Kiln::start(&["--shutdown-delay", "3s"])?;
    ensure!(kiln.is_ready());
    let term = std::process::Command::new("kill")
        .args(["-TERM", &kiln.pid().to_string()])
        .status()?;
    ensure!(term.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        let status = kiln.http().get(kiln.url("/ready")).send()?.status();
        if status == 503 {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "/ready still {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still serving: a write is acknowledged and stored.
    let (s, t) = kiln.ingest("alpha", "name=leaving.cpu", b"main;late 1\n".to_vec(), &[])?;
    ensure!(s == 200, "{s} {t}");
    kiln.stop()?;
    kiln.start_again()?;
    let fg = self_by_name(&kiln.flamegraph("alpha", CPU, "{}")?);
    ensure!(fg.get("late") == Some(&SAMPLE_NS), "{fg:?}");
    kiln.assert_tenant_empty("beta")?;
    Ok(())
}

/// Two processes on one data directory would share its log and spool: the second refuses to
/// start, saying which process holds it; once the first is gone, a process starts there.
#[test]
fn a_data_directory_serves_one_process() -> Result<()> {
    let mut first = Kiln::start(&[])?;
    let dir = first.data_dir.path().join("data");
    let second = |port: u16| {
        std::process::Command::new(kiln_e2e::kiln_bin())
            .args(["serve", "--self-profile=false", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(&dir)
            .output()
    };
    let out = second(kiln_e2e::free_port())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a second process started: {stderr}");
    ensure!(
        stderr.contains("another kiln process uses the data directory"),
        "{stderr}"
    );
    ensure!(first.is_ready(), "the first process is unharmed");
    first.stop()?;
    first.start_again()?;
    ensure!(first.is_ready());
    Ok(())
}

/// The admin usage API answers the cluster's counters, whichever process is asked: profiles
/// written to two ingest processes (JWT tenants) are counted once each on a query process, as
/// one process counts them; another tenant's usage is its own; a tenant's own admin token
/// reads only its own.
#[test]
fn the_usage_api_counts_every_process() -> Result<()> {
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("usage.secret");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef-usage")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg = rt.block_on(kiln_storage::testing::postgres_database());
    let s3 = s3_env();
    let keys_dir = keys.path().display().to_string();
    let start = |roles: &str| {
        let flags = [
            "--auth",
            "jwt",
            "--jwt-keys",
            keys_dir.as_str(),
            "--admin-tenant",
            OPERATOR,
        ];
        start_on_shared(&pg, &s3, &flags, roles)
    };
    let mut ingest = [start("ingest")?, start("ingest")?];
    let query = start("query")?;
    let mut single = Kiln::start_with(&["--auth", "jwt", "--jwt-keys", keys_dir.as_str()])?;
    let bearer = |t: &str| vec![("Authorization".to_owned(), format!("Bearer {t}"))];
    for (tenant, n) in [("metered", 6u64), ("other", 1)] {
        let write = token(&key, tenant, "write")?;
        single.set_auth(bearer(&write));
        for k in ingest.iter_mut() {
            k.set_auth(bearer(&write));
        }
        for i in 0..n {
            let body = format!("main;work{i} 5\n").into_bytes();
            let query = format!("name=m.cpu&from={}", 1_700_000_000 + i);
            for k in [&single, &ingest[(i % 2) as usize]] {
                let (status, answer) = k.ingest(tenant, &query, body.clone(), &[])?;
                ensure!(status == 200, "{status} {answer}");
            }
        }
    }
    let operator = token(&key, OPERATOR, "admin")?;
    let usage = |k: &Kiln, admin: &str, tenant: &str| -> Result<(u16, serde_json::Value)> {
        let resp = k
            .http()
            .get(k.url(&format!("/api/v1/tenants/{tenant}/usage")))
            .header("Authorization", format!("Bearer {admin}"))
            .send()?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().unwrap_or_default()))
    };
    // The ingest processes add what they counted every 10 s.
    let fields = [
        "received_bytes",
        "decompressed_bytes",
        "profiles",
        "samples",
    ];
    let metered_admin = token(&key, "metered", "admin")?;
    for tenant in ["metered", "other"] {
        let own = token(&key, tenant, "admin")?;
        let (_, want) = usage(&single, &own, tenant)?;
        ensure!(want["profiles"].as_u64() > Some(0), "{want}");
        let deadline = std::time::Instant::now() + Duration::from_secs(25);
        loop {
            let (status, got) = usage(&query, &operator, tenant)?;
            ensure!(status == 200, "{status} {got}");
            if fields.iter().all(|f| got[f] == want[f]) {
                eprintln!("cluster: {tenant}'s usage over two ingest processes: {got}");
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "{tenant}'s usage {got} against one process's {want}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // A tenant's own admin token reads its usage, never another's.
    let (status, _) = usage(&query, &metered_admin, "other")?;
    ensure!(
        status == 403,
        "metered's admin token read other's usage: {status}"
    );
    Ok(())
}

/// A tenant refused for its rate on two ingest processes has its throttled minutes marked on
/// the series a query process answers (the ingest processes add them to PostgreSQL every
/// 10 s); a tenant never refused has none.
#[test]
fn throttled_minutes_reach_the_query_processes() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg = rt.block_on(kiln_storage::testing::postgres_database());
    let s3 = s3_env();
    let tenants = tempfile::tempdir()?;
    let tenants_file = tenants.path().join("tenants.toml");
    std::fs::write(
        &tenants_file,
        "[tenants.noisy]\ningest_rate_bytes = 4096\ningest_burst_bytes = 4096\n",
    )?;
    let tenants_file = tenants_file.display().to_string();
    let start = |roles: &str| {
        let flags = [
            "--auth",
            "trusted-header",
            "--tenants",
            tenants_file.as_str(),
        ];
        start_on_shared(&pg, &s3, &flags, roles)
    };
    let ingest = [start("ingest")?, start("ingest")?];
    let query = start("query")?;
    for k in &ingest {
        super::limits::ingest_until_throttled(k, "noisy", "noisy")?;
        let (s, text) = k.ingest(
            "calm",
            "name=calm.cpu&from=now",
            b"main;calm 1\n".to_vec(),
            &[],
        )?;
        ensure!(s == 200, "{s} {text}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (points, annotations) = super::limits::throttled_points(&query, "noisy")?;
        if points > 0 && !annotations.is_empty() {
            let body = &annotations[0]["body"];
            // The tenant's rate, not a process's share of it.
            ensure!(
                body["periodLimitMb"].as_f64() == Some(4096.0 / 1048576.0),
                "{body}"
            );
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no throttling annotation on the query process: {points} points"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (points, annotations) = super::limits::throttled_points(&query, "calm")?;
    ensure!(
        points > 0 && annotations.is_empty(),
        "calm: {points} {annotations:?}"
    );
    Ok(())
}

/// A recording rule over three ingest processes behind the proxy: the compactor evaluates
/// each level-0 job and the lease holder seals (ADR 0021), so Prometheus's counter per pod
/// equals the sum of the acknowledged profiles (those before the rule through its backfill),
/// with the compactor and an ingest process killed (SIGKILL) and another restarted in
/// between; another tenant's profiles never feed it.
#[test]
fn a_recording_rule_is_exact_across_ingest_processes() -> Result<()> {
    use super::recording_rules::{make_rule, promql_sum_by, send_folded};
    if kiln_e2e::prometheus::prometheus_bin().is_err() {
        kiln_otel::skip::missing("prometheus");
        return Ok(());
    }
    let prom = kiln_e2e::prometheus::Prometheus::start()?;
    let write_url = prom.write_url();
    let Some(mut cluster) = Cluster::start_with(&[
        "--remote-write-url",
        &write_url,
        "--recording-interval",
        "1s",
        "--recording-delay",
        "1s",
        "--compaction-levels",
        "20:2s,10:12m,10:3h",
    ])?
    else {
        return Ok(());
    };
    let (tenant, other) = ("rec", "rec-other");
    let shop = "{ service_name=\"shop\" }";
    let cpu = format!("{{ __profile_type__=\"{CPU}\"}}");
    // Acknowledged samples per pod (each one SAMPLE_NS of CPU).
    let mut acked: HashMap<String, i64> = HashMap::new();
    // Before the rule: counted by its backfill, read from storage.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64
        - 20;
    ensure!(send_folded(&cluster.front, tenant, "a", before, "main;pay 50\n")? == 200);
    acked.insert("a".into(), 50);
    make_rule(
        &cluster.front,
        tenant,
        "cluster_cpu",
        &[shop, &cpu],
        &["pod"],
        None,
    )?;
    make_rule(
        &cluster.front,
        other,
        "cluster_cpu",
        &[shop, &cpu],
        &["pod"],
        None,
    )?;

    let mut acked_other: std::collections::BTreeMap<String, i64> = Default::default();
    let pods = ["a", "b", "c"];
    let mut send_round = |cluster: &Cluster, round: i64| -> Result<()> {
        for (i, pod) in pods.iter().enumerate() {
            let n = round + i as i64 + 1;
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs() as i64;
            let text = format!("main;pay {n}\nmain;browse 1\n");
            if send_folded(&cluster.front, tenant, pod, secs, &text)? == 200 {
                *acked.entry((*pod).to_owned()).or_default() += n + 1;
            }
            if send_folded(&cluster.front, other, pod, secs, "main;pay 1000\n")? == 200 {
                *acked_other.entry((*pod).to_owned()).or_default() += 1000 * SAMPLE_NS;
            }
        }
        Ok(())
    };
    for round in 0..24 {
        send_round(&cluster, round)?;
        match round {
            // The compactor killed wherever it is (a merge, a seal, a send).
            6 => cluster.compact.kill()?,
            8 => cluster.compact.start_again()?,
            // An ingest process killed (nothing in flight), then back on its data.
            12 => cluster.ingest[1].kill()?,
            14 => cluster.ingest[1].start_again()?,
            18 => cluster.ingest[2].restart()?,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(400));
    }
    let want: std::collections::BTreeMap<String, i64> = acked
        .iter()
        .map(|(pod, n)| (pod.clone(), n * SAMPLE_NS))
        .collect();
    let metric = format!("profiles_recorded_cluster_cpu{{kiln_tenant=\"{tenant}\"}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let got = loop {
        let got = promql_sum_by(&prom, &metric, "pod")?;
        if got == want {
            break got;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "Prometheus holds {got:?}, the acknowledged sums are {want:?}; compactor: {}",
            cluster.compact.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // Kiln's own answer for the same selector agrees.
    let stored = cluster
        .front
        .flamegraph(tenant, CPU, "{service_name=\"shop\"}")?
        .total;
    ensure!(
        stored == want.values().sum::<i64>(),
        "stored {stored}, counted {got:?}"
    );
    // The pull endpoint of every ingest process answers the same counters.
    for k in &cluster.ingest {
        let pulled = k
            .http()
            .get(k.url("/api/v1/recording-rules/metrics"))
            .header("X-Scope-OrgID", tenant)
            .send()?
            .text()?;
        for (pod, v) in &want {
            ensure!(
                pulled
                    .lines()
                    .any(|l| l.contains(&format!("pod=\"{pod}\""))
                        && l.contains(&format!("}} {v} "))),
                "process {}'s pull endpoint lacks pod {pod} at {v}: {pulled}",
                k.port
            );
        }
    }
    // The other tenant's series count its own profiles only.
    let theirs = format!("profiles_recorded_cluster_cpu{{kiln_tenant=\"{other}\"}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while promql_sum_by(&prom, &theirs, "pod")? != acked_other {
        ensure!(
            std::time::Instant::now() < deadline,
            "{other}'s series {:?}, its acknowledged sums {acked_other:?}",
            promql_sum_by(&prom, &theirs, "pod")?
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Prometheus took every point: no time was sent with two values.
    ensure!(
        !prom.log_text().contains("duplicate sample"),
        "Prometheus refused points: {}",
        prom.log_text()
    );
    eprintln!("cluster: recording rule over 3 ingest processes: {got:?} = the acknowledged sums");
    Ok(())
}
