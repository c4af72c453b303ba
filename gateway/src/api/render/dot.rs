//! The Graphviz DOT call graph `/pyroscope/render?format=dot` answers, in the form Pyroscope
//! writes it (pprof's `-dot` report with its default options): one node per function, labelled
//! with its shortened name, flat and cumulative values and their shares of the total, sized by
//! flat value and coloured by cumulative share; one edge per caller → callee with the value that
//! went through it; a legend box with the sample type, time, duration and what was left out.
//!
//! At most `max_nodes` nodes are drawn, chosen as pprof chooses them: by an entropy score that
//! favours entry points, leaves and functions whose callers or callees are spread out over
//! pass-through frames. Calls through functions left out become dotted residual edges, and a
//! residual edge is dropped where another path already connects its ends.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::LazyLock;

use regex::Regex;

/// What the legend says about the profile.
#[derive(Debug, Clone)]
pub struct Meta<'a> {
    /// The sample type (`cpu`).
    pub sample_type: &'a str,
    /// Its unit (`nanoseconds`), which values are formatted in.
    pub sample_unit: &'a str,
    /// The queried range, Unix ms: the legend's time is its end, the duration its length.
    pub start_ms: i64,
    pub end_ms: i64,
}

/// The DOT text of `stacks` (root-first function names → self value), drawing at most
/// `max_nodes` nodes (0: all).
pub fn render(stacks: &BTreeMap<Vec<String>, i64>, max_nodes: usize, meta: &Meta<'_>) -> String {
    let mut names: Vec<&str> = Vec::new();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let samples: Vec<(Vec<usize>, i64)> = stacks
        .iter()
        .filter(|(_, v)| **v != 0)
        .map(|(stack, v)| {
            let frames = stack
                .iter()
                .map(|f| {
                    *ids.entry(f.as_str()).or_insert_with(|| {
                        names.push(f);
                        names.len() - 1
                    })
                })
                .collect();
            (frames, *v)
        })
        .collect();
    let total: i64 = samples.iter().map(|(_, v)| v.abs()).sum();

    let mut graph = Graph::build(&names, &samples, None);
    graph.sort(&names);
    let all_nodes = graph.nodes.len();
    if max_nodes > 0 && max_nodes < graph.nodes.len() {
        let kept: HashSet<usize> = graph.nodes[..max_nodes].iter().map(|n| n.func).collect();
        graph = Graph::build(&names, &samples, Some(&kept));
        graph.sort(&names);
    }
    graph.remove_redundant_edges(&names);

    let mut legend = vec![format!("Type: {}", meta.sample_type)];
    let end_nanos = i128::from(meta.end_ms) * 1_000_000;
    let duration_nanos = (i128::from(meta.end_ms) - i128::from(meta.start_ms)) * 1_000_000;
    if end_nanos != 0 {
        legend.push(format!("Time: {}", format_time(meta.end_ms)));
    }
    let value = |v: i64| scaled_label(v as f64, meta.sample_unit, "");
    if duration_nanos != 0 {
        let (total_nanos, unit) = scale(total as f64, meta.sample_unit, "nanoseconds");
        let ratio = if unit == "ns" && total_nanos != 0.0 {
            format!(
                "({})",
                percentage(total_nanos.trunc(), duration_nanos as f64)
            )
        } else {
            String::new()
        };
        legend.push(format!(
            "Duration: {}, Total samples = {} {ratio}",
            scaled_label(duration_nanos as f64, "nanoseconds", "auto"),
            value(total)
        ));
    }
    let flat_sum: i64 = graph.nodes.iter().map(|n| n.flat).sum();
    legend.push(format!(
        "Showing nodes accounting for {}, {} of {} total",
        value(flat_sum),
        percentage(flat_sum as f64, total as f64).trim(),
        value(total)
    ));
    if total != 0 && !graph.nodes.is_empty() && graph.nodes.len() < all_nodes {
        legend.push(format!(
            "Showing top {} nodes out of {all_nodes}",
            graph.nodes.len()
        ));
    }
    legend.push("\nSee https://git.io/JfYMW for how to read the graph".into());
    graph.write(&names, &legend, total, &value)
}

