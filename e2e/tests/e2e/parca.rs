//! `kiln upload` against the real `kiln`: the Parca agent's offline files, written per the
//! agent's format (v1 two-frame and v2 one-frame batches, plain and zstd, a torn tail, a file of
//! no batches), upload with exactly their totals; an upload killed with SIGKILL and run again
//! loses and duplicates nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use kiln_e2e::{Kiln, kiln_bin};
use kiln_otel::parca::testing::*;

const CPU: &str = "parca_agent:samples:count:cpu:nanoseconds";
const COMMS: [&str; 3] = ["api", "db", "worker"];

/// A batch's samples: every comm, a few stacks shared with other batches.
fn batch_samples(seed: u64) -> Vec<TestSample> {
    let mut out = Vec::new();
    for (c, comm) in COMMS.iter().enumerate() {
        for k in 0..3u64 {
            let leaf = format!("fn_{}", (seed + k) % 5);
            out.push(TestSample {
                labels: vec![
                    ("comm".into(), (*comm).into()),
                    ("thread_id".into(), format!("{k}")),
                ],
                stack: vec![
                    TestFrame::function(&leaf),
                    TestFrame::function(&format!("{comm}_main")),
                ],
                value: (seed % 7 + 1) as i64 * (c as i64 + 1) + k as i64,
                timestamp: 1_700_000_000_000_000_000 + seed as i64 * 1_000_000_000,
            });
        }
    }
    out
}

/// A file's batches in one layout; v1 batches log only the stacks the file has not logged yet,
/// as the agent does.
fn batches(v2: bool, seeds: std::ops::Range<u64>) -> (Vec<PadataBatch>, Vec<TestSample>) {
    let mut logged: Vec<Vec<TestFrame>> = Vec::new();
    let mut all = Vec::new();
    let mut out = Vec::new();
    for seed in seeds {
        let samples = batch_samples(seed);
        all.extend(samples.clone());
        if v2 {
            out.push(PadataBatch::V2(ipc(
                &v2_sample_record(&samples, &TestType::default()),
                seed % 2 == 0,
            )));
            continue;
        }
        let mut new = Vec::new();
        for s in &samples {
            if !logged.contains(&s.stack) && !new.contains(&s.stack) {
                new.push(s.stack.clone());
            }
        }
        logged.extend(new.clone());
        out.push(PadataBatch::V1 {
            samples: ipc(&v1_sample_record(&samples, &TestType::default()), false),
            locations: ipc(&v1_locations_record(&new), false),
        });
    }
    (out, all)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    if name.ends_with(".zst") {
        std::fs::write(dir.join(name), zstd::encode_all(bytes, 3)?)?;
    } else {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

fn expected(samples: &[TestSample]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in samples {
        *out.entry(s.labels[0].1.clone()).or_insert(0) += s.value;
    }
    out
}

fn totals(kiln: &Kiln, tenant: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for comm in COMMS {
        let fg = kiln.flamegraph(tenant, CPU, &format!("{{comm=\"{comm}\"}}"))?;
        if fg.total > 0 {
            out.insert(comm.to_owned(), fg.total);
        }
    }
    Ok(out)
}

fn upload(kiln: &Kiln, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(kiln_bin());
    cmd.args(["upload", "--dir"])
        .arg(dir)
        .args(["--url", &kiln.url(""), "--tenant", "acme"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn leftovers(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

#[test]
fn parca_offline_files_upload_with_exact_totals() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let dir = tempfile::tempdir()?;
    let mut all = Vec::new();
    // v1, plain, a torn tail.
    let (b, s) = batches(false, 0..3);
    write(dir.path(), "1700000000-11.padata", &padata(&b, true))?;
    all.extend(s);
    // v2, zstd, a torn tail.
    let (b, s) = batches(true, 3..5);
    write(dir.path(), "1700000600-11.padata.zst", &padata(&b, true))?;
    all.extend(s);
    // No batches (the agent stopped before its first).
    write(dir.path(), "1700001200-12.padata", &padata(&[], true))?;
    // v1, zstd.
    let (b, s) = batches(false, 5..9);
    write(dir.path(), "1700001800-12.padata.zst", &padata(&b, false))?;
    all.extend(s);
    // v2, plain.
    let (b, s) = batches(true, 9..10);
    write(dir.path(), "1700002400-13.padata", &padata(&b, false))?;
    all.extend(s);

    let out = upload(&kiln, dir.path(), &[]).output()?;
    ensure!(
        out.status.success(),
        "kiln upload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(stdout.contains("uploaded 5 files, 10 batches"), "{stdout}");
    ensure!(
        leftovers(dir.path())?.is_empty(),
        "{:?}",
        leftovers(dir.path())?
    );
    assert_eq!(totals(&kiln, "acme")?, expected(&all));
    kiln.assert_tenant_empty("other")?;

    // Nothing left: a second run uploads nothing.
    let out = upload(&kiln, dir.path(), &[]).output()?;
    ensure!(out.status.success());
    ensure!(String::from_utf8_lossy(&out.stdout).contains("uploaded 0 files"));
    assert_eq!(totals(&kiln, "acme")?, expected(&all));
    Ok(())
}

#[test]
fn parca_interrupted_upload_resumes_without_duplicates() -> Result<()> {
    interrupted_upload_resumes(&Kiln::start(&[])?, 20, [300, 530])
}

/// `kiln upload` to `kiln` (a process, or a load balancer in front of several) at `rate`
/// batches a second, killed after each of `kills_ms`, then run to the end: every batch stored
/// once, for its tenant only.
pub(super) fn interrupted_upload_resumes(kiln: &Kiln, rate: u32, kills_ms: [u64; 2]) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut all = Vec::new();
    for f in 0..6u64 {
        let (b, s) = batches(f % 2 == 1, f * 10..f * 10 + 4);
        let name = format!(
            "{}-{f}.padata{}",
            1_700_000_000 + f * 600,
            if f % 3 == 0 { ".zst" } else { "" }
        );
        write(dir.path(), &name, &padata(&b, f == 2))?;
        all.extend(s);
    }
    // 24 batches: killed twice on the way, at different moments.
    let rate = rate.to_string();
    for wait in kills_ms.map(Duration::from_millis) {
        let mut child = upload(kiln, dir.path(), &["--rate", &rate]).spawn()?;
        let started = Instant::now();
        std::thread::sleep(wait);
        // Killed once it has made progress (a busy machine may start it late), before it ends.
        let progressed =
            |left: &[String]| left.iter().any(|n| n.ends_with(".progress")) || left.len() < 6;
        while !progressed(&leftovers(dir.path())?) && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(status) = child.try_wait()? {
            let out = child.wait_with_output()?;
            bail!(
                "the upload ended ({status}) before it was killed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        child.kill()?;
        let killed = child.wait_with_output()?;
        let left = leftovers(dir.path())?;
        ensure!(
            progressed(&left),
            "no progress within 5 s: {left:?}; kiln upload said: {}",
            String::from_utf8_lossy(&killed.stderr)
        );
    }
    let out = upload(kiln, dir.path(), &[]).output()?;
    ensure!(
        out.status.success(),
        "kiln upload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        leftovers(dir.path())?.is_empty(),
        "{:?}",
        leftovers(dir.path())?
    );
    ensure!(
        totals(kiln, "acme")? == expected(&all),
        "duplicates or losses"
    );
    kiln.assert_tenant_empty("other")?;
    Ok(())
}
