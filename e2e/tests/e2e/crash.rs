//! Crash safety: `kiln` is killed with SIGKILL at random moments while clients ingest and the
//! compactor merges, then started again. Every acknowledged profile is present exactly once,
//! nothing is duplicated, another tenant's data is untouched, and once the sweeper's grace
//! period has passed no half-written object is left. One client sends folded text (acknowledged
//! once its segment is registered), the other pprof (acknowledged from the write-ahead log,
//! ADR 0018: replayed after each kill).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use kiln_e2e::Kiln;
use kiln_storage::metastore::Metastore;
use kiln_storage::query::tree::flamegraph_stacks;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const TRIALS: u64 = 24;
/// One sample at the folded format's 100 Hz.
const ONE: i64 = 10_000_000;

/// xorshift, seeded: the kill moments are random but repeatable.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Leaf frame name -> value, of tenant `tenant`.
fn leaves(kiln: &Kiln, tenant: &str) -> Result<BTreeMap<String, i64>> {
    let fg = kiln.flamegraph(tenant, CPU, "{}")?;
    let stacks = flamegraph_stacks(&fg)?;
    let mut out = BTreeMap::new();
    for (frames, v) in stacks {
        *out.entry(frames.last().cloned().unwrap_or_default())
            .or_insert(0) += v;
    }
    Ok(out)
}

