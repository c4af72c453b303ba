//! `kiln bench`: the whole system under a deterministic workload, side by side with DuckDB and
//! ClickHouse (chDB) on the same rows.
//!
//! It starts a real `kiln serve` (this binary) on a free loopback port, sends the workload's
//! profiles over HTTP as agents do (uncompressed pprof to `/ingest`, one step's profiles in
//! flight at once, up to `--concurrency`), waits until compaction has caught up, then times
//! flame graphs, series and label values over Connect, each repeated `--runs` times. With
//! `--peers` it writes the same rows as Parquet and runs `bench/peers.py` (DuckDB and chDB, in
//! the test venv) on them. One table on stdout (a progress bar on stderr while it runs), and
//! JSON with `--json`.

pub mod cardinality;
pub mod deployment;
pub mod fresh;
pub mod load;
pub mod queries;
pub mod recording;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use kiln_proto::querier::v1 as q;
use prost::Message;
use serde::Serialize;
use serde_json::json;

use deployment::Deployment;
use queries::{BenchQuery, Kind, MAX_NODES};
use workload::{PROFILE_NANOS, PeerRows, Shape, Workload, service_name};

/// The server's `--compaction-top-age`: a partition's blocks are packed once none has come for
/// this long. (Partitions are of ingestion time: a run's data all lands in the six hours it
/// runs in, so it is this pause after the last write that packs it.)
const TOP_AGE: Duration = Duration::from_secs(10);

/// How much longer than [`TOP_AGE`] the blocks must stay the same before compaction counts as
/// caught up: the planner runs every upkeep interval (200 ms here), and the blocks are polled
/// every 500 ms.
const SETTLE_MARGIN: Duration = Duration::from_secs(5);

/// Workload sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// 2 services × 2 pods × 10 min (240 profiles): the test suite's smoke test.
    Tiny,
    /// 20 services × 8 pods × 40 min (38,400 profiles, about 3 M rows).
    Small,
    /// 20 services × 8 pods × 12 h (691,200 profiles, about 50 M rows): the workload.
    Day,
    /// A month of a fleet: 50 services × 8 pods × 30 d, a profile per pod every 10 min, pods
    /// replaced every 12 h (24,000 series; 1,728,000 profiles, over 100 M rows).
    Month,
}

impl Preset {
    pub fn shape(self) -> Shape {
        match self {
            Self::Tiny => Shape {
                services: 2,
                pods: 2,
                minutes: 10,
                step_nanos: PROFILE_NANOS,
                churn_hours: None,
            },
            Self::Small => Shape {
                services: 20,
                pods: 8,
                minutes: 40,
                step_nanos: PROFILE_NANOS,
                churn_hours: None,
            },
            Self::Day => Shape {
                services: 20,
                pods: 8,
                minutes: 12 * 60,
                step_nanos: PROFILE_NANOS,
                churn_hours: None,
            },
            Self::Month => Shape {
                services: 50,
                pods: 8,
                minutes: 30 * 24 * 60,
                step_nanos: 60 * PROFILE_NANOS,
                churn_hours: Some(12),
            },
        }
    }
}

/// `kiln bench` flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workload size.
    #[arg(long, value_enum, default_value = "small")]
    pub preset: Preset,
    /// Minutes of profiles instead of the preset's.
    #[arg(long)]
    pub minutes: Option<i64>,
    /// Requests in flight at once while ingesting.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// How often each query is repeated (p50 and p99 over the runs).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Also load the same rows into DuckDB and chDB and run the same queries there.
    #[arg(long)]
    pub peers: bool,
    /// Python with `duckdb` and `chdb` for `--peers` (default: the test venv's, else python3).
    #[arg(long, env = "KILN_BENCH_PYTHON")]
    pub python: Option<PathBuf>,
    /// Directory of pprof files whose stacks make the workload (default: the repository's
    /// `../shared/corpus/pprof`; synthetic stacks when absent).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Working directory (Kiln's data, the peers' files); default: a temporary one, removed.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Recording rules made before ingest (each one service's CPU by pod, every fourth with a
    /// function filter), sent to a remote-write receiver the bench runs on loopback.
    #[arg(long, default_value_t = 0)]
    pub recording_rules: usize,
    /// `--recording-interval` of the server (with rules).
    #[arg(long, default_value = "15s")]
    pub recording_interval: String,
    /// Instead of the preset: one tenant with this many series (a label per sample, as request
    /// ids make them), and the time of label names and values, series and per-minute series.
    #[arg(long)]
    pub series: Option<usize>,
    /// After the single embedded process, the same workload again on a process per role
    /// (`--ingest-processes` of the ingest role), sharing the metastore at `--metastore` and the object store at
    /// `--object-store` (endpoint and credentials from the environment, as `kiln serve` reads
    /// them), and the two side by side.
    #[arg(long, requires_all = ["metastore", "object_store"])]
    pub scaled_out: bool,
    /// With `--scaled-out`: how many ingest processes take the workload, each request sent to
    /// the next in turn.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub ingest_processes: u64,
    /// After the main run, this many seconds more of the workload at 80 % of the rate it
    /// reached, while the flame graph of the last 5 minutes is asked for over and over.
    #[arg(long, default_value_t = 0)]
    pub load_seconds: u64,
    /// The load phase's rate, profiles/s, instead of 80 % of what the main run reached: the
    /// same load for two builds compared (`KILN_BENCH_SERVER` runs another build's server).
    #[arg(long)]
    pub load_rate: Option<f64>,
    /// A flag for the server, added after the bench's own (repeatable, e.g.
    /// `--server-arg=--segment-interval-ms=200`): two settings of one build compared. A flag
    /// the bench sets itself (its compaction ages, `--log`, ...) cannot be given again.
    #[arg(long = "server-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// The scaled-out processes' metastore (`postgres://…`).
    #[arg(long)]
    pub metastore: Option<String>,
    /// The scaled-out processes' object store (`s3://bucket/prefix`, …).
    #[arg(long)]
    pub object_store: Option<String>,
}

