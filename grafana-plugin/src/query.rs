//! The query and datasource settings Grafana sends: `DataQuery.json` and the instance settings.

use serde::Deserialize;

/// One panel query (`DataQuery.json`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct KilnQuery {
    /// `profile`, `metrics` or `both` (the default).
    pub query_type: String,
    pub profile_type_id: String,
    pub label_selector: String,
    pub group_by: Vec<String>,
    pub max_nodes: Option<i64>,
    /// Span ids (16 hex digits) from traces-to-profiles.
    pub span_selector: Vec<String>,
    pub limit: Option<i64>,
    /// Tenants this query reads, over the datasource's tenant: several are read as one
    /// (`X-Scope-OrgID: a|b`), their series told apart by grouping on `__tenant__`.
    pub tenants: Vec<String>,
}

/// Why a panel query or the datasource settings are refused.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("invalid query JSON: {0}")]
    QueryJson(#[source] serde_json::Error),
    #[error("unknown query type {0:?}: use profile, metrics or both")]
    QueryType(String),
    #[error("the request carries no datasource settings")]
    NoDatasource,
    #[error("invalid jsonData: {0}")]
    JsonData(#[source] serde_json::Error),
    #[error("no Kiln URL: set it in the datasource settings")]
    NoUrl,
}

impl KilnQuery {
    /// Parses `DataQuery.json`; `query_type` falls back to the `DataQuery.queryType` field.
    pub fn parse(json: &[u8], query_type: &str) -> Result<Self, SettingsError> {
        let mut q: KilnQuery = if json.is_empty() {
            KilnQuery::default()
        } else {
            serde_json::from_slice(json).map_err(SettingsError::QueryJson)?
        };
        if q.query_type.is_empty() {
            q.query_type = if query_type.is_empty() {
                "both".into()
            } else {
                query_type.into()
            };
        }
        if q.label_selector.trim().is_empty() {
            q.label_selector = "{}".into();
        }
        if !matches!(q.query_type.as_str(), "profile" | "metrics" | "both") {
            return Err(SettingsError::QueryType(q.query_type));
        }
        Ok(q)
    }

    pub fn wants_profile(&self) -> bool {
        matches!(self.query_type.as_str(), "profile" | "both")
    }

    pub fn wants_metrics(&self) -> bool {
        matches!(self.query_type.as_str(), "metrics" | "both")
    }
}

/// `jsonData` of the datasource.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Options {
    /// Kiln's URL; falls back to the datasource's URL field.
    pub url: Option<String>,
    /// Sent as `X-Scope-OrgID` (for `--auth trusted-header`, or to pin a token's tenant);
    /// `a|b` reads several tenants.
    pub tenant: Option<String>,
    pub tls_skip_verify: bool,
}

/// What the plugin needs to reach Kiln.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub url: String,
    pub token: Option<String>,
    pub tenant: Option<String>,
    pub tls_skip_verify: bool,
}

impl Settings {
    /// From the plugin context's datasource settings.
    pub fn from_context(
        ctx: Option<&kiln_proto::pluginv2::PluginContext>,
    ) -> Result<Self, SettingsError> {
        let ds = ctx
            .and_then(|c| c.data_source_instance_settings.as_ref())
            .ok_or(SettingsError::NoDatasource)?;
        let options: Options = if ds.json_data.is_empty() {
            Options::default()
        } else {
            serde_json::from_slice(&ds.json_data).map_err(SettingsError::JsonData)?
        };
        let url = options
            .url
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| ds.url.clone());
        if url.trim().is_empty() {
            return Err(SettingsError::NoUrl);
        }
        let token = ds
            .decrypted_secure_json_data
            .get("token")
            .filter(|t| !t.is_empty())
            .cloned();
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            token,
            tenant: options.tenant.filter(|t| !t.is_empty()),
            tls_skip_verify: options.tls_skip_verify,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let q = KilnQuery::parse(br#"{"profileTypeId":"p:a:b:c:d","maxNodes":10}"#, "").unwrap();
        assert_eq!(q.query_type, "both");
        assert_eq!(q.label_selector, "{}");
        assert_eq!(q.max_nodes, Some(10));
        let q = KilnQuery::parse(b"{}", "metrics").unwrap();
        assert!(q.wants_metrics() && !q.wants_profile());
        assert!(KilnQuery::parse(br#"{"queryType":"logs"}"#, "").is_err());
        assert!(KilnQuery::parse(b"{nope", "").is_err());
    }
}
