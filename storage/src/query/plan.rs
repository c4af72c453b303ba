//! Stage 1, planning from the metastore: the blocks a query reaches and the series it selects
//! in each ([`QueryEngine::candidate_blocks`]), and the answers the index gives alone, without
//! reading a block: profile types, label names and values, series, profile stats, and what a
//! query would read ([`QueryEngine::analyze`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use fixedbitset::FixedBitSet;

use kiln_otel::model::ProfileType;

use super::{PROFILE_TYPE_LABEL, QueryEngine, SampleFilter};
use crate::Result;
use crate::metastore::{BlockMeta, BlockQuery};
use crate::selector::Selector;

/// Stats of a tenant's data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileStats {
    pub data_ingested: bool,
    pub oldest_nanos: i64,
    pub newest_nanos: i64,
}

/// What a query would read ([`QueryEngine::analyze`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryAnalysis {
    pub blocks: u64,
    /// Distinct series selected.
    pub series: u64,
    /// Profiles of the selected series (estimated per block from its share of rows).
    pub profiles: u64,
    /// Sample rows of the selected series.
    pub rows: u64,
    /// Bytes of the selected series' samples, and of the blocks' symbols.
    pub sample_bytes: u64,
    pub symbol_bytes: u64,
    /// Bytes of every block the range and selector reach.
    pub bytes_in_range: u64,
}

impl QueryAnalysis {
    /// Adds another query's figures (another tenant's, in a read spanning tenants).
    pub fn add(&mut self, other: &QueryAnalysis) {
        self.blocks += other.blocks;
        self.series += other.series;
        self.profiles += other.profiles;
        self.rows += other.rows;
        self.sample_bytes += other.sample_bytes;
        self.symbol_bytes += other.symbol_bytes;
        self.bytes_in_range += other.bytes_in_range;
    }
}

impl QueryEngine {
    /// The blocks a query reaches: from the metastore, or among the engine's own blocks
    /// ([`QueryEngine::over_blocks`]).
    async fn blocks(&self, query: BlockQuery<'_>) -> Result<Vec<Arc<BlockMeta>>> {
        let blocks = match &self.only {
            None => {
                self.caches.followed.touch(query.tenant, query.end_nanos);
                self.caches.query_blocks(query).await?
            }
            Some(only) => only.iter().filter(|b| query.matches(b)).cloned().collect(),
        };
        self.caches.read_fresh(&blocks).await;
        Ok(blocks)
    }

