//! Kiln profiles itself (`--self-profile`): its own CPU and heap profiles land in the configured
//! tenant as `service_name="kiln"`, written through its own ingest path, and no other tenant
//! sees them.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;
use kiln_proto::types::v1 as t;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const HEAP: &str = "memory:inuse_space:bytes:space:bytes";
const KILN: &str = r#"{service_name="kiln"}"#;

/// Keeps the server busy for a while so its profile has samples.
fn load(kiln: &Kiln, tenant: &str, for_how_long: Duration) -> Result<()> {
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < for_how_long {
        let body: String = (0..200)
            .map(|k| format!("main;handler_{};work_{} {}\n", k % 17, k, 1 + k % 5))
            .collect();
        let (s, text) = kiln.ingest(
            tenant,
            &format!("name=shop.cpu&from={}", 1_700_000_000 + i),
            body.into_bytes(),
            &[],
        )?;
        ensure!(s == 200, "{s} {text}");
        i += 1;
    }
    Ok(())
}

#[test]
fn kiln_profiles_itself_into_its_tenant_only() -> Result<()> {
    let kiln = Kiln::start(&[
        "--self-profile-tenant",
        "ops",
        "--self-profile-interval-secs",
        "1",
    ])?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let fg = loop {
        load(&kiln, "team-a", Duration::from_secs(2))?;
        let fg = kiln.flamegraph("ops", CPU, KILN)?;
        if fg.names.iter().any(|n| n.contains("kiln_")) || Instant::now() > deadline {
            break fg;
        }
    };
    ensure!(fg.total > 0, "no CPU time in Kiln's own profile");
    ensure!(
        fg.names.iter().any(|n| n.contains("kiln_")),
        "Kiln's own functions are in its flame graph: {:?}",
        &fg.names[..fg.names.len().min(40)]
    );
    // The series say which process it is (its instance id): one for its CPU, one for its heap.
    let series: Vec<t::Labels> = {
        let r: kiln_proto::querier::v1::SeriesResponse = kiln.connect(
            "ops",
            "/querier.v1.QuerierService/Series",
            &kiln_proto::querier::v1::SeriesRequest {
                matchers: vec![KILN.into()],
                start: kiln_e2e::ALL_TIME.0,
                end: kiln_e2e::ALL_TIME.1,
                ..Default::default()
            },
        )?;
        r.labels_set
    };
    ensure!(
        (1..=2).contains(&series.len()),
        "CPU, and the heap once sampled: {series:?}"
    );
    // The process's instance id: by default `<hostname>:<port>` (`--instance-id`).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    let instance = format!("{}:{}", host.trim(), kiln.port);
    for s in &series {
        ensure!(
            s.labels
                .iter()
                .any(|l| l.name == "instance" && l.value == instance),
            "{s:?}"
        );
    }
    // Its heap: bytes in use by the stacks that allocated them, Kiln's own functions, not the
    // allocator's (jemalloc's frames are cut at the leaf).
    let deadline = Instant::now() + Duration::from_secs(30);
    let heap = loop {
        let fg = kiln.flamegraph("ops", HEAP, KILN)?;
        if fg.total > 0 || Instant::now() > deadline {
            break fg;
        }
        load(&kiln, "team-a", Duration::from_secs(1))?;
    };
    ensure!(heap.total > 0, "no bytes in Kiln's own heap profile");
    ensure!(
        heap.names.iter().any(|n| n.contains("kiln_")),
        "Kiln's own functions hold its memory: {:?}",
        &heap.names[..heap.names.len().min(40)]
    );
    ensure!(
        !heap.names.iter().any(|n| n.starts_with("_rjem_")),
        "jemalloc's frames are cut: {:?}",
        &heap.names[..heap.names.len().min(40)]
    );
    // Tenant wall: the tenant whose traffic it served does not see it, nor does a third.
    ensure!(kiln.flamegraph("team-a", CPU, KILN)?.total == 0);
    ensure!(kiln.flamegraph("team-a", HEAP, KILN)?.total == 0);
    ensure!(
        kiln.flamegraph("team-a", CPU, r#"{service_name="shop"}"#)?
            .total
            > 0
    );
    kiln.assert_tenant_empty("other")?;
    Ok(())
}

#[test]
fn self_profiling_can_be_turned_off() -> Result<()> {
    let kiln = Kiln::start_with(&[
        "--auth",
        "none",
        "--self-profile=false",
        "--self-profile-interval-secs",
        "1",
    ])?;
    load(&kiln, "anonymous", Duration::from_secs(3))?;
    std::thread::sleep(Duration::from_millis(1500));
    ensure!(kiln.flamegraph("anonymous", CPU, KILN)?.total == 0);
    ensure!(kiln.flamegraph("anonymous", HEAP, KILN)?.total == 0);
    let types = kiln.profile_types("anonymous")?;
    ensure!(types.len() == 1, "only the ingested data: {types:?}");
    Ok(())
}