/// Compaction's work on one level's merges (an L0 merge writes L1 blocks; the top level's are
/// its merges among top-level blocks and the packing of a quiet partition).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LevelWork {
    pub level: u32,
    /// Sample rows written, per row ingested.
    pub rows_per_row: f64,
    /// Wall time of the level's jobs, summed.
    pub job_seconds: f64,
}

/// p50 and p99 of repeated measurements, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timing {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

fn timing(mut ms: Vec<f64>) -> Timing {
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: usize| ms[(ms.len() * q / 100).min(ms.len() - 1)];
    Timing {
        p50_ms: at(50),
        p99_ms: at(99),
    }
}

/// Bytes a query read from the object store (its `kiln-query-stats`): on its first run (cold
/// caches), the median of later runs without the partial-result cache, and with it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct QueryRead {
    pub cold: u64,
    pub warm: u64,
    pub cached: u64,
}

/// What `kiln bench` measured of Kiln.
#[derive(Debug, Clone, Serialize)]
pub struct KilnResults {
    pub profiles: u64,
    /// Whether the stacks came from the corpus (else from synthetic pools: another workload,
    /// whose figures do not compare with a corpus run's).
    pub stacks_from_corpus: bool,
    pub rows: u64,
    pub pprof_bytes: u64,
    pub ingest_seconds: f64,
    pub server_cpu_seconds: f64,
    /// The server's CPU from the first write until the bench saw compaction caught up (its
    /// settling wait, a few idle upkeep rounds, included): the whole cost of the rows, the
    /// merges after the last write included.
    pub server_cpu_to_catch_up_seconds: f64,
    pub ingest_mb_per_busy_core_s: f64,
    /// `server_cpu_seconds` by process (one entry for the single process).
    pub server_cpu_by_process: Vec<(String, f64)>,
    pub profiles_per_s: f64,
    pub samples_per_s: f64,
    pub ack: Timing,
    pub peak_rss_mib: f64,
    pub compaction_seconds: f64,
    pub blocks: u64,
    pub bytes_at_rest: u64,
    pub bytes_per_row: f64,
    /// Sample rows compaction wrote, per row ingested, once it caught up (rows rewritten: the
    /// write amplification of the levels and the top-level merges).
    pub compaction_rows_per_row: f64,
    /// Bytes of blocks compaction read, per byte at rest once it caught up.
    pub compaction_read_per_byte: f64,
    /// The same rows by the level merged, with the time its jobs took.
    pub compaction_levels: Vec<LevelWork>,
    /// Bytes at rest of the data below the top level while ingest ran.
    pub fresh: fresh::FreshBytes,
    /// The preset's queries, in its order.
    pub queries: Vec<QueryResult>,
}

/// What `kiln bench` measured of one query.
#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    #[serde(flatten)]
    pub query: BenchQuery,
    /// Without the partial-result cache (the first run is cold).
    pub timing: Timing,
    /// With the partial-result cache.
    pub cached: Timing,
    /// Bytes read from the object store.
    pub read: QueryRead,
    /// A flame graph's total and what the workload sent for its selection.
    pub total: Option<(i64, i64)>,
}