    /// The tenant's blocks in `[start, end)`, each with the series (by index) in range that
    /// match any of `selectors` (all in range when there is none), from each block's series
    /// index; blocks without one left out.
    async fn selected_series(
        &self,
        tenant: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<Vec<(Arc<BlockMeta>, FixedBitSet)>> {
        let blocks = self.blocks(BlockQuery::new(tenant, start, end)).await?;
        Ok(blocks
            .into_iter()
            .filter_map(|b| {
                let set = b.series_index().select(selectors, start, end);
                (!set.is_clear()).then_some((b, set))
            })
            .collect())
    }

    /// Series (label sets with the synthetic `__profile_type__`) of `tenant` in `[start, end)` that
    /// match any of `selectors` (all series when there is none).
    async fn matching_series(
        &self,
        tenant: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<BTreeSet<Vec<(String, String)>>> {
        let mut out = BTreeSet::new();
        for (block, set) in self.selected_series(tenant, selectors, start, end).await? {
            for i in set.ones() {
                let s = &block.series[i];
                let mut labels = s.labels.to_vec();
                labels.push((PROFILE_TYPE_LABEL.to_owned(), s.profile_type.to_string()));
                labels.sort();
                out.insert(labels);
            }
        }
        Ok(out)
    }

    /// Profile types with data in `[start, end)`.
    pub async fn profile_types(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<ProfileType>> {
        let mut ids = BTreeSet::new();
        for (block, set) in self.selected_series(tenant, &[], start, end).await? {
            ids.extend(
                block
                    .series_index()
                    .values_in(PROFILE_TYPE_LABEL, &set)
                    .map(str::to_owned),
            );
        }
        Ok(ids.iter().filter_map(|id| ProfileType::parse(id)).collect())
    }

    /// Label names of the matching series, sorted.
    pub async fn label_names(
        &self,
        tenant: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>> {
        let mut names = BTreeSet::new();
        for (block, set) in self.selected_series(tenant, selectors, start, end).await? {
            for name in block.series_index().names_in(&set) {
                if !names.contains(name) {
                    names.insert(name.to_owned());
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Values of label `name` in the matching series, sorted.
    pub async fn label_values(
        &self,
        tenant: &str,
        name: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>> {
        let mut values = BTreeSet::new();
        for (block, set) in self.selected_series(tenant, selectors, start, end).await? {
            for value in block.series_index().values_in(name, &set) {
                if !values.contains(value) {
                    values.insert(value.to_owned());
                }
            }
        }
        Ok(values.into_iter().collect())
    }

    /// Label sets of the matching series; with `label_names`, only those labels, de-duplicated.
    pub async fn series(
        &self,
        tenant: &str,
        selectors: &[Selector],
        label_names: &[String],
        start: i64,
        end: i64,
    ) -> Result<Vec<Vec<(String, String)>>> {
        let series = self.matching_series(tenant, selectors, start, end).await?;
        if label_names.is_empty() {
            return Ok(series.into_iter().collect());
        }
        let projected: BTreeSet<Vec<(String, String)>> = series
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .filter(|(k, _)| label_names.contains(k))
                    .collect()
            })
            .collect();
        Ok(projected.into_iter().collect())
    }

    /// Oldest and newest sample time of a tenant.
    /// From the metastore's partition summaries, so it costs the same whatever the data's age.
    pub async fn profile_stats(&self, tenant: &str) -> Result<ProfileStats> {
        let (parts, unregistered) = match self.caches.barrier.get() {
            None => (self.caches.metastore.partitions(tenant).await?, None),
            Some(b) => {
                b.wait(crate::caches::barrier::Scope {
                    tenant,
                    start_nanos: i64::MIN,
                    end_nanos: i64::MAX,
                })
                .await;
                let _listing = b.unregistered().listing().await;
                let parts = self.caches.metastore.partitions(tenant).await?;
                (parts, b.unregistered().time_range(tenant))
            }
        };
        let ranges = parts
            .iter()
            .map(|p| (p.min_time_nanos, p.max_time_nanos))
            .chain(unregistered);
        Ok(ranges
            .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
            .map_or_else(ProfileStats::default, |(oldest_nanos, newest_nanos)| {
                ProfileStats {
                    data_ingested: true,
                    oldest_nanos,
                    newest_nanos,
                }
            }))
    }

    /// Blocks with at least one series the filter selects, with those series' indices.
    pub(super) async fn candidate_blocks(
        &self,
        filter: &SampleFilter,
    ) -> Result<Vec<(Arc<BlockMeta>, Vec<u32>)>> {
        let blocks = self.blocks(filter.block_query()).await?;
        Ok(blocks
            .into_iter()
            .filter_map(|b| {
                let series: Vec<u32> = filter
                    .select(b.series_index())
                    .ones()
                    .map(|i| i as u32)
                    .collect();
                (!series.is_empty()).then_some((b, series))
            })
            .collect())
    }

    /// What a query would read, from the index alone (nothing is read from the object store):
    /// the blocks its range and selector reach, the series and sample rows it selects in them,
    /// and their bytes. Row and byte counts of the samples are the selected series' share of
    /// each block's.
    pub async fn analyze(&self, filter: &SampleFilter) -> Result<QueryAnalysis> {
        let mut a = QueryAnalysis::default();
        let mut series = BTreeSet::new();
        for (block, selected) in self.candidate_blocks(filter).await? {
            a.blocks += 1;
            a.bytes_in_range += block.object_size;
            a.symbol_bytes += block.symbols.size;
            let rows: u64 = selected
                .iter()
                .map(|&i| block.series[i as usize].rows)
                .sum();
            a.rows += rows;
            if block.rows > 0 {
                a.sample_bytes +=
                    (block.samples.size as u128 * rows as u128 / block.rows as u128) as u64;
                a.profiles += (block.profiles as u128 * rows as u128 / block.rows as u128) as u64;
            }
            for i in selected {
                let s = &block.series[i as usize];
                series.insert((s.profile_type.clone(), s.labels.clone()));
            }
        }
        a.series = series.len() as u64;
        Ok(a)
    }
}
