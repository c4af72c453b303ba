//! A recording rule: what it selects, how its series are labelled, and its checks. Rules made
//! through the API are kept per tenant in the tenant document [`RULES_DOCUMENT`]; provisioned
//! rules come from the tenant file (`recording_rules` of `[defaults]` or `[tenants.<id>]`) and
//! cannot be changed through the API.

use std::sync::Arc;

use kiln_otel::model::{LABEL_PROFILE_TYPE, ProfileType};
use kiln_storage::query::frame_filter::FrameFilter;
use kiln_storage::selector::{MatchOp, Selector, parse_selector};
use serde::{Deserialize, Serialize};

/// The tenant document holding the rules made through the API.
pub const RULES_DOCUMENT: &str = "recording-rules.json";

/// A rule as it is kept and answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rule {
    /// The rule's id: given by the server for rules made through the API, the metric name
    /// for provisioned ones.
    pub id: String,
    /// The Prometheus metric the rule writes.
    pub metric_name: String,
    /// Label selectors, all of which a series must match (`{service_name="api"}`); one of
    /// them names the profile type (`{__profile_type__="process_cpu:cpu:nanoseconds:cpu:nanoseconds"}`).
    pub matchers: Vec<String>,
    /// Labels of the profiles kept on the output series; profiles are summed across the rest.
    pub group_by: Vec<String>,
    /// Labels added to every output series.
    pub external_labels: Vec<(String, String)>,
    /// When set, only stacks with a frame of this function count (once per stack).
    pub function_name: Option<String>,
    /// Bumped by every change; an upsert that names another generation is refused (409).
    pub generation: i64,
    /// From the tenant file: read-only through the API.
    pub provisioned: bool,
    /// How far back the rule is evaluated from stored profiles when it is made (seconds;
    /// `None`: `--recording-backfill`). Kiln's own (the `Kiln-Backfill` header of the upsert
    /// that made it); not in Pyroscope's messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backfill_secs: Option<u64>,
}

pub use crate::tenants::ProvisionedRule;

impl ProvisionedRule {
    /// The rule it provisions.
    pub fn rule(&self) -> Rule {
        Rule {
            id: if self.id.is_empty() {
                self.derived_id()
            } else {
                self.id.clone()
            },
            metric_name: self.metric_name.clone(),
            matchers: self.matchers.clone(),
            group_by: self.group_by.clone(),
            external_labels: self
                .external_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            function_name: Some(self.function_name.clone()).filter(|f| !f.is_empty()),
            generation: 1,
            provisioned: true,
            backfill_secs: None,
        }
    }
}

impl ProvisionedRule {
    /// Ten letters of the SHA-256 of the rule's parts (its metric name, its matchers and
    /// `group_by` labels sorted, its external labels, its function), as Pyroscope names
    /// provisioned rules without an id.
    fn derived_id(&self) -> String {
        use sha2::Digest;
        const ALPHABET: &[u8; 52] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut h = sha2::Sha256::new();
        h.update(self.metric_name.as_bytes());
        let mut matchers = self.matchers.clone();
        matchers.sort();
        let mut group_by = self.group_by.clone();
        group_by.sort();
        for part in matchers.iter().chain(&group_by) {
            h.update(part.as_bytes());
        }
        for (k, v) in &self.external_labels {
            h.update(k.as_bytes());
            h.update(v.as_bytes());
        }
        h.update(self.function_name.as_bytes());
        h.finalize()[..10]
            .iter()
            .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
            .collect()
    }
}

/// A rule ready to evaluate.
#[derive(Debug)]
pub struct CompiledRule {
    pub rule: Rule,
    /// Every matcher of every selector, the profile type's included.
    pub selector: Selector,
    /// The profile type the rule reads (its `__profile_type__` matcher).
    pub profile_type: String,
    /// The function filter (a stack is kept when one of its frames is the function).
    pub frames: Option<Arc<FrameFilter>>,
}

