//! What a tenant may do: the limits of the tenant file (`--tenants`), its `[defaults]` and
//! `[tenants.<id>]` sections, parsed and checked (the format is in [`super`]).

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::time::parse_duration_secs;

/// A duration written as `"31d"`, `"24h"`, `"90s"` or a number of seconds; 0 means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Secs(pub u64);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Secs(n)),
            Raw::S(s) => parse_duration_secs(&s).map(Secs).ok_or_else(|| {
                serde::de::Error::custom(format!("invalid duration {s:?} (like 30d, 12h, 90s)"))
            }),
        }
    }
}

/// The limits of one tenant. Defaults are Pyroscope's where it has one (see
/// `docs/configuration.md` for the differences).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Decompressed ingest bytes per second (token bucket refill); 0 = unlimited.
    pub ingest_rate_bytes: u64,
    /// Bucket size: how far above the rate a burst may go.
    pub ingest_burst_bytes: u64,
    /// Largest request body, as sent (413).
    pub max_body_bytes: usize,
    /// Largest profile once decompressed (413).
    pub max_decompressed_bytes: usize,
    /// Samples in one profile (400 above it); 0 = unlimited.
    pub max_samples_per_profile: usize,
    pub max_label_names_per_series: usize,
    pub max_label_name_length: usize,
    pub max_label_value_length: usize,
    /// Deeper stacks are truncated, keeping the root side.
    pub max_stack_depth: usize,
    /// Distinct series a tenant may have (429 for new series above it); 0 = unlimited.
    pub max_series: usize,
    /// How long data is kept; 0 = forever.
    pub retention: Secs,
    /// Longest time range one query may cover; 0 = unlimited.
    pub max_query_range: Secs,
    /// Flame graph nodes when a query names none.
    pub max_flamegraph_nodes_default: i64,
    /// Largest `max_nodes` a query may ask for.
    pub max_flamegraph_nodes_max: i64,
    /// Queries of this tenant running at once; more wait up to 10 s, then get 429.
    pub max_concurrent_queries: usize,
    /// Ad-hoc profiles (the Drilldown app's uploads) kept; an upload past it removes the
    /// oldest. 0 = unlimited.
    pub max_adhoc_profiles: usize,
    /// Largest debug file one upload may be (413).
    pub max_debuginfo_file_bytes: u64,
    /// Debug files a tenant may keep, in bytes (413 for an upload past it).
    pub max_debuginfo_bytes: u64,
    /// Bytes one debug file's compressed sections may inflate to in memory, within 32 times the
    /// file's size (413 past it, before anything is inflated).
    pub max_debuginfo_inflated_bytes: u64,
    /// Debug-file uploads of the tenant one process runs at once (429 past it).
    pub max_debuginfo_uploads: usize,
    /// Recording rules a tenant may make through the API (provisioned ones not counted).
    pub max_recording_rules: usize,
    /// Output series the tenant's recording rules may have in all; contributions that would
    /// start one more are dropped and counted.
    pub max_recording_series: usize,
    /// Where the tenant's recording rules' samples go (Prometheus remote write); empty: the
    /// server's `--remote-write-url`.
    pub remote_write_url: String,
    /// Recording rules of the tenant file, read-only through the API.
    pub recording_rules: Vec<ProvisionedRule>,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            ingest_rate_bytes: 4 << 20,
            ingest_burst_bytes: 2 << 20,
            max_body_bytes: 256 << 20,
            max_decompressed_bytes: 64 << 20,
            max_samples_per_profile: 16_000,
            max_label_names_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            max_stack_depth: 1000,
            max_series: 5000,
            retention: Secs(31 * 86_400),
            max_query_range: Secs(0),
            max_flamegraph_nodes_default: 8192,
            max_flamegraph_nodes_max: 1 << 20,
            max_concurrent_queries: 16,
            max_adhoc_profiles: 100,
            max_debuginfo_file_bytes: 1 << 30,
            max_debuginfo_bytes: 8 << 30,
            max_debuginfo_inflated_bytes: kiln_symbolize::service::DEFAULT_MAX_INFLATED_BYTES,
            max_debuginfo_uploads: 2,
            max_recording_rules: 25,
            max_recording_series: 10_000,
            remote_write_url: String::new(),
            recording_rules: Vec::new(),
        }
    }
}

