//! Native frames named at query time (ADR 0013). Agents that profile whole hosts send a native
//! frame as a mapping (with its binary's build id) and an address; ingest names it after the
//! file and address (`libc.so.6 0x1f2a`). When the engine has a [`FrameNamer`], a block's
//! symbols are read with those frames named from their debug files — the tenant's uploads,
//! debuginfod — so every query path (flame graphs, pprof, DOT, function tables, diffs) shows
//! functions, files and lines, and debug information uploaded after the profiles applies to
//! them too. Compaction writes the names it gets into the blocks it makes.
//!
//! The engine knows nothing of ELF or DWARF: the namer is given the frames and answers their
//! lines (`kiln-symbolize` implements it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use kiln_otel::normalize::kernel::unsymbolized_name;
use kiln_proto::kiln::storage::v1 as pb;

use crate::format::symbols::SymbolTable;

/// A native frame to name: its mapping (with the build id) and its address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NativeFrame {
    pub build_id: String,
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub address: u64,
}

/// One line of a named frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamedLine {
    pub function: String,
    /// Empty when unknown.
    pub file: String,
    /// 0 when unknown.
    pub line: i64,
}

/// A namer's answer.
#[derive(Debug, Clone, Default)]
pub struct Named {
    /// Per frame asked, innermost line first; `None` where nothing names it.
    pub lines: Vec<Option<Arc<[NamedLine]>>>,
    /// Whether the answer may change without a new debug file (a fetch under way or failed):
    /// such an answer is used but not cached.
    pub incomplete: bool,
    /// What a user should know (a query shows them as `kiln-warning`).
    pub warnings: Vec<String>,
}

/// Names native frames.
#[async_trait]
pub trait FrameNamer: Send + Sync + std::fmt::Debug {
    /// Changes whenever an answer for `tenant` may change (a debug file arrived or went).
    fn generation(&self, tenant: &str) -> u64;

    /// Names `frames` of `tenant`, waiting for slow sources until `deadline`.
    async fn name(&self, tenant: &str, frames: Vec<NativeFrame>, deadline: Instant) -> Named;
}

/// The locations of a table that are native frames without names, with the frame each is.
/// A location qualifies when its mapping has a build id, its address is not 0, and its only
/// line is the one ingest made up (or it has none).
pub fn unnamed_locations(table: &SymbolTable) -> Vec<(usize, NativeFrame)> {
    let s = &table.symbols;
    let mut out = Vec::new();
    for (i, loc) in s.locations.iter().enumerate() {
        if loc.address == 0 || loc.mapping == 0 || loc.line_functions.len() > 1 {
            continue;
        }
        let Some(m) = s.mappings.get(loc.mapping as usize - 1) else {
            continue;
        };
        let build_id = table.string(m.build_id);
        if build_id.is_empty() {
            continue;
        }
        if let Some(&f) = loc.line_functions.first() {
            let made_up = unsymbolized_name(Some(table.string(m.filename)), loc.address);
            let name = s
                .functions
                .get(f as usize)
                .map_or("", |f| table.string(f.name));
            if name != made_up || loc.line_numbers.first().is_some_and(|&l| l != 0) {
                continue;
            }
        }
        out.push((
            i,
            NativeFrame {
                build_id: build_id.to_owned(),
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                address: loc.address,
            },
        ));
    }
    out
}

