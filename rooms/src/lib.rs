//! Checks that a crate keeps to its rooms.
//!
//! A crate's top-level modules are grouped into rooms, listed bottom to top. A module may use
//! modules of its own room and of the rooms below it, never one above. Between the children of
//! any module (the crate's top level included) the uses form no cycle.
//!
//! Uses are read from the source with `syn`: `use` trees and every path in code that starts
//! with `crate`, `super` or `self`. Test code is left out: files named `tests.rs` and items
//! under `#[cfg(test)]`. Comments and doc links are not uses.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module, as the path of names from the crate's root (empty: the root).
pub type Module = Vec<String>;

/// One use of another module found in the source.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    /// The file the use is written in, relative to the crate's `src`.
    pub file: PathBuf,
    /// The module that uses.
    pub from: Module,
    /// The module used (the longest prefix of the path that is a module).
    pub to: Module,
    /// The path as written, `crate::`… or `super::`…
    pub path: String,
}

/// What breaks the rooms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// A top-level module listed in no room.
    Unlisted { module: String },
    /// A use of a module in a higher room.
    Upward {
        from_room: String,
        to_room: String,
        at: Use,
    },
    /// The children of `parent` use each other in a cycle; one use per edge.
    Cycle { parent: Module, uses: Vec<Use> },
    /// A file that does not parse.
    Unparsed { file: PathBuf, error: String },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlisted { module } => write!(f, "module `{module}` is in no room"),
            Self::Upward {
                from_room,
                to_room,
                at,
            } => write!(
                f,
                "{}: `{}` goes up from room `{from_room}` to room `{to_room}`",
                at.file.display(),
                at.path
            ),
            Self::Cycle { parent, uses } => {
                let names: Vec<String> = uses
                    .iter()
                    .map(|u| format!("{} (`{}`)", u.file.display(), u.path))
                    .collect();
                write!(
                    f,
                    "a cycle among the children of `{}`: {}",
                    display(parent),
                    names.join(" → ")
                )
            }
            Self::Unparsed { file, error } => write!(f, "{}: {error}", file.display()),
        }
    }
}

fn display(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Checks the crate whose sources are under `src` against `rooms` (name, top-level modules),
/// bottom to top. Returns every breach found; none when the crate keeps to its rooms.
pub fn check(src: &Path, rooms: &[(&str, &[&str])]) -> Vec<Breach> {
    let (uses, modules, mut breaches) = read_crate(src);
    let room_of: BTreeMap<&str, (usize, &str)> = rooms
        .iter()
        .enumerate()
        .flat_map(|(rank, (room, mods))| mods.iter().map(move |m| (*m, (rank, *room))))
        .collect();
    for m in modules.iter().filter(|m| m.len() == 1) {
        if !room_of.contains_key(m[0].as_str()) {
            breaches.push(Breach::Unlisted {
                module: m[0].clone(),
            });
        }
    }
    // Edges between siblings: per parent, child → child with one use as the witness.
    let mut edges: BTreeMap<Module, BTreeMap<(String, String), Use>> = BTreeMap::new();
    for u in &uses {
        let common = u.from.iter().zip(&u.to).take_while(|(a, b)| a == b).count();
        if common == u.from.len() || common == u.to.len() {
            continue; // within one module, or between a module and its ancestor
        }
        let parent = u.from[..common].to_vec();
        let key = (u.from[common].clone(), u.to[common].clone());
        edges
            .entry(parent.clone())
            .or_default()
            .entry(key)
            .or_insert_with(|| u.clone());
        if parent.is_empty()
            && let (Some(&(a, from_room)), Some(&(b, to_room))) = (
                room_of.get(u.from[0].as_str()),
                room_of.get(u.to[0].as_str()),
            )
            && a < b
        {
            breaches.push(Breach::Upward {
                from_room: from_room.into(),
                to_room: to_room.into(),
                at: u.clone(),
            });
        }
    }
    for (parent, e) in &edges {
        for cycle in cycles(e) {
            breaches.push(Breach::Cycle {
                parent: parent.clone(),
                uses: cycle,
            });
        }
    }
    breaches
}

/// Every use of the crate under `src`, its modules, and the files that did not parse.
pub fn read_crate(src: &Path) -> (Vec<Use>, BTreeSet<Module>, Vec<Breach>) {
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let mut modules = BTreeSet::from([Module::new()]);
    let mut parsed = Vec::new();
    let mut breaches = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file).to_path_buf();
        let module = module_of(&rel);
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                breaches.push(Breach::Unparsed {
                    file: rel,
                    error: e.to_string(),
                });
                continue;
            }
        };
        match syn::parse_file(&text) {
            Ok(ast) => {
                let mut inline = InlineModules {
                    at: module.clone(),
                    found: &mut modules,
                };
                inline.visit_file(&ast);
                modules.insert(module.clone());
                parsed.push((rel, module, ast));
            }
            Err(e) => breaches.push(Breach::Unparsed {
                file: rel,
                error: e.to_string(),
            }),
        }
    }
    let mut uses = Vec::new();
    for (rel, module, ast) in &parsed {
        let mut reader = Reader {
            file: rel,
            module: module.clone(),
            modules: &modules,
            uses: &mut uses,
        };
        reader.visit_file(ast);
    }
    uses.sort();
    uses.dedup();
    (uses, modules, breaches)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "tests") {
                collect(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// The module a file holds: `lib.rs` and `main.rs` the root, `a/mod.rs` and `a.rs` `a`.
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        let top = parts.is_empty();
        if !(stem == "mod" || (top && (stem == "lib" || stem == "main"))) {
            parts.push(stem.to_owned());
        }
    }
    parts
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Records the inline modules (`mod x { … }`) of a file.
struct InlineModules<'a> {
    at: Module,
    found: &'a mut BTreeSet<Module>,
}

