//! `kiln metastore rebuild`: recreates the metastore from the objects' footers.

use std::path::PathBuf;

use clap::Subcommand;
use kiln_storage::StorageConfig;

#[derive(Debug, Subcommand)]
pub enum MetastoreCommand {
    /// Recreate the index from the objects' footers (stop `kiln serve` first). Every dataset of
    /// every segment and block is registered, less those a compacted block replaced, and each
    /// write-ahead log's checkpoint is restored from the footers.
    Rebuild {
        /// The data directory `kiln serve` uses.
        #[arg(long, env = "KILN_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        /// The metastore `kiln serve` uses (a PostgreSQL database must be empty; an embedded
        /// one is set aside first). Default: embedded, under the data directory.
        #[arg(long, env = "KILN_METASTORE")]
        metastore: Option<String>,
        /// The object store `kiln serve` uses. Default: the data directory.
        #[arg(long, env = "KILN_OBJECT_STORE")]
        object_store: Option<String>,
    },
}

/// Runs `kiln metastore …`.
pub async fn run(cmd: MetastoreCommand) -> anyhow::Result<()> {
    match cmd {
        MetastoreCommand::Rebuild {
            data_dir,
            metastore,
            object_store,
        } => {
            let mut config = StorageConfig::new(&data_dir);
            config.metastore = metastore;
            config.object_store = object_store;
            let store = config.open_object_store()?;
            let embedded = match &config.metastore {
                None => Some(config.embedded_metastore_path()),
                Some(url) if !url.contains("://") => Some(PathBuf::from(url)),
                Some(_) => None,
            };
            if let Some(path) = embedded.as_ref().filter(|p| p.exists()) {
                let aside = path.with_extension(format!(
                    "redb.before-rebuild-{}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                ));
                std::fs::rename(path, &aside)?;
                println!("the old metastore is kept as {}", aside.display());
            }
            let metastore = config.open_metastore().await?;
            anyhow::ensure!(
                metastore.tenants().await?.is_empty(),
                "the metastore already holds entries: rebuild into an empty database"
            );
            let rebuilt = kiln_storage::rebuild_metastore(&store, metastore.as_ref()).await?;
            for b in &rebuilt.unreadable {
                eprintln!("unreadable object left out: {b}");
            }
            println!(
                "metastore rebuilt: {} entries, {} unreadable objects, {} write-ahead log \
                 checkpoints",
                rebuilt.entries,
                rebuilt.unreadable.len(),
                rebuilt.checkpoints.len()
            );
        }
    }
    Ok(())
}