/// A function's node: what ran in it (flat) and under it (cumulative).
#[derive(Debug, Clone)]
struct Node {
    func: usize,
    flat: i64,
    cum: i64,
}

/// A call edge: the value of the stacks through it; residual when functions between its ends
/// were left out.
#[derive(Debug, Clone, Copy)]
struct Edge {
    weight: i64,
    residual: bool,
}

#[derive(Debug, Default)]
struct Graph {
    nodes: Vec<Node>,
    /// (caller node, callee node) → edge.
    edges: BTreeMap<(usize, usize), Edge>,
}

/// How a function is called in the graph: its name, or `<unknown>` for an empty one.
fn printable<'a>(names: &[&'a str], func: usize) -> &'a str {
    match names[func] {
        "" => "<unknown>",
        n => n,
    }
}

impl Graph {
    /// The graph of `samples` (function ids root first, value); with `kept`, only those
    /// functions are nodes and calls through the others become residual edges.
    fn build(names: &[&str], samples: &[(Vec<usize>, i64)], kept: Option<&HashSet<usize>>) -> Self {
        let mut g = Self::default();
        let mut node_of: Vec<Option<usize>> = vec![None; names.len()];
        let mut seen_nodes = HashSet::new();
        let mut seen_edges = HashSet::new();
        for (frames, w) in samples {
            seen_nodes.clear();
            seen_edges.clear();
            let mut parent: Option<usize> = None;
            let mut residual = false;
            for &f in frames {
                if kept.is_some_and(|k| !k.contains(&f)) {
                    residual = true;
                    continue;
                }
                let n = *node_of[f].get_or_insert_with(|| {
                    g.nodes.push(Node {
                        func: f,
                        flat: 0,
                        cum: 0,
                    });
                    g.nodes.len() - 1
                });
                // A function counts once per stack, however often it recurses.
                if seen_nodes.insert(n) {
                    g.nodes[n].cum += w;
                }
                if let Some(p) = parent
                    && p != n
                    && seen_edges.insert((p, n))
                {
                    let e = g.edges.entry((p, n)).or_insert(Edge {
                        weight: 0,
                        residual: false,
                    });
                    e.weight += w;
                    e.residual |= residual;
                }
                parent = Some(n);
                residual = false;
            }
            if let Some(p) = parent
                && !residual
            {
                g.nodes[p].flat += w;
            }
        }
        g
    }