/// Runs `kiln bench`.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let mut shape = args.preset.shape();
    if let Some(m) = args.minutes {
        ensure!(m > 0, "--minutes must be positive");
        shape.minutes = m;
    }
    ensure!(args.runs > 0, "--runs must be at least 1");
    let temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    if let Some(series) = args.series {
        let r = cardinality::run(&args, series, &dir).await?;
        if let Some(path) = &args.json {
            std::fs::write(
                path,
                serde_json::to_vec_pretty(&json!({ "cardinality": r }))?,
            )
            .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let corpus = args
        .corpus
        .clone()
        .unwrap_or_else(|| repository_root().join("../shared/corpus/pprof"));
    let mut workload = Workload::new(shape, corpus.is_dir().then_some(corpus.as_path()));
    eprintln!(
        "kiln bench: {} services × {} pods × {} min = {} profiles, stacks from {}",
        shape.services,
        shape.pods,
        shape.minutes,
        shape.profiles(),
        if workload.from_corpus {
            corpus.display().to_string()
        } else {
            "synthetic pools (no corpus)".into()
        }
    );
    let peers_dir = dir.join("peers");
    let mut peer_rows = if args.peers {
        std::fs::create_dir_all(&peers_dir)?;
        Some(PeerRows::create(&peers_dir)?)
    } else {
        None
    };

    let mut extra: Vec<String> = Vec::new();
    let mut limits = String::new();
    if shape.churn_hours.is_some() {
        // The month arrives in about an hour of wall time, so all of its series are active at
        // once: room for them (a real month has a day's pods active, 400 here).
        let all = shape.series_in(shape.services, i64::MIN / 2, i64::MAX / 2);
        limits.push_str(&format!("max_series = {}\n", all + 1000));
    }
    if args.recording_rules > 0 {
        // Room for the rules and their series (the tenant file's defaults are 25 rules).
        limits.push_str(&format!(
            "max_recording_rules = {}\nmax_recording_series = 1000000\n",
            args.recording_rules
        ));
    }
    if !limits.is_empty() {
        let tenants = dir.join("tenants.toml");
        std::fs::write(&tenants, format!("[defaults]\n{limits}"))?;
        extra.extend(["--tenants".into(), tenants.display().to_string()]);
    }
    let receiver = if args.recording_rules > 0 {
        let (url, counts) = recording::receiver().await?;
        extra.extend([
            "--remote-write-url".into(),
            url,
            "--recording-interval".into(),
            args.recording_interval.clone(),
            "--recording-backfill".into(),
            "0s".into(),
        ]);
        Some(counts)
    } else {
        None
    };
    extra.extend(args.server_args.iter().cloned());
    let server = Deployment::single(&dir.join("data"), &extra)?;
    if args.recording_rules > 0 {
        recording::make_rules(
            &reqwest::Client::new(),
            &server.ingest,
            args.recording_rules,
            shape.services,
        )
        .await?;
    }
    let kiln = bench_kiln(&args, &server, &mut workload, peer_rows.as_mut()).await?;
    let under_load = if args.load_seconds > 0 {
        let rate = args.load_rate.unwrap_or(0.8 * kiln.profiles_per_s);
        eprintln!(
            "kiln bench: {} s more at {rate:.0} profiles/s (the main run reached {:.0}), \
             querying the last 5 minutes",
            args.load_seconds, kiln.profiles_per_s
        );
        Some(
            load::run(
                &server,
                &mut workload,
                rate,
                args.load_seconds,
                args.concurrency,
            )
            .await?,
        )
    } else {
        None
    };
    let recording = match &receiver {
        Some(counts) => {
            // Two intervals past the data's last seal, so what it sealed has been sent.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let exposition = metrics_text(&reqwest::Client::new(), &server.ingest).await?;
            let points_sealed =
                metric_values(&exposition, &["kiln_recording_points_sealed_total"])[0];
            use std::sync::atomic::Ordering::Relaxed;
            let r = recording::RecordingResults {
                rules: args.recording_rules,
                requests: counts.requests.load(Relaxed),
                bytes: counts.bytes.load(Relaxed),
                samples: counts.samples.load(Relaxed),
                points_sealed,
            };
            println!(
                "recording rules: {} rules; remote write: {} requests, {} bytes, {} samples \
                 ({:.1} bytes a sample, {:.0} bytes a rule); {} points sealed",
                r.rules,
                r.requests,
                r.bytes,
                r.samples,
                r.bytes as f64 / r.samples.max(1) as f64,
                r.bytes as f64 / r.rules.max(1) as f64,
                r.points_sealed
            );
            Some(r)
        }
        None => None,
    };
    let peers = match peer_rows {
        Some(rows) => {
            rows.finish(&peers_dir, &workload.stacks)?;
            Some(run_peers(&args, &peers_dir, &kiln.queries)?)
        }
        None => None,
    };
    drop(server);
    let scaled_out = match (&args.metastore, &args.object_store) {
        (Some(metastore), Some(object_store)) if args.scaled_out => {
            eprintln!(
                "kiln bench: the same workload on {} processes ({metastore}, {object_store})",
                args.ingest_processes + 2
            );
            let split = Deployment::scaled_out(
                &dir.join("scaled-out"),
                metastore,
                object_store,
                args.ingest_processes as usize,
                &extra,
            )?;
            let mut again = Workload::new(shape, workload.from_corpus.then_some(corpus.as_path()));
            let results = bench_kiln(&args, &split, &mut again, None).await?;
            // The dashboard on the query process while the ingest process takes the load: the
            // last minutes are in segments it did not write.
            let load = if args.load_seconds > 0 {
                let rate = args.load_rate.unwrap_or(0.8 * results.profiles_per_s);
                eprintln!(
                    "kiln bench: {} s more at {rate:.0} profiles/s on the scaled-out processes, \
                     querying the last 5 minutes on the query process",
                    args.load_seconds
                );
                Some(
                    load::run(
                        &split,
                        &mut again,
                        rate,
                        args.load_seconds,
                        args.concurrency,
                    )
                    .await?,
                )
            } else {
                None
            };
            Some((results, load))
        }
        _ => None,
    };
    let (scaled_out, scaled_out_under_load) = match scaled_out {
        Some((results, load)) => (Some(results), load),
        None => (None, None),
    };
    if let Some(p) = &peers {
        for peer in ["duckdb", "chdb"] {
            for r in &kiln.queries {
                let Some((_, sent)) = r.total else { continue };
                let key = format!("{}_total", r.query.key);
                let got = p[peer][&key].as_i64();
                ensure!(
                    got == Some(sent),
                    "{peer}'s {key} is {got:?}, the workload sent {sent}"
                );
            }
            ensure!(
                p[peer]["rows"].as_u64() == Some(kiln.rows),
                "{peer} holds {} rows, Kiln {}",
                p[peer]["rows"],
                kiln.rows
            );
        }
    }
    print_table(&kiln, peers.as_ref());
    if let Some(l) = &under_load {
        println!(
            "\nUnder load ({:.0} s at {:.0} profiles/s, asked {:.0}): flame graph of the last 5 \
             minutes {} ({} queries), acks {}, server peak RSS over the whole run {:.0} MiB.",
            l.seconds,
            l.profiles_per_s,
            l.target_profiles_per_s,
            fmt_ms(l.flame_5m),
            l.queries,
            fmt_ms(l.ack),
            l.peak_rss_mib
        );
    }
    if let Some(split) = &scaled_out {
        print_scaled_out(&kiln, split);
    }
    if let Some(l) = &scaled_out_under_load {
        println!(
            "\nScaled out, under load ({:.0} s at {:.0} profiles/s, asked {:.0}): flame graph of \
             the last 5 minutes on the query process {} ({} queries, {:.2} object store reads \
             each; {} without one: {}), acks {}, peak RSS summed {:.0} MiB.",
            l.seconds,
            l.profiles_per_s,
            l.target_profiles_per_s,
            fmt_ms(l.flame_5m),
            l.queries,
            l.store_reads_per_query,
            l.queries - l.queries_reading,
            fmt_ms(l.flame_5m_unread),
            fmt_ms(l.ack),
            l.peak_rss_mib
        );
    }
    if let Some(path) = &args.json {
        let out = json!({
            "preset": format!("{:?}", args.preset).to_lowercase(),
            "shape": {
                "services": shape.services,
                "pods": shape.pods,
                "minutes": shape.minutes,
                "step_s": shape.step_nanos / 1_000_000_000,
                "churn_hours": shape.churn_hours,
            },
            "kiln": kiln,
            "peers": peers,
            "recording": recording,
            "scaled_out": scaled_out,
            "scaled_out_under_load": scaled_out_under_load,
            "under_load": under_load,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A `kiln serve` child process on a free loopback port.
struct Server {
    child: Child,
    url: String,
    data: PathBuf,
}

impl Server {
    fn start(data: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // Another build's server measured by this bench's client (before and after a change):
        // `KILN_BENCH_SERVER`; by default this binary's.
        let exe = match std::env::var_os("KILN_BENCH_SERVER") {
            Some(exe) => PathBuf::from(exe),
            None => std::env::current_exe()?,
        };
        // Compaction policies that let a short run reach the state a long-running server is
        // in: merged by age within seconds rather than minutes and hours.
        let child = Command::new(exe)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(data)
            .args([
                "--auth",
                "none",
                "--compaction-levels",
                "20:2s,10:4s,10:8s",
                "--compaction-top-age",
                &format!("{}s", TOP_AGE.as_secs()),
                "--upkeep-interval-ms",
                "200",
                "--delete-delay-secs",
                "0",
                // The bench measures the engine, not the tenant's rate limit.
                "--ingest-rate-bytes",
                "0",
                // Its own profiles would add rows to the tenant the bench counts.
                "--self-profile=false",
                "--log",
                "warn",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kiln serve")?;
        let mut s = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            data: data.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(s);
            }
            // Refused flags and the like: said on its stderr (the bench's), and at once.
            if let Some(status) = s.child.try_wait()? {
                anyhow::bail!("kiln serve exited as it started ({status}); see its error above");
            }
            ensure!(Instant::now() < deadline, "kiln serve did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// CPU seconds the server has used (user + system, all threads).
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start after the last ')'.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; Linux
        // reports them in USER_HZ = 100 ticks per second.
        (ticks(11) + ticks(12)) / 100.0
    }

    /// The server's peak resident memory, MiB.
    fn peak_rss_mib(&self) -> f64 {
        self.status_mib("VmHWM:")
    }

    /// The server's resident memory now, MiB.
    fn rss_mib(&self) -> f64 {
        self.status_mib("VmRSS:")
    }

    fn status_mib(&self, field: &str) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .unwrap_or(0.0)
            / 1024.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>12} [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}

async fn bench_kiln(
    args: &BenchArgs,
    server: &Deployment,
    workload: &mut Workload,
    mut peer_rows: Option<&mut PeerRows>,
) -> anyhow::Result<KilnResults> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let shape = workload.shape;
    let plan = queries::plan(&shape);
    let mut sent_totals = vec![0i64; plan.len()];
    let (mut rows, mut bytes, mut latencies) = (0u64, 0u64, Vec::new());
    let mut peer_error = None;
    let cpu_before = server.cpu_seconds();
    let cpu_by_process_before = server.cpu_by_process();
    let watch = fresh::Watch::start(http.clone(), &server.compact);
    let started = Instant::now();
    let bar = progress(shape.profiles(), "ingest");
    // Requests are generated step by step and sent with up to `concurrency` in flight, so
    // steps overlap as they do when many agents send at once.
    let requests = futures::stream::iter(0..shape.steps()).flat_map(|step| {
        let profiles = workload.step(step);
        let mut batch = Vec::with_capacity(profiles.len());
        for p in &profiles {
            rows += p.samples.len() as u64;
            let service = service_name(p.service);
            for (query, sent) in plan.iter().zip(&mut sent_totals) {
                if query.kind == Kind::Flame && query.selects(&service, p.time_nanos) {
                    *sent += p.samples.iter().map(|s| s.1).sum::<i64>();
                }
            }
            let body = workload.pprof(p);
            bytes += body.len() as u64;
            batch.push((
                format!(
                    "{}/ingest?{}",
                    server.next_ingest(),
                    workload.ingest_query(p)
                ),
                body,
            ));
        }
        if let Some(r) = peer_rows.as_deref_mut()
            && let Err(e) = r.add(&shape, &profiles)
        {
            peer_error.get_or_insert(e);
        }
        futures::stream::iter(batch)
    });
    let mut acks = requests
        .map(|(url, body)| {
            let http = http.clone();
            async move {
                let t = Instant::now();
                let resp = http.post(url).body(body).send().await?;
                let status = resp.status();
                if !status.is_success() {
                    bail!(
                        "ingest: {status}: {}",
                        resp.text().await.unwrap_or_default()
                    );
                }
                Ok::<_, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    while let Some(ack) = acks.next().await {
        latencies.push(ack?);
        bar.inc(1);
    }
    drop(acks);
    if let Some(e) = peer_error {
        return Err(e.context("writing the peers' rows"));
    }
    bar.finish_and_clear();
    let ingest_seconds = started.elapsed().as_secs_f64();
    let server_cpu_seconds = (server.cpu_seconds() - cpu_before).max(1e-9);
    let server_cpu_by_process = server
        .cpu_by_process()
        .into_iter()
        .zip(cpu_by_process_before)
        .map(|((name, after), (_, before))| (name, after - before))
        .collect();
    let fresh = watch.stop().await;

    let started = Instant::now();
    let (blocks, caught_up) = wait_compacted(&http, &server.compact).await?;
    let compaction_seconds = caught_up.duration_since(started).as_secs_f64();
    let server_cpu_to_catch_up_seconds = server.cpu_seconds() - cpu_before;
    let bytes_at_rest = server.bytes_at_rest().await?;
    let exposition = metrics_text(&http, &server.compact).await?;
    let compacted = metric_values(
        &exposition,
        &[
            "kiln_storage_compaction_output_rows_total",
            "kiln_storage_compaction_input_bytes_total",
        ],
    );
    let job_seconds = metric_by_level(&exposition, "kiln_storage_compaction_duration_seconds_sum");
    let compaction_levels =
        metric_by_level(&exposition, "kiln_storage_compaction_output_rows_total")
            .into_iter()
            .map(|(level, written)| LevelWork {
                level,
                rows_per_row: written / rows.max(1) as f64,
                job_seconds: job_seconds.get(&level).copied().unwrap_or(0.0),
            })
            .collect();

    // Returns the answer and the bytes the server read for it (its `kiln-query-stats`).
    let call = |path: &'static str, body: Vec<u8>, cache: bool| {
        let (http, url) = (http.clone(), format!("{}{path}", server.query));
        async move {
            let resp = connect(&http, url, body, cache).send().await?;
            let status = resp.status();
            let read = bytes_read(&resp);
            let body = resp.bytes().await?;
            ensure!(
                status.is_success(),
                "{path}: {status}: {}",
                String::from_utf8_lossy(&body)
            );
            Ok::<_, anyhow::Error>((body, read))
        }
    };
    // Each query `runs` times without the partial-result cache (the engine against the peers,
    // which keep no results either; the first run is cold), then `runs` times with it (a
    // dashboard refreshing the same range).
    let bar = progress((2 * plan.len() * args.runs) as u64, "queries");
    let mut results = Vec::with_capacity(plan.len());
    for (query, sent) in plan.into_iter().zip(sent_totals) {
        let (path, body) = query.request();
        let mut read = QueryRead::default();
        let mut total = None;
        let mut timings = [None, None];
        for (i, cache) in [false, true].into_iter().enumerate() {
            let mut runs = Vec::with_capacity(args.runs);
            let mut bytes = Vec::with_capacity(args.runs);
            for _ in 0..args.runs {
                let t = Instant::now();
                let (answer, n) = call(path, body.clone(), cache).await?;
                runs.push(t.elapsed().as_secs_f64() * 1000.0);
                bytes.push(n);
                if query.kind == Kind::Flame {
                    let got = q::SelectMergeStacktracesResponse::decode(answer)?
                        .flamegraph
                        .unwrap_or_default()
                        .total;
                    ensure!(
                        total.is_none_or(|(before, _)| before == got),
                        "{}: the total changed between runs",
                        query.title
                    );
                    total = Some((got, sent));
                }
                bar.inc(1);
            }
            if cache {
                bytes.sort_unstable();
                read.cached = bytes[bytes.len() / 2];
            } else {
                read.cold = bytes[0];
                bytes.sort_unstable();
                read.warm = bytes[bytes.len() / 2];
            }
            timings[i] = Some(timing(runs));
        }
        if let Some((got, sent)) = total {
            ensure!(sent > 0, "the workload sent nothing for {}", query.title);
            ensure!(
                got == sent,
                "the {} total is {got}, the workload sent {sent}",
                query.title
            );
        }
        let [Some(timing), Some(cached)] = timings else {
            unreachable!("both passes ran")
        };
        results.push(QueryResult {
            query,
            timing,
            cached,
            read,
            total,
        });
    }
    bar.finish_and_clear();
    let rows_stored = blocks["rows"].as_u64().unwrap_or(0);
    ensure!(
        rows_stored == rows,
        "Kiln holds {rows_stored} sample rows, the workload sent {rows}"
    );
    let mb = bytes as f64 / 1e6;
    Ok(KilnResults {
        profiles: shape.profiles(),
        stacks_from_corpus: workload.from_corpus,
        rows,
        pprof_bytes: bytes,
        ingest_seconds,
        server_cpu_seconds,
        server_cpu_to_catch_up_seconds,
        ingest_mb_per_busy_core_s: mb / server_cpu_seconds,
        server_cpu_by_process,
        profiles_per_s: shape.profiles() as f64 / ingest_seconds,
        samples_per_s: rows as f64 / ingest_seconds,
        ack: timing(latencies),
        peak_rss_mib: server.peak_rss_mib(),
        compaction_seconds,
        blocks: blocks["blocks"].as_u64().unwrap_or(0),
        bytes_at_rest,
        bytes_per_row: bytes_at_rest as f64 / rows.max(1) as f64,
        compaction_rows_per_row: compacted[0] / rows.max(1) as f64,
        compaction_read_per_byte: compacted[1] / bytes_at_rest.max(1) as f64,
        compaction_levels,
        fresh,
        queries: results,
    })
}

/// The Prometheus exposition of the process at `url`.
async fn metrics_text(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    Ok(http
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// The samples of metric `name` in a Prometheus exposition, with their labels (`""` for none).
fn metric_samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.trim().parse().ok()?))
    })
}

/// The values of counters or gauges `names`, each summed over its label sets (0 for one the
/// exposition does not show).
fn metric_values(text: &str, names: &[&str]) -> Vec<f64> {
    names
        .iter()
        .map(|name| metric_samples(text, name).map(|(_, v)| v).sum())
        .collect()
}

/// The values of metric `name` by its `level` label, lowest level first.
fn metric_by_level(text: &str, name: &str) -> std::collections::BTreeMap<u32, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (labels, v) in metric_samples(text, name) {
        let level = labels
            .split(',')
            .find_map(|l| l.strip_prefix("level=\"")?.strip_suffix('"')?.parse().ok());
        if let Some(level) = level {
            *out.entry(level).or_insert(0.0) += v;
        }
    }
    out
}

/// The bytes a query read from the object store, from its answer's `kiln-query-stats`.
pub(crate) fn bytes_read(resp: &reqwest::Response) -> u64 {
    resp.headers()
        .get(crate::transport::http::STATS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<kiln_storage::query::QueryStats>().ok())
        .map_or(0, |s| s.bytes_read)
}

/// A Connect call with a protobuf body; without the partial-result cache unless `cache`.
fn connect(
    http: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: Vec<u8>,
    cache: bool,
) -> reqwest::RequestBuilder {
    let req = http
        .post(url)
        .header("content-type", "application/proto")
        .body(body);
    if cache {
        req
    } else {
        req.header("cache-control", "no-store")
    }
}

/// Waits until compaction has caught up: no L0 segment and no job left, and the blocks the same
/// for longer than the largest merge age, the top level's included (a partition's blocks are
/// packed once none has come for [`TOP_AGE`]). Returns
/// the tenant's blocks as `/api/v1/tenants/anonymous/blocks` states them, and when they were
/// first seen so: the moment compaction caught up, without the wait that makes sure of it.
async fn wait_compacted(
    http: &reqwest::Client,
    server: &str,
) -> anyhow::Result<(serde_json::Value, Instant)> {
    let started = Instant::now();
    let blocks_url = format!("{server}/api/v1/tenants/anonymous/blocks");
    let (mut last, mut since) = (serde_json::Value::Null, Instant::now());
    loop {
        let b: serde_json::Value = http.get(&blocks_url).send().await?.json().await?;
        if b["levels"] != last["levels"] || b["jobs"] != last["jobs"] {
            (last, since) = (b.clone(), Instant::now());
        }
        let l0 = b["levels"]["0"].as_u64().unwrap_or(0);
        if l0 == 0 && b["jobs"].as_u64() == Some(0) && since.elapsed() > TOP_AGE + SETTLE_MARGIN {
            return Ok((b, since));
        }
        ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "compaction did not catch up in 30 min: {b}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// The repository the binary was built from, while it is there; else the current directory
/// (a binary built in a worktree since removed, run from a checkout).
fn repository_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("bench/peers.py").is_file() {
        built
    } else {
        PathBuf::from(".")
    }
}

/// Runs `bench/peers.py` on the rows in `dir`; returns its JSON.
fn run_peers(
    args: &BenchArgs,
    dir: &Path,
    queries: &[QueryResult],
) -> anyhow::Result<serde_json::Value> {
    let root = repository_root();
    let script = root.join("bench/peers.py");
    ensure!(script.exists(), "{} is missing", script.display());
    let python = args.python.clone().unwrap_or_else(|| {
        let venv = std::env::var_os("KILN_TEST_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/test-venv"));
        let p = venv.join("bin/python");
        if p.exists() {
            p
        } else {
            PathBuf::from("python3")
        }
    });
    eprintln!("kiln bench: peers (DuckDB, chDB) with {}", python.display());
    let plan = dir.join("queries.json");
    let list: Vec<&BenchQuery> = queries.iter().map(|r| &r.query).collect();
    std::fs::write(&plan, serde_json::to_vec_pretty(&list)?)?;
    let out = Command::new(&python)
        .arg(&script)
        .arg("--dir")
        .arg(dir)
        .arg("--queries")
        .arg(&plan)
        .args(["--runs", &args.runs.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "bench/peers.py failed ({})",
        out.status
    );
    serde_json::from_slice(&out.stdout).context("bench/peers.py printed no JSON")
}

fn fmt_bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        _ => format!("{:.1} MB", n as f64 / 1e6),
    }
}

fn fmt_ms(t: Timing) -> String {
    format!("{:.1} / {:.1} ms", t.p50_ms, t.p99_ms)
}

/// The embedded single process and the scaled-out processes side by side.
fn print_scaled_out(single: &KilnResults, split: &KilnResults) {
    println!(
        "\n| measure | one process, embedded | a process per role (ingest, query, compact), shared metastore and object store | ratio |"
    );
    println!("|---|---|---|---|");
    let row = |name: &str, a: String, b: String, ratio: f64| {
        println!("| {name} | {a} | {b} | {ratio:.2}× |");
    };
    for (a, b) in single.queries.iter().zip(&split.queries) {
        row(
            &format!("{} (p50 / p99)", a.query.title),
            fmt_ms(a.timing),
            fmt_ms(b.timing),
            b.timing.p50_ms / a.timing.p50_ms,
        );
    }
    row(
        "ack latency (p50 / p99)",
        fmt_ms(single.ack),
        fmt_ms(split.ack),
        split.ack.p50_ms / single.ack.p50_ms,
    );
    type Measure = (&'static str, fn(&KilnResults) -> f64, fn(f64) -> String);
    let measures: [Measure; 6] = [
        (
            "ingest, MB/s per busy core (all processes' CPU)",
            |k| k.ingest_mb_per_busy_core_s,
            |v| format!("{v:.1}"),
        ),
        (
            "ingest, profiles/s",
            |k| k.profiles_per_s,
            |v| format!("{v:.0}"),
        ),
        (
            "compaction caught up after the last write",
            |k| k.compaction_seconds,
            |v| format!("{v:.1} s"),
        ),
        (
            "bytes at rest per sample row",
            |k| k.bytes_per_row,
            |v| format!("{v:.2} B"),
        ),
        (
            "compaction: rows written per row ingested",
            |k| k.compaction_rows_per_row,
            |v| format!("{v:.2}"),
        ),
        (
            "peak RSS (sum of the processes)",
            |k| k.peak_rss_mib,
            |v| format!("{v:.0} MiB"),
        ),
    ];
    for (name, get, show) in measures {
        let (a, b) = (get(single), get(split));
        row(name, show(a), show(b), b / a);
    }
    let by_process: Vec<String> = split
        .server_cpu_by_process
        .iter()
        .map(|(name, s)| format!("{name} {s:.1} s"))
        .collect();
    println!(
        "\nServer CPU while ingesting: embedded {:.1} s; scaled out {:.1} s ({}).",
        single.server_cpu_seconds,
        split.server_cpu_seconds,
        by_process.join(", ")
    );
}

fn print_table(k: &KilnResults, peers: Option<&serde_json::Value>) {
    let peer = |name: &str, key: &str| -> Option<f64> {
        peers?.get(name)?.get(key)?.get("p50_ms")?.as_f64()
    };
    let peer_value =
        |name: &str, key: &str| -> Option<f64> { peers?.get(name)?.get(key)?.as_f64() };
    let cell = |v: Option<f64>, unit: &str| v.map_or("—".to_owned(), |v| format!("{v:.1}{unit}"));
    println!("| measure | Kiln | DuckDB | ClickHouse (chDB) | Kiln ÷ faster peer |");
    println!("|---|---|---|---|---|");
    let ratio = |kiln: f64, a: Option<f64>, b: Option<f64>| match (a, b) {
        (None, None) => "—".to_owned(),
        (a, b) => {
            let best = a.unwrap_or(f64::MAX).min(b.unwrap_or(f64::MAX));
            format!("{:.2}×", kiln / best)
        }
    };
    for r in &k.queries {
        let key = r.query.key.as_str();
        let (d, c) = (peer("duckdb", key), peer("chdb", key));
        println!(
            "| {}, {} series (p50 / p99) | {} | {} | {} | {} |",
            r.query.title,
            r.query.series,
            fmt_ms(r.timing),
            cell(d, " ms"),
            cell(c, " ms"),
            ratio(r.timing.p50_ms, d, c)
        );
    }
    let (d, c) = (
        peer_value("duckdb", "bytes_per_row"),
        peer_value("chdb", "bytes_per_row"),
    );
    println!(
        "| bytes at rest per sample row | {:.2} B | {} | {} | {} |",
        k.bytes_per_row,
        cell(d, " B"),
        cell(c, " B"),
        ratio(k.bytes_per_row, d, c)
    );
    println!(
        "| ingest, uncompressed pprof | {:.1} MB/s per busy core ({:.0} profiles/s, {:.0} samples/s) | — | — | |",
        k.ingest_mb_per_busy_core_s, k.profiles_per_s, k.samples_per_s
    );
    println!("| ack latency p50 / p99 | {} | — | — | |", fmt_ms(k.ack));
    println!("| server peak RSS | {:.0} MiB | — | — | |", k.peak_rss_mib);
    println!(
        "| compaction: rows written per row ingested; bytes read per byte at rest | {:.2}; {:.2} | — | — | |",
        k.compaction_rows_per_row, k.compaction_read_per_byte
    );
    println!(
        "| compaction by the level merged: rows written per row ingested, jobs' time | {} | — | — | |",
        k.compaction_levels
            .iter()
            .map(|l| format!("L{} {:.2}, {:.1} s", l.level, l.rows_per_row, l.job_seconds))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "\n| query | read from the store: first run / later runs | with the partial-result cache (p50 / p99) | read |"
    );
    println!("|---|---|---|---|");
    for r in &k.queries {
        println!(
            "| {} | {} / {} | {} | {} |",
            r.query.title,
            fmt_bytes(r.read.cold),
            fmt_bytes(r.read.warm),
            fmt_ms(r.cached),
            fmt_bytes(r.read.cached),
        );
    }
    print!("{}", k.fresh.report());
    println!(
        "\n{} profiles, {} sample rows, {:.1} MB of pprof in {:.1} s ({:.1} s of server CPU); \
         compaction caught up {:.1} s later ({:.1} s of server CPU from the first write): {} \
         blocks, {} bytes at rest. Stacks from {}. Flame graphs with max_nodes {MAX_NODES}; \
         totals checked against what was sent.",
        k.profiles,
        k.rows,
        k.pprof_bytes as f64 / 1e6,
        k.ingest_seconds,
        k.server_cpu_seconds,
        k.compaction_seconds,
        k.server_cpu_to_catch_up_seconds,
        k.blocks,
        k.bytes_at_rest,
        if k.stacks_from_corpus {
            "the corpus"
        } else {
            "synthetic pools (no corpus)"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP kiln_storage_compaction_output_rows Sample rows of blocks compaction wrote.
# TYPE kiln_storage_compaction_output_rows counter
kiln_storage_compaction_output_rows_total{level=\"0\"} 300
kiln_storage_compaction_output_rows_total{level=\"3\"} 120
kiln_storage_compaction_output_rows_total_extra 7
kiln_storage_compaction_duration_seconds_sum{level=\"0\"} 1.5
kiln_storage_compaction_duration_seconds_count{level=\"0\"} 4
kiln_recording_points_sealed_total 42
";

    #[test]
    fn metric_values_sum_label_sets_and_skip_longer_names() {
        assert_eq!(
            metric_values(
                EXPOSITION,
                &[
                    "kiln_storage_compaction_output_rows_total",
                    "kiln_recording_points_sealed_total",
                    "kiln_absent_total",
                ]
            ),
            [420.0, 42.0, 0.0]
        );
    }

    #[test]
    fn metric_by_level_reads_the_level_label() {
        let rows = metric_by_level(EXPOSITION, "kiln_storage_compaction_output_rows_total");
        assert_eq!(
            rows.into_iter().collect::<Vec<_>>(),
            [(0, 300.0), (3, 120.0)]
        );
        let secs = metric_by_level(EXPOSITION, "kiln_storage_compaction_duration_seconds_sum");
        assert_eq!(secs.into_iter().collect::<Vec<_>>(), [(0, 1.5)]);
    }
}