/// Why a rule is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRule(pub String);

fn invalid(message: impl Into<String>) -> InvalidRule {
    InvalidRule(message.into())
}

/// Whether `name` is a valid Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Longest function name a filter may name, and most matchers and labels of a rule.
const MAX_FUNCTION_NAME: usize = 4096;
const MAX_PARTS: usize = 32;

impl Rule {
    /// Checks the rule and compiles it. Refused: a metric name Prometheus cannot store, no
    /// matcher or a selector that does not parse, no `__profile_type__="…"` matcher (or one
    /// naming no valid profile type), `group_by` or external label names Prometheus cannot
    /// store or that Kiln sets itself (`__name__` and the other `__…` labels), an external
    /// label that is also grouped by, and an over-long function name.
    pub fn compile(&self) -> Result<CompiledRule, InvalidRule> {
        if !valid_metric_name(&self.metric_name) {
            return Err(invalid(format!(
                "metric name {:?} is not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
                self.metric_name
            )));
        }
        if self.matchers.is_empty() {
            return Err(invalid(
                "a rule needs matchers, one of them {__profile_type__=\"…\"}",
            ));
        }
        if self.matchers.len() > MAX_PARTS
            || self.group_by.len() > MAX_PARTS
            || self.external_labels.len() > MAX_PARTS
        {
            return Err(invalid(format!(
                "a rule has at most {MAX_PARTS} matchers, group_by labels and external labels each"
            )));
        }
        let mut selector = Selector::default();
        for m in &self.matchers {
            let parsed =
                parse_selector(m).map_err(|e| invalid(format!("invalid matcher {m:?}: {e}")))?;
            selector.matchers.extend(parsed.matchers);
        }
        let types: Vec<&str> = selector
            .matchers
            .iter()
            .filter(|m| m.name == LABEL_PROFILE_TYPE)
            .map(|m| match m.op {
                MatchOp::Equal => Ok(m.value.as_str()),
                _ => Err(invalid(
                    "the __profile_type__ matcher must be an equality (__profile_type__=\"…\")",
                )),
            })
            .collect::<Result<_, _>>()?;
        let profile_type = match types.as_slice() {
            [one] => (*one).to_owned(),
            [] => {
                return Err(invalid(
                    "a rule needs a {__profile_type__=\"…\"} matcher naming the profile type it reads",
                ));
            }
            _ => return Err(invalid("a rule names one __profile_type__, not several")),
        };
        if ProfileType::parse(&profile_type).is_none() {
            return Err(invalid(format!(
                "{profile_type:?} is not a profile type (name:sample_type:unit:period_type:unit)"
            )));
        }
        for g in &self.group_by {
            check_label_name("group_by", g)?;
        }
        for (k, _) in &self.external_labels {
            check_label_name("external label", k)?;
            if self.group_by.contains(k) {
                return Err(invalid(format!(
                    "label {k:?} is both grouped by and an external label"
                )));
            }
        }
        let mut names: Vec<&str> = self
            .group_by
            .iter()
            .chain(self.external_labels.iter().map(|(k, _)| k))
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid(
                "a label is named twice in group_by or external labels",
            ));
        }
        let frames = match self.function_name.as_deref() {
            None | Some("") => None,
            Some(f) if f.len() > MAX_FUNCTION_NAME => {
                return Err(invalid(format!(
                    "the function name is longer than {MAX_FUNCTION_NAME} bytes"
                )));
            }
            Some(f) => FrameFilter::new(&[f.to_owned()], &[], &[], &[])
                .map_err(invalid)?
                .map(Arc::new),
        };
        Ok(CompiledRule {
            rule: self.clone(),
            selector,
            profile_type,
            frames,
        })
    }
}

