//! Pyroscope's stack frame filter (`types.v1.StackTraceSelector.frame_filter`, sent by newer
//! Grafana datasource and Profiles Drilldown builds): whole stacks are kept or dropped by the
//! names of their functions, never trimmed.
//!
//! A stack is kept when every include term is met by some function of it (terms are ANDed; one
//! function may meet several) and no function meets an exclude term. Names compare whole and
//! case-sensitive; regexes search unanchored, as Go's `regexp.MatchString` does (Rust's `regex`
//! has RE2's syntax and guarantees). A stack's functions are every line of every location, so
//! inlined functions count. An empty stack is never kept while a filter is active. Filters with
//! no terms are no filter.

use std::collections::HashSet;

use regex::{Regex, RegexBuilder};

use crate::format::symbols::SymbolTable;

/// Most terms a filter may have (an include term is a bit of a 64-bit set).
pub const MAX_TERMS: usize = 64;

/// Largest compiled regex (bytes of its program), so a pattern cannot cost unbounded memory.
const MAX_REGEX_BYTES: usize = 1 << 20;

/// A compiled frame filter.
#[derive(Debug)]
pub struct FrameFilter {
    include_names: Vec<String>,
    exclude_names: HashSet<String>,
    include_regexes: Vec<Regex>,
    exclude_regexes: Vec<Regex>,
}

impl FrameFilter {
    /// The filter of these terms; `None` when there are none. An invalid regex (or too many
    /// terms) is refused with a message naming it, as Pyroscope answers it.
    pub fn new(
        include_names: &[String],
        exclude_names: &[String],
        include_regexes: &[String],
        exclude_regexes: &[String],
    ) -> Result<Option<Self>, String> {
        let terms = include_names.len()
            + exclude_names.len()
            + include_regexes.len()
            + exclude_regexes.len();
        if terms == 0 {
            return Ok(None);
        }
        if terms > MAX_TERMS {
            return Err(format!(
                "the frame filter has {terms} terms, more than the {MAX_TERMS} Kiln accepts"
            ));
        }
        let compile = |which: &str, patterns: &[String]| -> Result<Vec<Regex>, String> {
            patterns
                .iter()
                .map(|p| {
                    RegexBuilder::new(p)
                        .size_limit(MAX_REGEX_BYTES)
                        .build()
                        .map_err(|e| format!("invalid {which} function name regex {p:?}: {e}"))
                })
                .collect()
        };
        let mut include_names: Vec<String> = include_names.to_vec();
        include_names.sort();
        include_names.dedup();
        Ok(Some(Self {
            include_names,
            exclude_names: exclude_names.iter().cloned().collect(),
            include_regexes: compile("include", include_regexes)?,
            exclude_regexes: compile("exclude", exclude_regexes)?,
        }))
    }

    /// The include terms `name` meets (bit `i`: term `i`) and whether it meets an exclude term.
    pub fn terms(&self, name: &str) -> (u64, bool) {
        let mut met = 0u64;
        let names = self.include_names.iter().map(|n| n == name);
        let regexes = self.include_regexes.iter().map(|r| r.is_match(name));
        for (i, hit) in names.chain(regexes).enumerate() {
            if hit {
                met |= 1 << i;
            }
        }
        let excluded = self.exclude_names.contains(name)
            || self.exclude_regexes.iter().any(|r| r.is_match(name));
        (met, excluded)
    }

    /// The set of every include term: what a kept stack's functions meet together.
    pub fn all_terms(&self) -> u64 {
        let n = self.include_names.len() + self.include_regexes.len();
        if n == 64 { u64::MAX } else { (1u64 << n) - 1 }
    }

    /// Whether a stack of these functions' terms (from [`Self::terms`]) is kept.
    pub fn keeps_terms(&self, terms: impl IntoIterator<Item = (u64, bool)>) -> bool {
        let mut met = 0u64;
        let mut any = false;
        for (m, excluded) in terms {
            if excluded {
                return false;
            }
            met |= m;
            any = true;
        }
        any && met == self.all_terms()
    }

    /// Whether a stack of these function names is kept.
    pub fn keeps<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> bool {
        self.keeps_terms(names.into_iter().map(|n| self.terms(n)))
    }