#[test]
fn sigkill_during_ingest_and_compaction_loses_and_duplicates_nothing() -> Result<()> {
    let mut kiln = Kiln::start(&[
        "--compaction-levels",
        "4:1s,3:1s,2:1s",
        "--upkeep-interval-ms",
        "20",
        "--delete-delay-secs",
        "0",
        "--orphan-grace-secs",
        "2",
        "--orphan-sweep-interval-secs",
        "1",
    ])?;
    let (s, t) = kiln.ingest(
        "bystander",
        "name=other.cpu&from=1700000000",
        b"main;bystander 7\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {t}");
    let bystander = kiln.flamegraph("bystander", CPU, "{}")?;

    let acked = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let unanswered = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut compacted_seen = false;
    for trial in 0..TRIALS {
        let port = kiln.port;
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (acked, unanswered) = (Arc::clone(&acked), Arc::clone(&unanswered));
                std::thread::spawn(move || {
                    let http = reqwest::blocking::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .expect("a client");
                    for i in 0.. {
                        let name = format!("t{trial}w{w}n{i}");
                        let (format, body) = if w == 0 {
                            ("", format!("main;{name} 1\n").into_bytes())
                        } else {
                            ("&format=pprof", cpu_pprof(&name))
                        };
                        let r = http
                            .post(format!(
                                "http://127.0.0.1:{port}/ingest?name=crash.cpu&from=1700000000\
                                 {format}"
                            ))
                            .header("X-Scope-OrgID", "crash")
                            .body(body)
                            .send();
                        match r {
                            Ok(r) if r.status().is_success() => {
                                acked.lock().unwrap().insert(name);
                            }
                            _ => {
                                unanswered.lock().unwrap().insert(name);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(40 + rng.below(400)));
        kiln.kill()?;
        for w in writers {
            w.join().expect("writer thread");
        }
        compacted_seen |= kiln.log_text().contains("compaction job done");
        kiln.start_again()?;

        let got = leaves(&kiln, "crash").map_err(|e| {
            let log = kiln.log_text();
            let tail: String = log
                .chars()
                .skip(log.chars().count().saturating_sub(4000))
                .collect();
            anyhow::anyhow!("trial {trial}: {e}\n{tail}")
        })?;
        let acked = acked.lock().unwrap();
        let unanswered = unanswered.lock().unwrap();
        for name in acked.iter() {
            ensure!(
                got.get(name) == Some(&ONE),
                "trial {trial}: acknowledged {name} stored as {:?}",
                got.get(name)
            );
        }
        for (name, v) in &got {
            if name == "main" {
                continue;
            }
            ensure!(
                acked.contains(name) || unanswered.contains(name),
                "trial {trial}: {name} was never sent"
            );
            ensure!(*v == ONE, "trial {trial}: {name} stored {v}, duplicated");
        }
        ensure!(
            kiln.flamegraph("bystander", CPU, "{}")? == bystander,
            "trial {trial}: the other tenant's data changed"
        );
        ensure!(!got.contains_key("bystander"), "trial {trial}: tenant wall");
    }
    ensure!(
        acked.lock().unwrap().len() as u64 > TRIALS,
        "too few writes to mean anything"
    );
    ensure!(
        compacted_seen,
        "no compaction ran while the trials killed kiln"
    );
    let log = kiln.log_text();
    ensure!(
        log.contains("write-ahead log replayed"),
        "no kill left a write-ahead log to replay"
    );
    eprintln!(
        "{TRIALS} SIGKILL trials: {} writes acknowledged, {} cut off; {} compaction jobs done, \
         {} orphan objects swept, {} interrupted uploads removed",
        acked.lock().unwrap().len(),
        unanswered.lock().unwrap().len(),
        log.matches("compaction job done").count(),
        log.matches("orphan object deleted").count(),
        log.matches("interrupted uploads and compactions removed")
            .count(),
    );
    eprintln!(
        "write-ahead log: {} replays after a kill",
        log.matches("write-ahead log replayed").count()
    );

    // Past the grace period (2 s) and a sweep (every second), the sweeper has removed what the
    // crashes left half written: staged uploads, compaction scratch files, unregistered objects.
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(30);
    let data = kiln.data_dir.path().join("data");
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let leftovers = stray_files(&data)?;
        if leftovers.is_empty() && restarted.elapsed() > Duration::from_secs(4) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "half-written files remain: {leftovers:?}"
        );
    }
    kiln.stop()?;
    // Every object on disk is one the metastore knows.
    let rt = tokio::runtime::Runtime::new()?;
    let known = rt.block_on(async {
        let m = kiln_storage::metastore::embedded::Embedded::open(
            &data.join("metastore").join("metastore.redb"),
        )?;
        m.known_objects().await
    })?;
    for path in object_files(&data.join("objects"))? {
        let id = kiln_storage::format::meta::object_id_of_path(&path).unwrap_or_default();
        ensure!(known.contains(id), "orphan object {path} left behind");
    }
    kiln.start_again()?;
    ensure!(kiln.flamegraph("bystander", CPU, "{}")? == bystander);
    let crash_before = kiln.flamegraph("crash", CPU, "{}")?;
    let leaves_before = leaves(&kiln, "crash")?;
    kiln.assert_tenant_empty("nobody")?;

    // Lose the metastore's contents: `kiln metastore rebuild` recreates them from the footers.
    kiln.stop()?;
    let out = std::process::Command::new(kiln_e2e::kiln_bin())
        .args(["metastore", "rebuild", "--data-dir"])
        .arg(&data)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("metastore rebuilt"),
        "rebuild failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Read before the rebuilt index is used (its upkeep merges and deletes), for a failure.
    let report = rebuild_report(&stdout, &data);
    kiln.start_again()?;
    if kiln.flamegraph("crash", CPU, "{}")? != crash_before {
        // Which writes the rebuilt index counts differently, for the failure's message.
        let after = leaves(&kiln, "crash")?;
        let differ: Vec<String> = leaves_before
            .keys()
            .chain(after.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|k| leaves_before.get(*k) != after.get(*k))
            .take(20)
            .map(|k| format!("{k}: {:?} -> {:?}", leaves_before.get(k), after.get(k)))
            .collect();
        // Kept for a closer look where asked (`KILN_E2E_KEEP=<dir>`).
        if let Some(keep) = std::env::var_os("KILN_E2E_KEEP") {
            kiln.stop()?;
            std::process::Command::new("cp")
                .arg("-a")
                .arg(&data)
                .arg(&keep)
                .status()?;
        }
        bail!("rebuilt index answers differently: {differ:?}\n{report}");
    }
    ensure!(kiln.flamegraph("bystander", CPU, "{}")? == bystander);
    kiln.assert_tenant_empty("nobody")?;
    Ok(())
}

/// What the rebuild said and which objects it read, each with what the metastore before the
/// rebuild held of it (live entries, a tombstone, nothing) and what its footer says (tenant,
/// level, the entries it replaced), for a failure's message.
fn rebuild_report(stdout: &str, data: &std::path::Path) -> String {
    let objects = object_files(&data.join("objects")).unwrap_or_default();
    let described = describe_objects(data, &objects)
        .unwrap_or_else(|e| vec![format!("(objects not described: {e})")]);
    // A log file left beside the rebuilt index is replayed from its start (the checkpoints
    // went with the old index).
    let logs: Vec<String> = walk(&data.join("wal"))
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let size = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            format!("{p} ({size} bytes)")
        })
        .collect();
    format!(
        "rebuild: {stdout}\nlog files: {logs:?}\nobjects ({}):\n{}",
        objects.len(),
        described.join("\n")
    )
}

