//! Label selectors: the PromQL matcher sets Pyroscope's API takes, such as
//! `{service_name="api", namespace=~"prod|staging", pod!=""}`.

use std::fmt;

use regex::Regex;

use crate::{Error, Result};

/// A matcher's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`, anchored at both ends
    Regex,
    /// `!~`, anchored at both ends
    NotRegex,
}

/// One `name op "value"` matcher. An absent label matches as the empty string.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<Regex>,
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.op == other.op && self.value == other.value
    }
}

impl Matcher {
    /// Builds a matcher, compiling the regex of `=~` and `!~`.
    pub fn new(name: impl Into<String>, op: MatchOp, value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => Some(
                Regex::new(&format!("^(?:{value})$"))
                    .map_err(|e| Error::InvalidQuery(format!("invalid regex {value:?}: {e}")))?,
            ),
            _ => None,
        };
        Ok(Self {
            name: name.into(),
            op,
            value,
            regex,
        })
    }

    /// Whether a label value (`""` when absent) matches.
    pub fn matches(&self, value: &str) -> bool {
        match self.op {
            MatchOp::Equal => value == self.value,
            MatchOp::NotEqual => value != self.value,
            MatchOp::Regex => self.regex.as_ref().is_some_and(|r| r.is_match(value)),
            MatchOp::NotRegex => !self.regex.as_ref().is_some_and(|r| r.is_match(value)),
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        };
        write!(f, "{}{op}{:?}", self.name, self.value)
    }
}

/// A conjunction of matchers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    pub matchers: Vec<Matcher>,
}

impl Selector {
    /// Whether a label set (looked up by `get`) satisfies every matcher.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.matchers
            .iter()
            .all(|m| m.matches(get(&m.name).unwrap_or("")))
    }
}

/// Parses `{...}`; an empty string or `{}` selects everything. A bare metric-name prefix
/// (`name{...}`) is not accepted here: profile types travel in their own field.
pub fn parse_selector(input: &str) -> Result<Selector> {
    let mut p = Parser {
        s: input.as_bytes(),
        input,
        pos: 0,
    };
    p.skip_ws();
    if p.eof() {
        return Ok(Selector::default());
    }
    p.expect(b'{')?;
    let mut matchers = Vec::new();
    loop {
        p.skip_ws();
        if p.peek() == Some(b'}') {
            p.pos += 1;
            break;
        }
        let name = p.label_name()?;
        p.skip_ws();
        let op = p.op()?;
        p.skip_ws();
        let value = p.string()?;
        matchers.push(Matcher::new(name, op, value)?);
        p.skip_ws();
        match p.peek() {
            Some(b',') => p.pos += 1,
            Some(b'}') => {
                p.pos += 1;
                break;
            }
            _ => return Err(p.err("expected ',' or '}'")),
        }
    }
    p.skip_ws();
    if !p.eof() {
        return Err(p.err("unexpected text after '}'"));
    }
    Ok(Selector { matchers })
}