    /// Whether a block's stack (locations leaf first) is kept: its functions are every line of
    /// every location (a location without lines has none); `memo` holds each function's terms
    /// of this block (as long as the block's functions).
    pub fn keeps_stack(
        &self,
        symbols: &SymbolTable,
        stack: &[u32],
        memo: &mut [Option<(u64, bool)>],
    ) -> bool {
        let s = &symbols.symbols;
        self.keeps_terms(
            stack
                .iter()
                .flat_map(|&loc| {
                    s.locations[loc as usize]
                        .line_functions
                        .iter()
                        .map(|&f| f as usize)
                })
                .map(|f| {
                    *memo[f].get_or_insert_with(|| self.terms(symbols.string(s.functions[f].name)))
                })
                .collect::<Vec<_>>(),
        )
    }
}

/// Whether each stack of one block is kept by a filter, judged once per stack node and once
/// per function.
#[derive(Debug, Default)]
pub struct StackVerdicts {
    stacks: Vec<Option<bool>>,
    functions: Vec<Option<(u64, bool)>>,
    scratch: Vec<u32>,
}

impl StackVerdicts {
    /// Whether `filter` keeps stack node `stack` of the block whose symbols are `symbols` (the
    /// same block at every call). An id beyond the stack tree is not kept.
    pub fn keeps(&mut self, filter: &FrameFilter, symbols: &SymbolTable, stack: u32) -> bool {
        if self.stacks.is_empty() {
            self.stacks = vec![None; symbols.stack_count()];
            self.functions = vec![None; symbols.symbols.functions.len()];
        }
        match self.stacks.get(stack as usize) {
            None => false,
            Some(Some(kept)) => *kept,
            Some(None) => {
                symbols.stack_locations(stack, &mut self.scratch);
                let kept = filter.keeps_stack(symbols, &self.scratch, &mut self.functions);
                self.stacks[stack as usize] = Some(kept);
                kept
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    /// Pyroscope's own cases (`pkg/phlaredb/symdb/frame_filter_test.go`): functions root, a, b,
    /// forbidden; five stacks of value 1.
    #[test]
    fn pyroscopes_cases() {
        let stacks: [&[&str]; 5] = [
            &["root", "a"],
            &["root", "a", "b"],
            &["root", "b"],
            &["root", "forbidden"],
            &["root", "a", "forbidden"],
        ];
        let kept = |inc: &[&str], exc: &[&str], inc_re: &[&str], exc_re: &[&str]| -> usize {
            let f = FrameFilter::new(&s(inc), &s(exc), &s(inc_re), &s(exc_re))
                .unwrap()
                .unwrap();
            stacks
                .iter()
                .filter(|st| f.keeps(st.iter().copied()))
                .count()
        };
        assert_eq!(kept(&["a"], &[], &[], &[]), 3);
        assert_eq!(kept(&["a", "b"], &[], &[], &[]), 1);
        assert_eq!(kept(&[], &["forbidden"], &[], &[]), 3);
        assert_eq!(kept(&["a"], &["forbidden"], &[], &[]), 2);
        assert_eq!(kept(&["missing"], &[], &[], &[]), 0);
        assert_eq!(kept(&[], &[], &["^a$"], &[]), 3);
        assert_eq!(kept(&[], &[], &[], &["forbid"]), 3);
        assert_eq!(kept(&[], &[], &["^a$", "^b$"], &[]), 1);
        assert_eq!(kept(&["a"], &[], &["^b$"], &[]), 1);
        assert_eq!(kept(&["a"], &[], &["^a$"], &[]), 3);
        assert_eq!(kept(&[], &[], &["^a$"], &["^forbidden$"]), 2);
    }

    #[test]
    fn no_terms_no_filter_and_bad_regexes_are_named() {
        assert!(FrameFilter::new(&[], &[], &[], &[]).unwrap().is_none());
        let err = FrameFilter::new(&[], &[], &s(&["["]), &[]).unwrap_err();
        assert!(
            err.starts_with("invalid include function name regex \"[\""),
            "{err}"
        );
        let err = FrameFilter::new(&[], &[], &[], &s(&["("])).unwrap_err();
        assert!(
            err.starts_with("invalid exclude function name regex \"(\""),
            "{err}"
        );
        let many: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
        assert!(FrameFilter::new(&many, &[], &[], &[]).is_err());
        // An empty stack is never kept, even by an exclude-only filter.
        let f = FrameFilter::new(&[], &s(&["x"]), &[], &[])
            .unwrap()
            .unwrap();
        assert!(!f.keeps([]));
        assert!(f.keeps(["y"]));
    }
}
