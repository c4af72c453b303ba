//! Scale-out with the real binary: one `kiln --roles ingest,query` and one `kiln --roles
//! compact` share a PostgreSQL metastore and an S3 bucket (the test command's servers). Their
//! answers equal a single process's on the same input, before and after compaction; a fresh
//! `kiln` on the same metastore and bucket answers the same; other tenants see nothing.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use kiln_e2e::{Kiln, kiln_bin};
use kiln_proto::querier::v1 as q;
use kiln_storage::metastore::postgres::{Postgres, PostgresConfig};
use kiln_storage::metastore::{BlockQuery, Metastore};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const PROFILES: i64 = 24;

/// The profiles every process gets: tenant alpha, two services, one profile every 10 s; and a
/// few for tenant beta (4 of 7 samples). The cluster test sends them too.
pub(super) fn ingest_all(k: &Kiln) -> Result<()> {
    for i in 0..PROFILES {
        let service = if i % 3 == 0 { "db" } else { "api" };
        let body = format!("main;handle;work{} {}\nmain;idle 1\n", i % 5, 2 + i);
        let from = 1_700_000_000 + i * 10;
        let (s, t) = k.ingest(
            "alpha",
            &format!("name={service}.cpu%7Bregion%3Deu%7D&from={from}"),
            body.into_bytes(),
            &[],
        )?;
        ensure!(s == 200, "ingest {i}: {s} {t}");
        if i % 6 == 0 {
            let (s, t) = k.ingest(
                "beta",
                &format!("name=other.cpu&from={from}"),
                b"main;beta_only 7\n".to_vec(),
                &[],
            )?;
            ensure!(s == 200, "ingest beta {i}: {s} {t}");
        }
    }
    Ok(())
}

/// What the queries answer, for comparison across processes.
#[derive(Debug, PartialEq)]
pub(super) struct Answers {
    pub(super) all: q::FlameGraph,
    pub(super) api: q::FlameGraph,
    pub(super) series: q::SelectSeriesResponse,
    pub(super) beta: q::FlameGraph,
}

