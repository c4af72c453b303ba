//! Where a data directory's bytes at rest go: every compacted dataset of every object under
//! DIR (L0 segments left out), each Parquet section's column chunks summed by section and
//! column, per sample row (docs/performance.md, "Bytes at rest by column").
//!
//! ```text
//! cargo run --release -p kiln-storage --example bytes -- DIR/objects [--tenant T]
//! ```

use std::collections::BTreeMap;

use bytes::Bytes;
use kiln_storage::format::meta::decode_footer;
use parquet::file::reader::{FileReader, SerializedFileReader};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(std::path::PathBuf::from) else {
        return Err("usage: bytes DIR/objects [--tenant T]".into());
    };
    let tenant = args
        .iter()
        .position(|a| a == "--tenant")
        .and_then(|i| args.get(i + 1).cloned());
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "kblk") {
                files.push(p);
            }
        }
    }
    let mut sums: BTreeMap<String, u64> = BTreeMap::new();
    let (mut rows, mut objects, mut levels) = (0u64, 0u64, BTreeMap::<u32, u64>::new());
    for f in files {
        let data = Bytes::from(std::fs::read(&f)?);
        let Ok(metas) = decode_footer(&data, data.len() as u64) else {
            continue;
        };
        objects += 1;
        for m in metas {
            if tenant.as_ref().is_some_and(|t| *t != m.tenant) || m.level == 0 {
                continue;
            }
            rows += m.rows;
            *levels.entry(m.level).or_default() += 1;
            *sums.entry("symbols".into()).or_default() += m.symbols.size;
            let mut sections = vec![("samples".to_string(), m.samples)];
            for r in &m.rollups {
                sections.push((format!("rollup {}", r.resolution_nanos), r.section));
            }
            for (name, s) in sections {
                let bytes = data.slice(s.offset as usize..(s.offset + s.size) as usize);
                let reader = SerializedFileReader::new(bytes)?;
                let md = reader.metadata();
                let mut columns = 0;
                for rg in md.row_groups() {
                    for c in rg.columns() {
                        columns += c.compressed_size() as u64;
                        *sums
                            .entry(format!("{name} {}", c.column_path()))
                            .or_default() += c.compressed_size() as u64;
                    }
                }
                *sums.entry(format!("{name} (rest)")).or_default() += s.size - columns;
            }
        }
    }
    let total: u64 = sums.values().sum();
    println!("objects {objects}, datasets by level {levels:?}, rows {rows}");
    for (k, v) in &sums {
        println!("{k:50} {:8.4} B/row {v:>12}", *v as f64 / rows as f64);
    }
    println!(
        "{:50} {:8.4} B/row {total:>12}",
        "all",
        total as f64 / rows as f64
    );
    Ok(())
}