fn check_label_name(what: &str, name: &str) -> Result<(), InvalidRule> {
    if !valid_label_name(name) {
        return Err(invalid(format!(
            "{what} {name:?} is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
        )));
    }
    if name == crate::recording::RULE_ID_LABEL || name == crate::recording::TENANT_LABEL {
        return Err(invalid(format!(
            "{what} {name:?} is a label Kiln sets on every series of a rule"
        )));
    }
    if name.starts_with("__") {
        return Err(invalid(format!(
            "{what} {name:?} is unknown: labels starting with __ are Kiln's own"
        )));
    }
    Ok(())
}

impl CompiledRule {
    /// Whether a series (its labels by `get`, and its profile type id) is one the rule reads.
    pub fn matches<'a>(
        &self,
        profile_type: &'a str,
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> bool {
        profile_type == self.profile_type
            && self.selector.matches(|name| {
                if name == LABEL_PROFILE_TYPE {
                    Some(profile_type)
                } else {
                    get(name)
                }
            })
    }

    /// The output series' labels for a series' `group_by` values: `__name__`, the grouped
    /// labels the series has, the external labels, sorted by name.
    pub fn output_labels(&self, group: &[(String, String)]) -> Vec<(String, String)> {
        let mut labels = Vec::with_capacity(1 + group.len() + self.rule.external_labels.len());
        labels.push(("__name__".to_owned(), self.rule.metric_name.clone()));
        labels.extend(group.iter().cloned());
        labels.extend(self.rule.external_labels.iter().cloned());
        labels.sort();
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    fn rule() -> Rule {
        Rule {
            id: "r".into(),
            metric_name: "profiles_cpu_nanoseconds_total".into(),
            matchers: vec![
                r#"{service_name="api"}"#.into(),
                format!(r#"{{__profile_type__="{CPU}"}}"#),
            ],
            group_by: vec!["pod".into()],
            ..Rule::default()
        }
    }

    #[test]
    fn a_rule_compiles_and_matches_its_series() {
        let c = rule().compile().expect("valid");
        assert_eq!(c.profile_type, CPU);
        let labels = [("service_name", "api"), ("pod", "a")];
        let get = |n: &str| labels.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert!(c.matches(CPU, get));
        assert!(!c.matches("memory:alloc_space:bytes:space:bytes", get));
        let other = |n: &str| (n == "service_name").then_some("web");
        assert!(!c.matches(CPU, other));
        assert_eq!(
            c.output_labels(&[("pod".into(), "a".into())]),
            vec![
                ("__name__".into(), "profiles_cpu_nanoseconds_total".into()),
                ("pod".into(), "a".into())
            ]
        );
    }

    #[test]
    fn bad_rules_are_refused_with_what_is_wrong() {
        let cases: [(&str, Box<dyn Fn(&mut Rule)>); 8] = [
            (
                "not a valid Prometheus metric name",
                Box::new(|r| r.metric_name = "1cpu".into()),
            ),
            (
                "invalid matcher",
                Box::new(|r| r.matchers[0] = "{service_name=}".into()),
            ),
            (
                "needs a {__profile_type__",
                Box::new(|r| r.matchers.truncate(1)),
            ),
            (
                "is not a profile type",
                Box::new(|r| r.matchers[1] = r#"{__profile_type__="cpu"}"#.into()),
            ),
            (
                "not a valid Prometheus label name",
                Box::new(|r| r.group_by = vec!["a-b".into()]),
            ),
            (
                "is unknown",
                Box::new(|r| r.group_by = vec!["__tenant__".into()]),
            ),
            (
                "both grouped by",
                Box::new(|r| r.external_labels = vec![("pod".into(), "x".into())]),
            ),
            (
                "must be an equality",
                Box::new(|r| r.matchers[1] = format!(r#"{{__profile_type__=~"{CPU}"}}"#)),
            ),
        ];
        for (want, change) in cases {
            let mut r = rule();
            change(&mut r);
            let e = r.compile().expect_err(want);
            assert!(e.0.contains(want), "{want:?} not in {e}");
        }
    }
}