pub(super) fn answers(k: &Kiln) -> Result<Answers> {
    let series = k.connect(
        "alpha",
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
    Ok(Answers {
        all: k.flamegraph("alpha", CPU, "{}")?,
        api: k.flamegraph("alpha", CPU, r#"{service_name="api"}"#)?,
        series,
        beta: k.flamegraph("beta", CPU, "{}")?,
    })
}

#[test]
fn roles_share_postgres_and_s3() -> Result<()> {
    // The metastore client is async; the harness is blocking.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg = rt.block_on(kiln_storage::testing::postgres_database());
    let (s3_url, s3_options) = kiln_storage::testing::s3_location();
    // The S3 settings as an operator gives them: object_store's variables, one of them in its
    // KILN_ form.
    let mut env: Vec<(String, String)> = s3_options
        .iter()
        .map(|(k, v)| {
            let name = k.to_ascii_uppercase();
            if name == "AWS_ENDPOINT_URL" {
                (format!("KILN_{name}"), v.clone())
            } else {
                (name, v.clone())
            }
        })
        .collect();
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let shared = [
        "--auth",
        "trusted-header",
        "--metastore",
        pg.as_str(),
        "--object-store",
        s3_url.as_str(),
        "--compaction-levels",
        "4:1h,3:1h,2:1h",
        "--delete-delay-secs",
        "0",
        "--upkeep-interval-ms",
        "100",
    ];
    let with = |roles: &'static str| {
        let mut flags = shared.to_vec();
        flags.extend(["--roles", roles]);
        flags
    };

    let single = Kiln::start(&["--compaction", "false"])?;
    let mut front = Kiln::start_with_env(&with("ingest,query"), &env)?;
    ingest_all(&single)?;
    ingest_all(&front)?;
    let want = answers(&single)?;
    ensure!(want.all.total > 0 && want.beta.total == 7 * 4 * 10_000_000);
    ensure!(answers(&front)? == want, "before compaction");

    // Nothing compacts until the compactor runs.
    let metastore = rt.block_on(Postgres::connect(&PostgresConfig::new(pg.clone())))?;
    let blocks = |tenant: &str| {
        rt.block_on(metastore.query_blocks(BlockQuery::all(tenant)))
            .expect("a metastore lookup")
    };
    let l0 = blocks("alpha");
    ensure!(
        l0.len() >= PROFILES as usize && l0.iter().all(|b| b.level == 0),
        "{} blocks",
        l0.len()
    );

    let mut compactor = Kiln::start_with_env(&with("compact"), &env)?;
    // The compactor serves no ingest or query API.
    let (s, t) = compactor.ingest("alpha", "name=x.cpu", b"main 1\n".to_vec(), &[])?;
    ensure!(s == 404 && t.contains("compact"), "{s} {t}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alpha = blocks("alpha");
        let jobs = rt.block_on(metastore.jobs())?;
        if alpha.len() <= 4 && alpha.iter().all(|b| b.level > 0) && jobs.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "compaction did not catch up: {} blocks, levels {:?}\n{}",
                alpha.len(),
                alpha.iter().map(|b| b.level).collect::<Vec<_>>(),
                compactor.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(answers(&front)? == want, "after compaction");

    front.stop()?;
    compactor.stop()?;
    let fresh = Kiln::start_with_env(&shared, &env)?;
    ensure!(
        answers(&fresh)? == want,
        "a fresh process on the same metastore and bucket"
    );
    fresh.assert_tenant_empty("gamma")?;
    let beta = fresh.flamegraph("beta", CPU, "{}")?;
    ensure!(
        !beta
            .names
            .iter()
            .any(|n| n.starts_with("work") || n == "handle"),
        "beta sees alpha's frames: {:?}",
        beta.names
    );
    drop(fresh);

    // A lost database is rebuilt from the bucket's footers into an empty one.
    let rebuilt = rt.block_on(kiln_storage::testing::postgres_database());
    let out = std::process::Command::new(kiln_bin())
        .args(["metastore", "rebuild", "--data-dir"])
        .arg(single.data_dir.path().join("unused"))
        .args(["--metastore", &rebuilt, "--object-store", &s3_url])
        .envs(env.iter().copied())
        .output()?;
    ensure!(
        out.status.success(),
        "rebuild: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut flags = shared.to_vec();
    flags[3] = rebuilt.as_str();
    let restored = Kiln::start_with_env(&flags, &env)?;
    ensure!(
        answers(&restored)? == want,
        "after rebuilding the metastore from the bucket"
    );
    restored.assert_tenant_empty("gamma")?;
    Ok(())
}

/// Without a spool (`--spool-max-bytes 0`), an object store that cannot be reached is retried
/// for `--object-store-retry-timeout-secs`, then the write is refused with 503 and
/// `Retry-After`, never acknowledged; reads of the same tenant find nothing. (With the spool,
/// see `spool.rs`.)
#[test]
fn an_unreachable_bucket_is_answered_503() -> Result<()> {
    let pg = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(kiln_storage::testing::postgres_database());
    let dead = format!("http://127.0.0.1:{}", kiln_e2e::free_port());
    let env = [
        ("AWS_ENDPOINT_URL", dead.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let k = Kiln::start_with_env(
        &[
            "--auth",
            "trusted-header",
            "--metastore",
            &pg,
            "--object-store",
            "s3://nowhere/kiln",
            "--object-store-retry-timeout-secs",
            "1",
            "--spool-max-bytes",
            "0",
        ],
        &env,
    )?;
    let resp = k
        .http()
        .post(k.url("/ingest?name=svc.cpu&from=1700000000"))
        .header("X-Scope-OrgID", "alpha")
        .body("main;a 3\n")
        .send()?;
    ensure!(resp.status().as_u16() == 503, "{}", resp.status());
    ensure!(
        resp.headers().contains_key("retry-after"),
        "{:?}",
        resp.headers()
    );
    k.assert_tenant_empty("alpha")?;
    Ok(())
}