struct Parser<'a> {
    s: &'a [u8],
    input: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> Error {
        Error::InvalidQuery(format!(
            "invalid label selector {:?}: {what} at offset {}",
            self.input, self.pos
        ))
    }

    fn eof(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<()> {
        if self.peek() != Some(c) {
            return Err(self.err(&format!("expected {:?}", c as char)));
        }
        self.pos += 1;
        Ok(())
    }

    fn label_name(&mut self) -> Result<String> {
        if matches!(self.peek(), Some(b'"') | Some(b'\'') | Some(b'`')) {
            return self.string();
        }
        // Unquoted: the characters ingest allows in a label name (letters and digits of any
        // script, `_`, `.`, `-`, `/`), so any name Kiln stores can be written bare.
        let start = self.pos;
        let rest = self.input.get(start..).unwrap_or_default();
        let name_len = rest
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')))
            .map_or(rest.len(), |(i, _)| i);
        self.pos += name_len;
        if start == self.pos || self.s[start].is_ascii_digit() {
            return Err(self.err("expected a label name"));
        }
        Ok(self.input[start..self.pos].to_owned())
    }

    fn op(&mut self) -> Result<MatchOp> {
        let two = self.s.get(self.pos..self.pos + 2);
        let (op, len) = match two {
            Some(b"=~") => (MatchOp::Regex, 2),
            Some(b"!~") => (MatchOp::NotRegex, 2),
            Some(b"!=") => (MatchOp::NotEqual, 2),
            _ if self.peek() == Some(b'=') => (MatchOp::Equal, 1),
            _ => return Err(self.err("expected one of =, !=, =~, !~")),
        };
        self.pos += len;
        Ok(op)
    }

    fn string(&mut self) -> Result<String> {
        let Some(quote) = self.peek().filter(|c| matches!(c, b'"' | b'\'' | b'`')) else {
            return Err(self.err("expected a quoted string"));
        };
        self.pos += 1;
        let mut out = String::new();
        let rest = &self.input[self.pos..];
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            if c as u32 == u32::from(quote) {
                self.pos += i + 1;
                return Ok(out);
            }
            if c == '\\' && quote != b'`' {
                let Some((_, e)) = chars.next() else { break };
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    other => other,
                });
            } else {
                out.push(c);
            }
        }
        self.pos = self.s.len();
        Err(self.err("unterminated string"))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parses_all_operators() {
        let s = parse_selector(
            r#"{service_name="api", ns=~"prod|dev",pod!="", "service.version"!~`1\..*`}"#,
        )
        .unwrap();
        assert_eq!(s.matchers.len(), 4);
        assert_eq!(s.matchers[0].op, MatchOp::Equal);
        assert_eq!(s.matchers[1].op, MatchOp::Regex);
        assert_eq!(s.matchers[2].op, MatchOp::NotEqual);
        assert_eq!(s.matchers[3].name, "service.version");
        assert_eq!(s.matchers[3].value, r"1\..*");
        assert_eq!(s.matchers[3].op, MatchOp::NotRegex);
    }

    #[test]
    fn names_of_any_script_are_written_bare_or_quoted() {
        for input in [
            r#"{zone.région="eu", 名前="x"}"#,
            r#"{"zone.région"="eu", '名前'="x"}"#,
        ] {
            let s = parse_selector(input).unwrap();
            let names: Vec<&str> = s.matchers.iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, ["zone.région", "名前"], "{input}");
        }
        // Still not a name: a leading digit, or a character ingest refuses.
        assert!(parse_selector(r#"{9a="x"}"#).is_err());
        assert!(parse_selector(r#"{a b="x"}"#).is_err());
        assert!(parse_selector(r#"{a€="x"}"#).is_err());
    }

    #[test]
    fn empty_selects_everything() {
        assert!(parse_selector("").unwrap().matchers.is_empty());
        assert!(parse_selector(" {} ").unwrap().matchers.is_empty());
    }

    #[test]
    fn regex_is_anchored_and_absent_is_empty() {
        let s = parse_selector(r#"{ns=~"prod"}"#).unwrap();
        assert!(s.matches(|_| Some("prod")));
        assert!(!s.matches(|_| Some("production")));
        let s = parse_selector(r#"{pod=""}"#).unwrap();
        assert!(s.matches(|_| None));
        let s = parse_selector(r#"{pod!~".+"}"#).unwrap();
        assert!(s.matches(|_| None));
        assert!(!s.matches(|_| Some("x")));
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "service_name=\"x\"",
            "{service_name}",
            "{service_name=x}",
            "{a=\"b\"",
            "{a=\"b\" b=\"c\"}",
            "{a=~\"(\"}",
            "{a=\"b\"} x",
            "{1a=\"b\"}",
            "{a==\"b\"}",
        ] {
            assert!(parse_selector(bad).is_err(), "{bad:?} must be refused");
        }
    }

    proptest! {
        #[test]
        fn display_round_trips(
            ms in prop::collection::vec(("[a-z_][a-z0-9_.]{0,8}", 0u8..4, "[ -~]{0,10}"), 0..5)
        ) {
            let mut matchers = Vec::new();
            for (name, op, value) in &ms {
                let op = [MatchOp::Equal, MatchOp::NotEqual, MatchOp::Regex, MatchOp::NotRegex][*op as usize];
                let value = if matches!(op, MatchOp::Regex | MatchOp::NotRegex) { regex::escape(value) } else { value.clone() };
                matchers.push(Matcher::new(name.clone(), op, value).unwrap());
            }
            let text = format!("{{{}}}", matchers.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "));
            let parsed = parse_selector(&text).unwrap();
            prop_assert_eq!(parsed.matchers, matchers);
        }
    }
}
