//! The real binary on the object stores users run (the test command's servers: moto's and
//! s3rver's S3, Microsoft's Azurite), configured as a user configures it: `--object-store` with a
//! URL and `KILN_AWS_…` / `KILN_AZURE_…` variables naming the endpoint and credentials. Each
//! takes a folded upload (no spool: acknowledged only once the store holds it), answers the flame graph exactly, keeps it
//! across a restart (the data is in the store), and shows another tenant nothing.

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn kiln_runs_on_each_object_store_users_run() -> Result<()> {
    for (name, (url, options)) in kiln_storage::testing::store_locations() {
        let env: Vec<(String, String)> = options
            .iter()
            .map(|(k, v)| (format!("KILN_{}", k.to_ascii_uppercase()), v.clone()))
            .collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut kiln = Kiln::start_with_env(
            &[
                "--auth",
                "trusted-header",
                "--object-store",
                &url,
                "--spool-max-bytes",
                "0",
            ],
            &env,
        )?;
        let (status, body) = kiln.ingest(
            "store-a",
            "name=shop.cpu&from=now",
            b"main;checkout;pay 30\nmain;idle 10\n".to_vec(),
            &[],
        )?;
        ensure!(status == 200, "{name}: {status} {body}");
        let fg = kiln.flamegraph("store-a", CPU, "{}")?;
        ensure!(fg.total == 400_000_000, "{name}: total {}", fg.total);
        kiln.restart()?;
        let fg = kiln.flamegraph("store-a", CPU, "{}")?;
        ensure!(
            fg.total == 400_000_000,
            "{name}: after a restart {}",
            fg.total
        );
        ensure!(
            fg.names.iter().any(|n| n == "pay"),
            "{name}: {:?}",
            fg.names
        );
        kiln.assert_tenant_empty("store-b")?;
    }
    Ok(())
}