fn describe_objects(data: &std::path::Path, objects: &[String]) -> Result<Vec<String>> {
    let before = std::fs::read_dir(data.join("metastore"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.display().to_string().contains("before-rebuild"))
        .ok_or_else(|| anyhow::anyhow!("no metastore kept from before the rebuild"))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let m = kiln_storage::metastore::embedded::Embedded::open(&before)?;
        let store = kiln_storage::store::ObjectStorage::local(&data.join("objects"))?;
        let mut live = BTreeSet::new();
        for tenant in ["crash", "bystander"] {
            for b in m
                .query_blocks(kiln_storage::metastore::BlockQuery::all(tenant))
                .await?
            {
                live.insert(b.id.clone());
            }
        }
        let tombstoned: BTreeSet<String> = m
            .due_tombstones(u64::MAX, 100_000)
            .await?
            .into_iter()
            .map(|t| t.id)
            .collect();
        let mut out = Vec::new();
        for path in objects {
            let id = kiln_storage::format::meta::object_id_of_path(path).unwrap_or_default();
            let state = if live.contains(id) {
                "live"
            } else if tombstoned.contains(id) {
                "tombstoned"
            } else {
                "unknown"
            };
            let Ok(file) = std::fs::metadata(data.join("objects").join(path)) else {
                out.push(format!("  {path} [{state}] gone"));
                continue;
            };
            let size = file.len();
            let footer = match kiln_storage::read_footer(&store, path, size).await {
                Ok(datasets) => {
                    let mut described = Vec::new();
                    for d in &datasets {
                        let indexed = m.get_blocks(&d.tenant, std::slice::from_ref(&d.id)).await?;
                        let entry = indexed.iter().find(|b| b.partition() == d.partition());
                        described.push(format!(
                            "{} L{} {} rows from {:?}{}",
                            d.tenant,
                            d.level,
                            d.rows,
                            d.compacted_from,
                            entry.map(|e| first_difference(e, d)).unwrap_or_default()
                        ));
                    }
                    described.join("; ")
                }
                Err(e) => format!("unreadable: {e}"),
            };
            out.push(format!("  {path} [{state}] {footer}"));
        }
        Ok(out)
    })
}

/// Where the metastore's entry and the footer's dataset of one block differ (the object's size
/// aside, which the footer cannot hold), or nothing.
fn first_difference(
    entry: &kiln_storage::format::meta::BlockMeta,
    footer: &kiln_storage::format::meta::BlockMeta,
) -> String {
    let (mut a, mut b) = (entry.clone(), footer.clone());
    a.object_size = 0;
    b.object_size = 0;
    if a == b {
        return String::new();
    }
    let (a, b) = (format!("{a:?}"), format!("{b:?}"));
    let at = a
        .bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let from = a[..at].char_indices().rev().nth(120).map_or(0, |(i, _)| i);
    let snip = |s: &str| s[from..].chars().take(400).collect::<String>();
    format!(
        " DIFFERS from its entry: entry …{} / footer …{}",
        snip(&a),
        snip(&b)
    )
}

/// A CPU pprof of one sample (10 ms at 100 Hz) of the stack `main;leaf`.
fn cpu_pprof(leaf: &str) -> Vec<u8> {
    use kiln_proto::google::v1 as pb;
    let strings = ["", "cpu", "nanoseconds", "main", leaf];
    let location = |id: u64| pb::Location {
        id,
        line: vec![pb::Line {
            function_id: id,
            line: 1,
        }],
        ..Default::default()
    };
    let profile = pb::Profile {
        string_table: strings.map(String::from).to_vec(),
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: ONE,
        function: vec![
            pb::Function {
                id: 1,
                name: 3,
                ..Default::default()
            },
            pb::Function {
                id: 2,
                name: 4,
                ..Default::default()
            },
        ],
        location: vec![location(1), location(2)],
        sample: vec![pb::Sample {
            location_id: vec![2, 1],
            value: vec![ONE],
            ..Default::default()
        }],
        ..Default::default()
    };
    kiln_otel::pprof::encode(&profile)
}

/// Files a crash can leave: staged uploads (`…#N`) and compaction scratch files (`….part`).
fn stray_files(data: &std::path::Path) -> Result<Vec<String>> {
    Ok(walk(data)?
        .into_iter()
        .filter(|p| {
            p.ends_with(".part")
                || p.rsplit_once('#')
                    .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect())
}

/// Object files (relative to the objects root).
fn object_files(root: &std::path::Path) -> Result<Vec<String>> {
    Ok(walk(root)?
        .into_iter()
        .filter(|p| p.ends_with(".kblk"))
        .map(|p| {
            p.strip_prefix(&format!("{}/", root.display()))
                .unwrap_or(&p)
                .to_owned()
        })
        .collect())
}

fn walk(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p.display().to_string());
        }
    }
    Ok(out)
}
