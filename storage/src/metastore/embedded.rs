//! Embedded metastore on redb: one file under the data directory, fsynced on every commit, with
//! an in-memory index rebuilt at start-up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{BlockMeta, Metastore};
use crate::{Error, Result};

const BLOCKS: TableDefinition<'_, (&str, i64, &str), &[u8]> = TableDefinition::new("blocks");

/// The single-binary metastore.
#[derive(Debug)]
pub struct EmbeddedMetastore {
    db: Arc<Database>,
    path: PathBuf,
    index: RwLock<HashMap<String, Vec<Arc<BlockMeta>>>>,
}

fn err(e: impl std::fmt::Display) -> Error {
    Error::Metastore(e.to_string())
}

impl EmbeddedMetastore {
    /// Opens (or creates) the metastore file and loads the index.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let db = Database::create(path).map_err(err)?;
        {
            let tx = db.begin_write().map_err(err)?;
            tx.open_table(BLOCKS).map_err(err)?;
            tx.commit().map_err(err)?;
        }
        let mut index: HashMap<String, Vec<Arc<BlockMeta>>> = HashMap::new();
        {
            let tx = db.begin_read().map_err(err)?;
            let table = tx.open_table(BLOCKS).map_err(err)?;
            for row in table.iter().map_err(err)? {
                let (key, value) = row.map_err(err)?;
                let meta: BlockMeta = serde_json::from_slice(value.value()).map_err(|e| {
                    Error::Metastore(format!("block {:?} has bad metadata: {e}", key.value().2))
                })?;
                index
                    .entry(meta.tenant.clone())
                    .or_default()
                    .push(Arc::new(meta));
            }
        }
        Ok(Self {
            db: Arc::new(db),
            path: path.to_owned(),
            index: RwLock::new(index),
        })
    }

    /// The metastore file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait::async_trait]
impl Metastore for EmbeddedMetastore {
    async fn add_block(&self, block: BlockMeta) -> Result<()> {
        let db = Arc::clone(&self.db);
        let value = serde_json::to_vec(&block).map_err(err)?;
        let key = (block.tenant.clone(), block.partition(), block.id.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let tx = db.begin_write().map_err(err)?;
            {
                let mut table = tx.open_table(BLOCKS).map_err(err)?;
                table
                    .insert((key.0.as_str(), key.1, key.2.as_str()), value.as_slice())
                    .map_err(err)?;
            }
            tx.commit().map_err(err)
        })
        .await
        .map_err(err)??;
        self.index
            .write()
            .expect("index lock poisoned")
            .entry(block.tenant.clone())
            .or_default()
            .push(Arc::new(block));
        Ok(())
    }

    async fn query_blocks(
        &self,
        tenant: &str,
        start_nanos: i64,
        end_nanos: i64,
    ) -> Result<Vec<Arc<BlockMeta>>> {
        let index = self.index.read().expect("index lock poisoned");
        Ok(index
            .get(tenant)
            .map(|blocks| {
                blocks
                    .iter()
                    .filter(|b| b.overlaps(start_nanos, end_nanos))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delete_blocks(&self, tenant: &str, ids: &[String]) -> Result<()> {
        let doomed: Vec<(i64, String)> = {
            let index = self.index.read().expect("index lock poisoned");
            index
                .get(tenant)
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter(|b| ids.contains(&b.id))
                        .map(|b| (b.partition(), b.id.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let db = Arc::clone(&self.db);
        let t = tenant.to_owned();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let tx = db.begin_write().map_err(err)?;
            {
                let mut table = tx.open_table(BLOCKS).map_err(err)?;
                for (partition, id) in &doomed {
                    table
                        .remove((t.as_str(), *partition, id.as_str()))
                        .map_err(err)?;
                }
            }
            tx.commit().map_err(err)
        })
        .await
        .map_err(err)??;
        let mut index = self.index.write().expect("index lock poisoned");
        if let Some(blocks) = index.get_mut(tenant) {
            blocks.retain(|b| !ids.contains(&b.id));
            if blocks.is_empty() {
                index.remove(tenant);
            }
        }
        Ok(())
    }

    async fn tenants(&self) -> Result<Vec<String>> {
        let mut t: Vec<String> = self
            .index
            .read()
            .expect("index lock poisoned")
            .keys()
            .cloned()
            .collect();
        t.sort();
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::BLOCK_FORMAT_VERSION;

    fn block(tenant: &str, id: &str, min: i64, max: i64) -> BlockMeta {
        BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id: id.into(),
            tenant: tenant.into(),
            shard: 0,
            compaction_level: 0,
            min_time_nanos: min,
            max_time_nanos: max,
            series: vec![],
            samples_path: format!("{id}/samples.parquet"),
            samples_bytes: 1,
            symbols_path: format!("{id}/symbols.bin"),
            symbols_bytes: 1,
            rows: 1,
            profiles: 1,
        }
    }

    #[tokio::test]
    async fn blocks_survive_reopen_and_stay_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        {
            let m = EmbeddedMetastore::open(&path).unwrap();
            m.add_block(block("a", "1", 100, 200)).await.unwrap();
            m.add_block(block("a", "2", 300, 400)).await.unwrap();
            m.add_block(block("b", "3", 100, 400)).await.unwrap();
        }
        let m = EmbeddedMetastore::open(&path).unwrap();
        let ids = |v: Vec<Arc<BlockMeta>>| {
            let mut ids: Vec<String> = v.iter().map(|b| b.id.clone()).collect();
            ids.sort();
            ids
        };
        assert_eq!(ids(m.query_blocks("a", 0, 1000).await.unwrap()), ["1", "2"]);
        assert_eq!(
            ids(m.query_blocks("a", 250, 300).await.unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(
            ids(m.query_blocks("a", 200, 301).await.unwrap()),
            ["1", "2"]
        );
        assert_eq!(ids(m.query_blocks("b", 0, 1000).await.unwrap()), ["3"]);
        assert!(m.query_blocks("c", 0, 1000).await.unwrap().is_empty());
        assert_eq!(m.tenants().await.unwrap(), ["a", "b"]);
        m.delete_blocks("a", &["1".to_string()]).await.unwrap();
        m.delete_blocks("b", &["3".to_string()]).await.unwrap();
        drop(m);
        let m = EmbeddedMetastore::open(&path).unwrap();
        assert_eq!(ids(m.query_blocks("a", 0, 1000).await.unwrap()), ["2"]);
        assert_eq!(m.tenants().await.unwrap(), ["a"], "deletes are durable");
    }
}