    /// Orders the nodes by entropy score (pprof's order for drawn graphs), ties by name.
    fn sort(&mut self, names: &[&str]) {
        let mut ins: Vec<Vec<i64>> = vec![Vec::new(); self.nodes.len()];
        let mut outs: Vec<Vec<i64>> = vec![Vec::new(); self.nodes.len()];
        for (&(from, to), e) in &self.edges {
            outs[from].push(e.weight);
            ins[to].push(e.weight);
        }
        let scores: Vec<i64> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| entropy_score(n, &ins[i], &outs[i]))
            .collect();
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by(|&a, &b| {
            let (na, nb) = (&self.nodes[a], &self.nodes[b]);
            scores[b]
                .abs()
                .cmp(&scores[a].abs())
                .then_with(|| printable(names, na.func).cmp(printable(names, nb.func)))
                .then_with(|| nb.flat.abs().cmp(&na.flat.abs()))
        });
        let mut position = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            position[old] = new;
        }
        self.nodes = order.iter().map(|&i| self.nodes[i].clone()).collect();
        self.edges = std::mem::take(&mut self.edges)
            .into_iter()
            .map(|((from, to), e)| ((position[from], position[to]), e))
            .collect();
    }

    /// Edges in drawing order: heaviest first, then by caller and callee name.
    fn edge_order(
        &self,
        names: &[&str],
        a: &(usize, usize),
        b: &(usize, usize),
    ) -> std::cmp::Ordering {
        let name = |n: usize| printable(names, self.nodes[n].func);
        self.edges[b]
            .weight
            .abs()
            .cmp(&self.edges[a].weight.abs())
            .then_with(|| name(a.0).cmp(name(b.0)))
            .then_with(|| name(a.1).cmp(name(b.1)))
    }

    /// Drops residual edges whose ends another path connects, lightest first, from the last node
    /// up, never past an edge that is not residual.
    fn remove_redundant_edges(&mut self, names: &[&str]) {
        // Each node's callers, kept up to date as edges go.
        let mut callers: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for &(from, to) in self.edges.keys() {
            callers[to].push(from);
        }
        for n in (0..self.nodes.len()).rev() {
            let mut incoming: Vec<(usize, usize)> =
                callers[n].iter().map(|&from| (from, n)).collect();
            incoming.sort_by(|a, b| self.edge_order(names, a, b));
            for e in incoming.into_iter().rev() {
                if !self.edges[&e].residual {
                    break;
                }
                if reachable_without(&callers, e) {
                    self.edges.remove(&e);
                    callers[e.1].retain(|&from| from != e.0);
                }
            }
        }
    }

    fn write(
        &self,
        names: &[&str],
        legend: &[String],
        total: i64,
        value: &dyn Fn(i64) -> String,
    ) -> String {
        let mut out = String::new();
        out.push_str("digraph \"unnamed\" {\n");
        out.push_str("node [style=filled fillcolor=\"#f8f8f8\"]\n");
        let escaped: Vec<String> = legend.iter().map(|l| escape(l)).collect();
        let _ = writeln!(
            out,
            "subgraph cluster_L {{ \"{}\" [shape=box fontsize=16 label=\"{}\\l\"] }}",
            escaped[0],
            escaped.join("\\l")
        );
        let max_flat = self.nodes.iter().map(|n| n.flat.abs()).max().unwrap_or(0) as f64;
        let share = |v: i64| v as f64 / (total.abs() as f64);
        for (i, n) in self.nodes.iter().enumerate() {
            let id = i + 1;
            let flat = value(n.flat);
            let mut label = multiline_name(printable(names, n.func));
            if n.flat != 0 {
                let _ = write!(
                    label,
                    "{flat} ({})",
                    percentage(n.flat as f64, total as f64).trim()
                );
            } else {
                label.push('0');
            }
            let mut cum = flat.clone();
            if n.cum != n.flat {
                label.push_str(if n.flat != 0 { "\\n" } else { " " });
                cum = value(n.cum);
                let _ = write!(
                    label,
                    "of {cum} ({})",
                    percentage(n.cum as f64, total as f64).trim()
                );
            }
            let mut font_size = 8;
            if max_flat != 0.0 && n.flat != 0 && n.flat.abs() as f64 <= max_flat {
                font_size += (16.0 * (n.flat.abs() as f64 / max_flat).sqrt()).ceil() as i64;
            }
            let _ = writeln!(
                out,
                "N{id} [label=\"{label}\" id=\"node{id}\" fontsize={font_size} shape=box \
                 tooltip=\"{} ({cum})\" color=\"{}\" fillcolor=\"{}\"]",
                escape(printable(names, n.func)),
                dot_color(share(n.cum), false),
                dot_color(share(n.cum), true),
            );
        }
        let mut edges: Vec<(usize, usize)> = self.edges.keys().copied().collect();
        edges.sort_by(|a, b| self.edge_order(names, a, b));
        for (from, to) in edges {
            let e = self.edges[&(from, to)];
            let w = value(e.weight);
            let mut attr = format!("label=\" {w}\"");
            if total != 0 {
                let part = |scale: i128, cap: i128| {
                    1 + (i128::from(e.weight) * scale / i128::from(total))
                        .abs()
                        .min(cap)
                };
                let weight = part(100, 100);
                if weight > 1 {
                    let _ = write!(attr, " weight={weight}");
                }
                let width = part(5, 5);
                if width > 1 {
                    let _ = write!(attr, " penwidth={width}");
                }
                let _ = write!(attr, " color=\"{}\"", dot_color(share(e.weight), false));
            }
            let arrow = if e.residual { "..." } else { "->" };
            let tooltip = format!(
                "\"{} {arrow} {} ({w})\"",
                escape(printable(names, self.nodes[from].func)),
                escape(printable(names, self.nodes[to].func)),
            );
            let _ = write!(attr, " tooltip={tooltip} labeltooltip={tooltip}");
            if e.residual {
                attr.push_str(" style=\"dotted\"");
            }
            let _ = writeln!(out, "N{} -> N{} [{attr}]", from + 1, to + 1);
        }
        out.push_str("}\n");
        out
    }
}

