//! The `name` parameter of `/ingest` (`app.name{k1=v1,k2=v2}`) and label validation.

use crate::model::{LABEL_NAME, LABEL_SERVICE_NAME, Labels};
use crate::{Error, Result};

/// Limits on series labels, Pyroscope's defaults unless configured.
#[derive(Debug, Clone, Copy)]
pub struct LabelLimits {
    pub max_label_names_per_series: usize,
    pub max_label_name_length: usize,
    pub max_label_value_length: usize,
}

impl Default for LabelLimits {
    fn default() -> Self {
        Self {
            max_label_names_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
        }
    }
}

/// The parsed `name` parameter: the application name and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppName {
    pub app: String,
    pub labels: Labels,
}

/// Parses `app.name{k1=v1,k2=v2}`. The braces are optional; keys and values are trimmed and never
/// quoted, as Pyroscope's own parser does.
pub fn parse_app_name(name: &str) -> Result<AppName> {
    let (app, rest) = match name.find('{') {
        Some(i) => (&name[..i], Some(&name[i + 1..])),
        None => (name, None),
    };
    let app = app.trim();
    validate_app_name(app)?;
    let mut labels = Labels::default();
    if let Some(rest) = rest {
        let Some(body) = rest.strip_suffix('}') else {
            return Err(Error::Labels(format!(
                "malformed name {name:?}: the label set must end with '}}'"
            )));
        };
        for pair in body.split(',') {
            if pair.trim().is_empty() {
                continue;
            }
            let Some((k, v)) = pair.split_once('=') else {
                return Err(Error::Labels(format!(
                    "malformed name {name:?}: {pair:?} is not key=value"
                )));
            };
            let (k, v) = (k.trim(), v.trim());
            validate_label_name(k)?;
            if v.contains(['{', '}']) {
                return Err(Error::Labels(format!(
                    "malformed name {name:?}: value of {k:?} contains a brace"
                )));
            }
            labels.set(k.to_owned(), v.to_owned());
        }
    }
    Ok(AppName {
        app: app.to_owned(),
        labels,
    })
}

fn validate_app_name(app: &str) -> Result<()> {
    if app.is_empty() {
        return Err(Error::Labels("the application name is empty".into()));
    }
    if let Some(c) = app
        .chars()
        .find(|c| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':' | ' ')))
    {
        return Err(Error::Labels(format!(
            "the application name {app:?} contains the invalid character {c:?}"
        )));
    }
    Ok(())
}

/// Checks a label name: non-empty, letters, digits, `_`, `.`, `-` and `/`, not starting with a digit.
pub fn validate_label_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'));
    if !valid {
        return Err(Error::Labels(format!("invalid label name {name:?}")));
    }
    Ok(())
}

/// Applies [`LabelLimits`] to a series label set.
pub fn validate_series_labels(labels: &Labels, limits: &LabelLimits) -> Result<()> {
    if labels.len() > limits.max_label_names_per_series {
        return Err(Error::Labels(format!(
            "series {labels} has {} label names, more than the limit of {}",
            labels.len(),
            limits.max_label_names_per_series
        )));
    }
    for (k, v) in labels.iter() {
        if k.len() > limits.max_label_name_length {
            return Err(Error::Labels(format!(
                "label name {k:?} is longer than {} bytes",
                limits.max_label_name_length
            )));
        }
        if v.len() > limits.max_label_value_length {
            return Err(Error::Labels(format!(
                "value of label {k:?} is longer than {} bytes",
                limits.max_label_value_length
            )));
        }
        if k != LABEL_NAME && k != LABEL_SERVICE_NAME {
            validate_label_name(k)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_with_labels() {
        let n = parse_app_name(
            "node.cpu.app{otel.scope.name=com.grafana.pyroscope/nodejs, region = us-west,env=test}",
        )
        .unwrap();
        assert_eq!(n.app, "node.cpu.app");
        assert_eq!(n.labels.get("region"), Some("us-west"));
        assert_eq!(
            n.labels.get("otel.scope.name"),
            Some("com.grafana.pyroscope/nodejs")
        );
        assert_eq!(n.labels.len(), 3);
    }

    #[test]
    fn parses_bare_name_and_empty_braces() {
        assert_eq!(parse_app_name("py.legacy.app").unwrap().labels.len(), 0);
        assert_eq!(parse_app_name("app{}").unwrap().app, "app");
    }

    #[test]
    fn refuses_malformed_names() {
        for bad in [
            "",
            "{a=b}",
            "app{a=b",
            "app{a}",
            "app{=b}",
            "ap{p{a=b}",
            "a\"pp",
            "app{1a=b}",
        ] {
            assert!(parse_app_name(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn limits_apply() {
        let limits = LabelLimits {
            max_label_names_per_series: 2,
            max_label_name_length: 5,
            max_label_value_length: 3,
        };
        let ok = Labels::from_pairs([("a", "1"), ("b", "2")]);
        assert!(validate_series_labels(&ok, &limits).is_ok());
        let many = Labels::from_pairs([("a", "1"), ("b", "2"), ("c", "3")]);
        assert!(validate_series_labels(&many, &limits).is_err());
        let long_value = Labels::from_pairs([("a", "1234")]);
        assert!(validate_series_labels(&long_value, &limits).is_err());
    }
}
