//! Every real profile in `../shared/corpus/pprof/` either ingests with the stored total equal to
//! the normalized pprof total of each sample type, or (only the invalid ones) is refused with a
//! 4xx that says why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{Kiln, corpus_dir, find_type, pprof_totals};

fn pprof_files() -> Option<Vec<PathBuf>> {
    let dir = corpus_dir()?.join("pprof");
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    Some(files)
}

#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn corpus_profiles_ingest_with_exact_totals() -> Result<()> {
    let files = pprof_files().context("../shared/corpus/pprof is not readable")?;
    ensure!(
        files.len() >= 20,
        "expected the whole corpus, found {} files",
        files.len()
    );
    let kiln = Kiln::start(&[])?;
    let (mut ingested, mut refused) = (0, 0);
    for (i, path) in files.iter().enumerate() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let tenant = format!("corpus-{i}");
        let body = std::fs::read(path)?;
        let expected = pprof_totals(&body);
        let (status, text) = kiln.ingest(
            &tenant,
            "name=corpus-app&format=pprof",
            body,
            &[("Content-Type", "application/octet-stream")],
        )?;
        match expected {
            Err(decode_error) => {
                // Not even decodable as a pprof protobuf: must be refused, with a reason.
                ensure!(
                    (400..500).contains(&status),
                    "{name}: {status} for an undecodable profile"
                );
                ensure!(
                    text.contains("message"),
                    "{name}: no error message in {text}"
                );
                eprintln!("{name}: refused with {status} ({text}); decoder says {decode_error}");
                kiln.assert_tenant_empty(&tenant)?;
                refused += 1;
            }
            Ok(totals) => {
                ensure!(status == 200, "{name}: {status} {text}");
                let types = kiln.profile_types(&tenant)?;
                let mut sent: BTreeMap<(String, String), i64> = BTreeMap::new();
                for (k, v) in totals {
                    *sent.entry(k).or_insert(0) += v;
                }
                for ((ty, unit), total) in &sent {
                    if *total == 0 {
                        continue;
                    }
                    let pt = find_type(&types, ty, unit).with_context(|| {
                        format!("{name}: no profile type {ty}/{unit} in {types:?}")
                    })?;
                    let fg = kiln.flamegraph(&tenant, &pt.id, "{}")?;
                    ensure!(
                        fg.total == *total,
                        "{name}: {}: stored {} != normalized pprof total {}",
                        pt.id,
                        fg.total,
                        total
                    );
                }
                ingested += 1;
            }
        }
    }
    eprintln!("corpus: {ingested} ingested, {refused} refused");
    ensure!(
        refused <= 1,
        "only the invalid UTF-8 profile may be refused"
    );
    // Tenant walls: a tenant that never wrote sees none of it.
    kiln.assert_tenant_empty("corpus-outsider")?;
    Ok(())
}