/// Whether `e`'s caller reaches its callee by another path, walking callers back from the callee.
fn reachable_without(callers: &[Vec<usize>], e: (usize, usize)) -> bool {
    let (src, dest) = e;
    let mut seen = HashSet::from([dest]);
    let mut queue = VecDeque::from([dest]);
    while let Some(n) = queue.pop_front() {
        for &from in &callers[n] {
            if (from, n) == e || seen.contains(&from) {
                continue;
            }
            if from == src {
                return true;
            }
            seen.insert(from);
            queue.push_back(from);
        }
    }
    false
}

/// pprof's node score: entry points and leaves score 1 on their side, otherwise the entropy of
/// the values through their edges; times the cumulative value, plus the flat value.
fn entropy_score(n: &Node, ins: &[i64], outs: &[i64]) -> i64 {
    let side = |edges: &[i64], self_value: i64| {
        if edges.is_empty() {
            1.0
        } else {
            edge_entropy(edges, self_value)
        }
    };
    let score = side(ins, 0) + side(outs, n.flat);
    (score * n.cum as f64) as i64 + n.flat
}

fn edge_entropy(edges: &[i64], self_value: i64) -> f64 {
    let total = self_value
        + edges
            .iter()
            .filter(|w| **w > 0)
            .map(|w| w.abs())
            .sum::<i64>();
    if total == 0 {
        return 0.0;
    }
    let term = |v: i64| {
        let frac = v.abs() as f64 / total as f64;
        -frac * frac.log2()
    };
    let mut score: f64 = edges.iter().map(|w| term(*w)).sum();
    if self_value > 0 {
        score += term(self_value);
    }
    score
}

/// Escapes `\` and `"` for a DOT string; a newline becomes a left-justified line break.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\l")
}

/// A node's name on several lines: shortened, broken at `::` and `.`, ending in a line break.
fn multiline_name(name: &str) -> String {
    let name = escape(&shorten(name))
        .replace("::", "\\n")
        // Go's pprof writes type parameters as `[...]`: keep them on one line.
        .replace("[...]", "[…]")
        .replace('.', "\\n");
    format!("{name}\\n")
}

static CPP_ANONYMOUS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\(anonymous namespace\)::").expect("valid regex"));
static GO_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(.*?)/v(?:[2-9]|[1-9][0-9]+)([./].*)$").expect("valid regex"));
/// Go (`pkg/path.Func`), Java (`pkg.Class.method(args)`) and C++ (`ns::Class::method`) names,
/// as pprof shortens them.
static SHORTENERS: LazyLock<[Regex; 3]> = LazyLock::new(|| {
    [
        r"^(?:[0-9A-Za-z_\-.]+/)+([^.]+\..+)",
        r"^(?:[a-z][0-9A-Za-z_]*\.)*([A-Z][0-9A-Za-z_$]*\.(?:<init>|[a-z][0-9A-Za-z_$]*(?:\$[0-9]+)?))(?:\(|$)",
        r"^(?:[_a-zA-Z][0-9A-Za-z_]*::)+(_*[A-Z][0-9A-Za-z_]*::~?[_a-zA-Z][0-9A-Za-z_]*(?:<.*>)?)",
    ]
    .map(|re| Regex::new(re).expect("valid regex"))
});

/// A function name without its package path, module version, Java package and arguments, or
/// C++ namespaces.
pub(super) fn shorten(name: &str) -> String {
    let name = CPP_ANONYMOUS.replace(name, "");
    let name = GO_VERSION.replace(&name, "${1}${2}");
    SHORTENERS
        .iter()
        .find_map(|re| re.captures(&name).and_then(|c| c.get(1)))
        .map_or_else(|| name.to_string(), |m| m.as_str().to_owned())
}