/// A copy of `table` whose locations at `at` (from [`unnamed_locations`]) carry the lines
/// `named` gives them; locations it does not name keep theirs. Mappings all of whose unnamed
/// locations got names are marked as having functions.
pub fn with_names(table: &SymbolTable, at: &[usize], named: &Named) -> SymbolTable {
    let mut s = table.symbols.clone();
    let mut strings: HashMap<String, u32> = HashMap::new();
    let mut string = |s: &mut pb::Symbols, text: &str| -> u32 {
        if let Some(&i) = strings.get(text) {
            return i;
        }
        let i = s.strings.len() as u32;
        s.strings.push(text.to_owned());
        strings.insert(text.to_owned(), i);
        i
    };
    let mut functions: HashMap<(u32, u32), u32> = HashMap::new();
    let mut unnamed_mappings = std::collections::HashSet::new();
    let mut named_mappings = std::collections::HashSet::new();
    for (&loc, lines) in at.iter().zip(&named.lines) {
        let mapping = s.locations[loc].mapping;
        let Some(lines) = lines.as_ref().filter(|l| !l.is_empty()) else {
            unnamed_mappings.insert(mapping);
            continue;
        };
        named_mappings.insert(mapping);
        let mut line_functions = Vec::with_capacity(lines.len());
        let mut line_numbers = Vec::with_capacity(lines.len());
        for l in lines.iter() {
            let name = string(&mut s, &l.function);
            let file = if l.file.is_empty() {
                0
            } else {
                string(&mut s, &l.file)
            };
            let f = *functions.entry((name, file)).or_insert_with(|| {
                s.functions.push(pb::Function {
                    name,
                    system_name: name,
                    filename: file,
                    start_line: 0,
                });
                s.functions.len() as u32 - 1
            });
            line_functions.push(f);
            line_numbers.push(l.line);
        }
        let location = &mut s.locations[loc];
        location.line_functions = line_functions;
        location.line_numbers = line_numbers;
    }
    for m in named_mappings.difference(&unnamed_mappings) {
        if let Some(mapping) = (*m as usize)
            .checked_sub(1)
            .and_then(|i| s.mappings.get_mut(i))
        {
            mapping.has_functions = true;
        }
    }
    table.with_tree_of(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::symbols::SymbolsBuilder;
    use kiln_otel::model::{Function, Line, Location, Mapping, Symbols};

    /// A profile's symbols: `main` (named), two native frames of `libfoo.so` (ingest's names),
    /// and a native frame without a build id.
    fn table() -> SymbolTable {
        let mut p = Symbols::default();
        p.mappings.push(Mapping {
            memory_start: 0x7f00_0000_0000,
            memory_limit: 0x7f00_0010_0000,
            file_offset: 0x1000,
            filename: "/usr/lib/libfoo.so".into(),
            build_id: "abcd1234".into(),
            has_functions: false,
        });
        p.mappings.push(Mapping {
            filename: "/usr/lib/nobuildid.so".into(),
            ..Default::default()
        });
        for name in [
            "main",
            "libfoo.so 0x7f0000001234",
            "libfoo.so 0x7f0000005678",
            "nobuildid.so 0x99",
        ] {
            p.functions.push(Function {
                name: name.into(),
                ..Default::default()
            });
        }
        let loc = |f: u32, mapping: Option<u32>, address: u64, line: i64| Location {
            mapping,
            address,
            lines: kiln_otel::model::smallvec![Line { function: f, line }],
            ..Default::default()
        };
        p.locations.push(loc(0, None, 0, 3));
        p.locations.push(loc(1, Some(0), 0x7f00_0000_1234, 0));
        p.locations.push(loc(2, Some(0), 0x7f00_0000_5678, 0));
        p.locations.push(loc(3, Some(1), 0x99, 0));
        let mut b = SymbolsBuilder::default();
        let ids = b.add_locations(&p);
        b.add_stack(ids.iter().copied().rev());
        SymbolTable::decode(&b.encode().unwrap()).unwrap()
    }

    #[test]
    fn ingests_made_up_names_are_found_and_replaced() {
        let t = table();
        let unnamed = unnamed_locations(&t);
        let addresses: Vec<u64> = unnamed.iter().map(|(_, f)| f.address).collect();
        assert_eq!(addresses, [0x7f00_0000_1234, 0x7f00_0000_5678]);
        assert!(unnamed.iter().all(|(_, f)| f.build_id == "abcd1234"
            && f.file_offset == 0x1000
            && f.memory_start == 0x7f00_0000_0000));
        let line = |function: &str, file: &str, line| NamedLine {
            function: function.into(),
            file: file.into(),
            line,
        };
        let named = Named {
            lines: vec![
                Some(vec![line("inlined", "foo.h", 7), line("foo_work", "foo.c", 42)].into()),
                None,
            ],
            ..Default::default()
        };
        let at: Vec<usize> = unnamed.iter().map(|(i, _)| *i).collect();
        let t2 = with_names(&t, &at, &named);
        let names: Vec<Vec<&str>> = (0..t2.symbols.locations.len() as u32)
            .map(|l| t2.location_function_names(l).collect())
            .collect();
        assert!(names.contains(&vec!["inlined", "foo_work"]), "{names:?}");
        assert!(
            names.contains(&vec!["libfoo.so 0x7f0000005678"]),
            "unnamed stay: {names:?}"
        );
        assert!(names.contains(&vec!["main"]));
        // One of libfoo's frames stays unnamed: its mapping is not marked.
        assert!(!t2.symbols.mappings[0].has_functions);
        // The named location is no longer a candidate.
        assert_eq!(unnamed_locations(&t2).len(), 1);
        // Files and lines are kept.
        let loc = &t2.symbols.locations[at[0]];
        assert_eq!(loc.line_numbers, [7, 42]);
        let f = &t2.symbols.functions[loc.line_functions[1] as usize];
        assert_eq!(t2.string(f.filename), "foo.c");
    }
}
