//! Ingest, stop with SIGTERM, start again: the same query gives the same answer. Writes that are
//! in flight when SIGTERM arrives are answered and kept.

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;
use kiln_proto::querier::v1 as q;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn restart_keeps_everything_acknowledged() -> Result<()> {
    let mut kiln = Kiln::start(&[])?;
    for (tenant, body) in [("alpha", "main;a 3\nmain;b 4\n"), ("beta", "main;c 5\n")] {
        let (s, t) = kiln.ingest(
            tenant,
            "name=svc.cpu%7Bregion%3Deu%7D&from=1700000000",
            body.into(),
            &[],
        )?;
        ensure!(s == 200, "{s} {t}");
    }
    let series_req = q::SelectSeriesRequest {
        profile_type_id: CPU.into(),
        label_selector: r#"{service_name="svc"}"#.into(),
        start: 1_699_999_000_000,
        end: 1_700_001_000_000,
        step: 60.0,
        group_by: vec!["region".into()],
        ..Default::default()
    };
    let series = |k: &Kiln, tenant: &str| -> Result<q::SelectSeriesResponse> {
        k.connect(
            tenant,
            "/querier.v1.QuerierService/SelectSeries",
            &series_req,
        )
    };
    let fg_before = kiln.flamegraph("alpha", CPU, r#"{service_name="svc"}"#)?;
    let series_before = series(&kiln, "alpha")?;
    ensure!(fg_before.total == 70_000_000);
    ensure!(series_before.series.len() == 1);

    // Writes racing with SIGTERM are either answered 200 and kept, or refused (never lost).
    let port = kiln.port;
    let writer = std::thread::spawn(move || {
        let http = reqwest::blocking::Client::new();
        let mut acked = 0i64;
        for _ in 0..20 {
            let r = http
                .post(format!(
                    "http://127.0.0.1:{port}/ingest?name=late.cpu&from=1700000000"
                ))
                .header("X-Scope-OrgID", "alpha")
                .body("main;late 1\n")
                .send();
            match r {
                Ok(r) if r.status().is_success() => acked += 1,
                _ => break,
            }
        }
        acked
    });
    std::thread::sleep(std::time::Duration::from_millis(30));
    kiln.restart()?;
    let acked = writer.join().unwrap();

    let fg_after = kiln.flamegraph("alpha", CPU, r#"{service_name="svc"}"#)?;
    ensure!(fg_after == fg_before, "flame graph changed across restart");
    ensure!(
        series(&kiln, "alpha")? == series_before,
        "series changed across restart"
    );
    let late = kiln.flamegraph("alpha", CPU, r#"{service_name="late"}"#)?;
    ensure!(
        late.total == acked * 10_000_000,
        "acknowledged late writes: {acked}, stored {}",
        late.total
    );
    ensure!(kiln.flamegraph("beta", CPU, "{}")?.total == 50_000_000);
    let beta = kiln.flamegraph("beta", CPU, "{}")?;
    ensure!(
        !beta.names.iter().any(|n| n == "a" || n == "late"),
        "tenant wall: {:?}",
        beta.names
    );
    kiln.assert_tenant_empty("gamma")?;
    Ok(())
}