impl<'ast> Visit<'ast> for InlineModules<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            return;
        }
        let mut inner = self.at.clone();
        inner.push(m.ident.to_string());
        self.found.insert(inner.clone());
        if m.content.is_some() {
            let outer = std::mem::replace(&mut self.at, inner);
            syn::visit::visit_item_mod(self, m);
            self.at = outer;
        }
    }
}

/// Reads the uses of one file.
struct Reader<'a> {
    file: &'a Path,
    module: Module,
    modules: &'a BTreeSet<Module>,
    uses: &'a mut Vec<Use>,
}

impl Reader<'_> {
    /// Records a path of names as written (first `crate`, `super` or `self`).
    fn record(&mut self, names: &[String]) {
        let Some(absolute) = resolve(&self.module, names) else {
            return;
        };
        let to = (0..=absolute.len())
            .rev()
            .map(|n| absolute[..n].to_vec())
            .find(|m| self.modules.contains(m))
            .unwrap_or_default();
        self.uses.push(Use {
            file: self.file.to_path_buf(),
            from: self.module.clone(),
            to,
            path: names.join("::"),
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    self.record(prefix);
                } else {
                    prefix.push(name);
                    self.record(prefix);
                    prefix.pop();
                }
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            return;
        }
        if m.content.is_some() {
            let mut inner = self.module.clone();
            inner.push(m.ident.to_string());
            let outer = std::mem::replace(&mut self.module, inner);
            syn::visit::visit_item_mod(self, m);
            self.module = outer;
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_test(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
        if let syn::Stmt::Item(syn::Item::Use(u)) = s {
            self.visit_item_use(u);
        } else {
            syn::visit::visit_stmt(self, s);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(&names);
        }
        syn::visit::visit_path(self, p);
    }
}

/// A path as written in `module`, from the crate's root; `None` unless it starts with `crate`,
/// `super` or `self`.
fn resolve(module: &[String], names: &[String]) -> Option<Vec<String>> {
    let first = names.first()?;
    let mut at: Vec<String>;
    let mut rest = names;
    match first.as_str() {
        "crate" => {
            at = Vec::new();
            rest = &rest[1..];
        }
        "self" => {
            at = module.to_vec();
            rest = &rest[1..];
        }
        "super" => {
            at = module.to_vec();
            while rest.first().is_some_and(|n| n == "super") {
                at.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    at.extend(rest.iter().cloned());
    Some(at)
}

/// The cycles among `edges` (strongly connected components of more than one node), each as the
/// uses along one loop through it.
fn cycles(edges: &BTreeMap<(String, String), Use>) -> Vec<Vec<Use>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    let mut out = Vec::new();
    for component in strongly_connected(&graph) {
        if component.len() < 2 {
            continue;
        }
        // One loop through the component: from its first node, follow edges inside it.
        let inside: BTreeSet<&str> = component.iter().copied().collect();
        let start = component[0];
        let mut path = vec![start];
        let mut seen = BTreeSet::from([start]);
        let mut node = start;
        loop {
            let next = graph[node]
                .iter()
                .copied()
                .filter(|n| inside.contains(n))
                .find(|n| *n == start || !seen.contains(n));
            match next {
                Some(n) if n == start => break,
                Some(n) => {
                    path.push(n);
                    seen.insert(n);
                    node = n;
                }
                None => break,
            }
        }
        path.push(start);
        out.push(
            path.windows(2)
                .filter_map(|w| edges.get(&(w[0].to_owned(), w[1].to_owned())).cloned())
                .collect(),
        );
    }
    out
}

/// Tarjan's strongly connected components.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn strong<'a>(v: &'a str, g: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for &w in &g[v] {
            if !s.index.contains_key(w) {
                strong(w, g, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            strong(v, graph, &mut s);
        }
    }
    s.out
}

/// Panics with every breach, one a line, when the crate under `src` breaks its rooms: the body
/// of a crate's rooms test.
pub fn assert_rooms(src: &Path, rooms: &[(&str, &[&str])]) {
    let breaches = check(src, rooms);
    if !breaches.is_empty() {
        let lines: Vec<String> = breaches.iter().map(|b| format!("  {b}")).collect();
        panic!(
            "{} breaks its rooms ({} breaches):\n{}",
            src.display(),
            breaches.len(),
            lines.join("\n")
        );
    }
}

#[cfg(test)]
mod tests;