impl TenantLimits {
    /// The normalizer's limits.
    pub fn normalize(&self) -> kiln_otel::NormalizeLimits {
        kiln_otel::NormalizeLimits {
            max_stack_depth: self.max_stack_depth,
            max_samples: self.max_samples_per_profile,
            labels: kiln_otel::labels::LabelLimits {
                max_label_names_per_series: self.max_label_names_per_series,
                max_label_name_length: self.max_label_name_length,
                max_label_value_length: self.max_label_value_length,
            },
            ..Default::default()
        }
    }
}

/// The tenant file, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantConfig {
    pub defaults: TenantLimits,
    pub tenants: HashMap<String, TenantLimits>,
}

impl TenantConfig {
    /// Parses the TOML, over `base` defaults (built-in defaults with command-line overrides).
    pub fn parse(text: &str, base: &toml::Table) -> anyhow::Result<Self> {
        let mut doc: toml::Table = toml::from_str(text)?;
        for key in doc.keys() {
            anyhow::ensure!(
                key == "defaults" || key == "tenants",
                "unknown section {key:?}: use [defaults] and [tenants.<id>]"
            );
        }
        let mut defaults = toml::Table::try_from(TenantLimits::default())?;
        if let Some(toml::Value::Table(d)) = doc.remove("defaults") {
            defaults.extend(d);
        }
        defaults.extend(base.clone());
        let parsed_defaults: TenantLimits = toml::Value::Table(defaults.clone())
            .try_into()
            .map_err(|e| anyhow::anyhow!("[defaults]: {e}"))?;
        let mut tenants = HashMap::new();
        if let Some(toml::Value::Table(ts)) = doc.remove("tenants") {
            for (id, v) in ts {
                crate::auth::validate_tenant(&id)
                    .map_err(|e| anyhow::anyhow!("[tenants.{id}]: {}", e.message))?;
                let toml::Value::Table(over) = v else {
                    anyhow::bail!("[tenants.{id}] must be a table");
                };
                let mut merged = defaults.clone();
                merged.extend(over);
                let limits: TenantLimits = toml::Value::Table(merged)
                    .try_into()
                    .map_err(|e| anyhow::anyhow!("[tenants.{id}]: {e}"))?;
                tenants.insert(id, limits);
            }
        }
        check_rules("[defaults]", &parsed_defaults)?;
        for (id, limits) in &tenants {
            check_rules(&format!("[tenants.{id}]"), limits)?;
        }
        Ok(Self {
            defaults: parsed_defaults,
            tenants,
        })
    }
}

/// Refuses a tenant file whose recording rules would not evaluate.
fn check_rules(section: &str, limits: &TenantLimits) -> anyhow::Result<()> {
    for (i, p) in limits.recording_rules.iter().enumerate() {
        p.rule().compile().map_err(|e| {
            anyhow::anyhow!("{section}: recording rule {i} ({:?}): {e}", p.metric_name)
        })?;
    }
    Ok(())
}

/// A recording rule as the tenant file writes it (`[[tenants.<id>.recording_rules]]`); the
/// recording rules' engine makes it a rule (`crate::recording::rules`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProvisionedRule {
    /// Empty: an id derived from the rule (as Pyroscope derives it), stable across restarts.
    pub id: String,
    pub metric_name: String,
    pub matchers: Vec<String>,
    pub group_by: Vec<String>,
    pub external_labels: std::collections::BTreeMap<String, String>,
    pub function_name: String,
}