/// A share of `total` in percent, as pprof prints it: `  100%`, `12.34%`, ` 0.12%`, `5e-05%`.
pub(super) fn percentage(value: f64, total: f64) -> String {
    let ratio = if total != 0.0 {
        (value / total).abs() * 100.0
    } else {
        0.0
    };
    if (99.95..=100.05).contains(&ratio) {
        "  100%".into()
    } else if ratio >= 1.0 {
        format!("{ratio:5.2}%")
    } else {
        format!("{:>5}%", format_g2(ratio))
    }
}

/// `x` with two significant digits, as Go's `%.2g` writes it.
fn format_g2(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:.1e}");
    let (mantissa, exp) = sci.split_once('e').expect("scientific notation");
    let exp: i32 = exp.parse().expect("an exponent");
    let trim = |s: &str| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..2).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa), exp.abs());
    }
    let decimals = usize::try_from(1 - exp).unwrap_or(0);
    trim(&format!("{x:.decimals$}"))
}

/// A unit of measurement: its name, the aliases it is written as, its size in base units.
struct Unit {
    name: &'static str,
    aliases: &'static [&'static str],
    factor: f64,
}

/// Units of one kind (bytes, time, GCU) and the one values default to.
struct UnitKind {
    units: &'static [Unit],
    default: (&'static str, f64),
}

const UNIT_KINDS: [UnitKind; 3] = [
    UnitKind {
        units: &[
            Unit {
                name: "B",
                aliases: &["b", "byte"],
                factor: 1.0,
            },
            Unit {
                name: "kB",
                aliases: &["kb", "kbyte", "kilobyte"],
                factor: 1024.0,
            },
            Unit {
                name: "MB",
                aliases: &["mb", "mbyte", "megabyte"],
                factor: 1048576.0,
            },
            Unit {
                name: "GB",
                aliases: &["gb", "gbyte", "gigabyte"],
                factor: 1073741824.0,
            },
            Unit {
                name: "TB",
                aliases: &["tb", "tbyte", "terabyte"],
                factor: 1099511627776.0,
            },
            Unit {
                name: "PB",
                aliases: &["pb", "pbyte", "petabyte"],
                factor: 1125899906842624.0,
            },
        ],
        default: ("B", 1.0),
    },
    UnitKind {
        units: &[
            Unit {
                name: "ns",
                aliases: &["ns", "nanosecond"],
                factor: 1.0,
            },
            Unit {
                name: "us",
                aliases: &["μs", "us", "microsecond"],
                factor: 1e3,
            },
            Unit {
                name: "ms",
                aliases: &["ms", "millisecond"],
                factor: 1e6,
            },
            Unit {
                name: "s",
                aliases: &["s", "sec", "second"],
                factor: 1e9,
            },
            Unit {
                name: "hrs",
                aliases: &["hour", "hr"],
                factor: 3.6e12,
            },
        ],
        default: ("s", 1e9),
    },
    UnitKind {
        units: &[
            Unit {
                name: "n*GCU",
                aliases: &["nanogcu"],
                factor: 1e-9,
            },
            Unit {
                name: "u*GCU",
                aliases: &["microgcu"],
                factor: 1e-6,
            },
            Unit {
                name: "m*GCU",
                aliases: &["milligcu"],
                factor: 1e-3,
            },
            Unit {
                name: "GCU",
                aliases: &["gcu"],
                factor: 1.0,
            },
            Unit {
                name: "k*GCU",
                aliases: &["kilogcu"],
                factor: 1e3,
            },
            Unit {
                name: "M*GCU",
                aliases: &["megagcu"],
                factor: 1e6,
            },
            Unit {
                name: "G*GCU",
                aliases: &["gigagcu"],
                factor: 1e9,
            },
            Unit {
                name: "T*GCU",
                aliases: &["teragcu"],
                factor: 1e12,
            },
            Unit {
                name: "P*GCU",
                aliases: &["petagcu"],
                factor: 1e15,
            },
        ],
        default: ("GCU", 1.0),
    },
];

impl UnitKind {
    /// The unit written as `unit` (any case; a plural `s` dropped past two bytes).
    fn find(&self, unit: &str) -> Option<&Unit> {
        let lower = unit.to_lowercase();
        let alias = if lower.len() > 2 {
            lower.strip_suffix('s').unwrap_or(&lower)
        } else {
            &lower
        };
        self.units.iter().find(|u| u.aliases.contains(&alias))
    }
}

/// `value` in `from` units converted to `to` (`auto`: the largest unit it is at least one of;
/// a unit of another kind or none: the kind's default), with the unit's name; values of an
/// unknown unit stay as they are.
fn scale(value: f64, from: &str, to: &str) -> (f64, String) {
    if value < 0.0 {
        let (v, u) = scale(-value, from, to);
        return (-v, u);
    }
    for kind in &UNIT_KINDS {
        let Some(from) = kind.find(from) else {
            continue;
        };
        let base = value * from.factor;
        if to == "auto" || to == "minimum" {
            let best = kind.units.iter().fold(None::<&Unit>, |best, u| {
                let fits = base / u.factor >= 1.0;
                match best {
                    Some(b) if fits && u.factor >= b.factor => Some(u),
                    None if fits => Some(u),
                    other => other,
                }
            });
            return match best {
                Some(u) => (base / u.factor, u.name.into()),
                None => (base / kind.default.1, kind.default.0.into()),
            };
        }
        return match kind.find(to) {
            Some(u) => (base / u.factor, u.name.into()),
            None => (base / kind.default.1, kind.default.0.into()),
        };
    }
    match to {
        "count" | "sample" | "unit" | "minimum" | "auto" => (value, String::new()),
        other => (value, other.into()),
    }
}

/// A value with its unit, two decimals unless whole: `1.50s`, `2MB`, `42`.
pub(super) fn scaled_label(value: f64, from: &str, to: &str) -> String {
    let (v, unit) = scale(value, from, to);
    let text = format_fixed2(v);
    let text = text.strip_suffix(".00").unwrap_or(&text);
    if text == "0" || text == "-0" {
        return "0".into();
    }
    format!("{text}{unit}")
}

/// `v` with two decimals, ties to even on the exact binary value (as Go's `%.2f`).
fn format_fixed2(v: f64) -> String {
    format!("{v:.2}")
}

/// A time as pprof's legend writes it, in UTC: `Jan 2, 2006 at 3:04pm (UTC)`.
fn format_time(unix_ms: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = unix_ms.div_euclid(1_000);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let (hour, minute) = (of_day / 3_600, of_day % 3_600 / 60);
    let (h12, half) = match hour {
        0 => (12, "am"),
        h @ 1..=11 => (h, "am"),
        12 => (12, "pm"),
        h => (h - 12, "pm"),
    };
    format!(
        "{} {d}, {y} at {h12}:{minute:02}{half} (UTC)",
        MONTHS[(m - 1) as usize]
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Years start in March, so the leap day ends a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let d = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let m = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let y = year_of_era + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// pprof's colour for a share in [-1, 1]: grey near 0, redder towards 1 (greener towards -1);
/// light for backgrounds.
fn dot_color(score: f64, background: bool) -> String {
    const SHIFT: f64 = 0.7;
    let (mut saturation, value) = if background { (0.1, 0.93) } else { (1.0, 0.7) };
    let mut score = score.clamp(-1.0, 1.0);
    if score.abs() < 0.2 {
        saturation *= score.abs() / 0.2;
    }
    if score > 0.0 {
        score = score.powf(1.0 - SHIFT);
    }
    if score < 0.0 {
        score = -(-score).powf(1.0 - SHIFT);
    }
    let (r, g) = if score < 0.0 {
        (value * (1.0 + saturation * score), value)
    } else {
        (value, value * (1.0 - saturation * score))
    };
    let b = value * (1.0 - saturation);
    let byte = |c: f64| (c * 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}
