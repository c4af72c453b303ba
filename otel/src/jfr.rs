//! JFR (Java Flight Recorder) recordings → [`NormalizedProfile`], as Pyroscope's JFR converter
//! (grafana/jfr-parser) turns them into profiles. The format is read by [`reader`], Kiln's own
//! parser (ADR 0009 says why not a crate).
//!
//! | JFR event | profile type | value |
//! |---|---|---|
//! | `jdk.ExecutionSample` (thread not sleeping) | `process_cpu:cpu:nanoseconds:cpu:nanoseconds` | the sampling period |
//! | `profiler.WallClockSample`, and `jdk.ExecutionSample` when the recording's `event` setting is `wall` | `wall:wall:nanoseconds:wall:nanoseconds` | samples × the period |
//! | `jdk.ObjectAllocationInNewTLAB` | `memory:alloc_in_new_tlab_objects:count:space:bytes`, `memory:alloc_in_new_tlab_bytes:bytes:space:bytes` | 1, the TLAB size |
//! | `jdk.ObjectAllocationOutsideTLAB` | `memory:alloc_outside_tlab_{objects,bytes}` | 1, the allocation size |
//! | `jdk.ObjectAllocationSample` | `memory:alloc_sample_{objects,bytes}` | 1, the weight |
//! | `jdk.JavaMonitorEnter` | `mutex:contentions:count:mutex:count`, `mutex:delay:nanoseconds:mutex:count` | 1, the duration (ticks, as Pyroscope) |
//! | `jdk.ThreadPark` | `block:contentions:count:block:count`, `block:delay:nanoseconds:block:count` | 1, the duration (ticks, as Pyroscope) |
//! | `profiler.LiveObject` | `memory:live:count:objects:count` | 1 |
//! | `profiler.Malloc` | `memory:malloc_objects:count::`, `memory:malloc_bytes:bytes::` | 1, the size |
//!
//! The sampling period is the request's `sampleRate` when it gives one (what Pyroscope's Java SDK
//! sends), else the recording's own `period` setting of `jdk.ExecutionSample` (10 ms in the JDK's
//! `profile` settings, 20 ms in `default`), else 10 ms. Frames are named `class.method` with the
//! class's internal name (`java/lang/Thread.run`); generated classes (lambdas, reflection
//! accessors, CGLIB proxies) lose their per-process suffix, as Pyroscope merges them.
//!
//! A sample's context id (async-profiler with Pyroscope's labels) selects its labels from the
//! request's [`LabelsSnapshot`]; they become series labels, a span id becomes the sample's span
//! and a span name the `span_name` label. Series labels also carry `jfr_event` (the recording's
//! `event` setting, when it has one).
//!
//! Lock and park delays are the events' durations as recorded, in ticks of the recording's
//! clock, as Pyroscope stores them (grafana/jfr-parser's pprof conversion never reads the chunk's
//! `ticksPerSecond`): nanoseconds on the JDK's Linux clock, but not on async-profiler's TSC clock,
//! where they are ticks under a `nanoseconds` unit. Kiln keeps Pyroscope's numbers so the same
//! recording gives the same totals in both (a recording at 2.8 GHz shows 2.8× its delays).

pub mod reader;

use std::collections::HashMap;

use reader::{Budget, Chunk, Value};

use crate::ids::parse_span_id;
use crate::labels::validate_series_labels;
use crate::model::{
    Function, LABEL_NAME, Line, Lines, Location, NormalizedProfile, ProfileType, Series, Symbols,
};
use crate::normalize::kernel::{self, FastMap, SampleKey, SeriesBuilder};
use crate::normalize::{IngestMeta, NormalizeLimits};
use crate::{Error, Result};

/// The labels of a recording's samples, by context id (the multipart `labels` part that
/// Pyroscope's Java SDK sends beside the recording).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelsSnapshot {
    #[prost(map = "int64, message", tag = "1")]
    pub contexts: HashMap<i64, Context>,
    #[prost(map = "int64, string", tag = "2")]
    pub strings: HashMap<i64, String>,
}

/// The labels of one context: string ids of names and values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Context {
    #[prost(map = "int64, int64", tag = "1")]
    pub labels: HashMap<i64, i64>,
}

impl LabelsSnapshot {
    /// Decodes a snapshot (plain protobuf; inflate it first).
    pub fn decode(data: &[u8]) -> Result<Self> {
        kiln_proto::wire::decode(data)
            .map_err(|e| Error::Invalid(format!("invalid JFR labels (LabelsSnapshot): {e}")))
    }
}

/// Label naming the recording's `event` setting.
pub const LABEL_JFR_EVENT: &str = "jfr_event";
/// Label carrying a sample's span name.
pub const LABEL_SPAN_NAME: &str = "span_name";

/// Period when neither the request nor the recording gives one.
const DEFAULT_PERIOD_NANOS: i64 = 10_000_000;

/// What a JFR event becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Cpu,
    Wall,
    InNewTlab,
    OutsideTlab,
    Lock,
    ThreadPark,
    LiveObject,
    AllocSample,
    Malloc,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::Cpu,
        Kind::Wall,
        Kind::InNewTlab,
        Kind::OutsideTlab,
        Kind::Lock,
        Kind::ThreadPark,
        Kind::LiveObject,
        Kind::AllocSample,
        Kind::Malloc,
    ];

    fn metric(self) -> &'static str {
        match self {
            Kind::Cpu => "process_cpu",
            Kind::Wall => "wall",
            Kind::Lock => "mutex",
            Kind::ThreadPark => "block",
            _ => "memory",
        }
    }

    fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Cpu => &[("cpu", "nanoseconds")],
            Kind::Wall => &[("wall", "nanoseconds")],
            Kind::InNewTlab => &[
                ("alloc_in_new_tlab_objects", "count"),
                ("alloc_in_new_tlab_bytes", "bytes"),
            ],
            Kind::OutsideTlab => &[
                ("alloc_outside_tlab_objects", "count"),
                ("alloc_outside_tlab_bytes", "bytes"),
            ],
            Kind::Lock | Kind::ThreadPark => &[("contentions", "count"), ("delay", "nanoseconds")],
            Kind::LiveObject => &[("live", "count")],
            Kind::AllocSample => &[
                ("alloc_sample_objects", "count"),
                ("alloc_sample_bytes", "bytes"),
            ],
            Kind::Malloc => &[("malloc_objects", "count"), ("malloc_bytes", "bytes")],
        }
    }

    fn period(self) -> (&'static str, &'static str) {
        match self {
            Kind::Cpu => ("cpu", "nanoseconds"),
            Kind::Wall => ("wall", "nanoseconds"),
            Kind::InNewTlab | Kind::OutsideTlab | Kind::AllocSample => ("space", "bytes"),
            Kind::Lock => ("mutex", "count"),
            Kind::ThreadPark => ("block", "count"),
            Kind::LiveObject => ("objects", "count"),
            Kind::Malloc => ("", ""),
        }
    }
}

/// The JFR events read, by class name.
const EXECUTION_SAMPLE: &str = "jdk.ExecutionSample";
const WALL_CLOCK_SAMPLE: &str = "profiler.WallClockSample";
const ACTIVE_SETTING: &str = "jdk.ActiveSetting";
const EVENTS: [&str; 10] = [
    EXECUTION_SAMPLE,
    WALL_CLOCK_SAMPLE,
    "jdk.ObjectAllocationInNewTLAB",
    "jdk.ObjectAllocationOutsideTLAB",
    "jdk.ObjectAllocationSample",
    "jdk.JavaMonitorEnter",
    "jdk.ThreadPark",
    "profiler.LiveObject",
    "profiler.Malloc",
    ACTIVE_SETTING,
];

/// Parses a recording (plain, not gzip) into a normalized profile: one series per event kind,
/// sample type and label set. `meta.labels` are the series labels every series gets
/// (`service_name`, `pyroscope_spy`, the request's); `sample_rate` is the request's, if it gave
/// one.
pub fn parse(
    recording: &[u8],
    labels: &LabelsSnapshot,
    sample_rate: Option<u32>,
    meta: &IngestMeta,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    if recording.is_empty() {
        return Err(Error::Invalid("the JFR recording is empty".into()));
    }
    let mut converter = Converter {
        labels,
        limits,
        symbols: Symbols::default(),
        functions: FastMap::default(),
        locations: FastMap::default(),
        builders: FastMap::default(),
        event: String::new(),
        period: sample_rate
            .filter(|r| *r > 0)
            .map(|r| 1_000_000_000 / i64::from(r)),
        samples: 0,
        series_labels: Vec::new(),
        stack: Vec::new(),
    };
    let explicit_period = converter.period.is_some();
    // Each decoded value costs one; a real recording decodes to far fewer values than bytes.
    let mut budget = Budget(recording.len().saturating_mul(4).saturating_add(1 << 16));
    let wanted = |name: &str| EVENTS.contains(&name);
    let mut at = 0;
    while at < recording.len() {
        let chunk = Chunk::read(recording, at, &wanted, &mut budget)?;
        converter.chunk(&chunk, explicit_period, &mut budget)?;
        at += chunk.header.size;
    }
    converter.finish(meta)
}

struct Converter<'a> {
    labels: &'a LabelsSnapshot,
    limits: &'a NormalizeLimits,
    symbols: Symbols,
    /// Function index by name.
    functions: FastMap<String, u32>,
    /// Location index by function and line.
    locations: FastMap<(u32, i64), u32>,
    builders: FastMap<Kind, SeriesBuilder<Vec<(String, String)>>>,
    /// The recording's `event` setting (async-profiler: cpu, itimer, wall, ...).
    event: String,
    /// Nanoseconds a CPU or wall sample stands for; `None` until known.
    period: Option<i64>,
    samples: usize,
    /// Buffers reused from sample to sample.
    series_labels: Vec<(String, String)>,
    stack: Vec<u32>,
}

/// What one chunk's constants resolve to, cached for the chunk.
#[derive(Default)]
struct ChunkCache {
    /// Location indices of a stack trace key, leaf first, untruncated.
    stacks: FastMap<i64, Vec<u32>>,
    /// Function index of a method key (`None`: the method or its class is missing).
    methods: FastMap<i64, Option<u32>>,
}

impl Converter<'_> {
    fn chunk(
        &mut self,
        chunk: &Chunk<'_>,
        explicit_period: bool,
        budget: &mut Budget,
    ) -> Result<()> {
        let classes = &chunk.classes;
        let name_of = |ty: i64| classes.get(ty).map(|c| c.name.as_str()).unwrap_or_default();
        let execution_sample = classes.id_of(EXECUTION_SAMPLE);
        // Settings first: they apply to the chunk's samples wherever they are written.
        for &(ty, pos) in &chunk.events {
            if name_of(ty) != ACTIVE_SETTING {
                continue;
            }
            let ev = chunk.event(pos, budget)?;
            let name = chunk.raw_field(&ev, "name").and_then(|v| chunk.text(v));
            let value = chunk.raw_field(&ev, "value").and_then(|v| chunk.text(v));
            let id = chunk.raw_field(&ev, "id").and_then(|v| chunk.int(v));
            match (name, value) {
                (Some("event"), Some(value)) => self.event = value.to_owned(),
                (Some("period"), Some(value))
                    if !explicit_period && id.is_some() && id == execution_sample =>
                {
                    if let Some(p) = parse_period(value) {
                        self.period = Some(p);
                    }
                }
                _ => {}
            }
        }
        let events = chunk
            .events
            .iter()
            .filter(|(ty, _)| name_of(*ty) != ACTIVE_SETTING)
            .count();
        self.samples += events;
        kernel::check_sample_count(self.samples, self.limits)?;

        let period = self.period.unwrap_or(DEFAULT_PERIOD_NANOS);
        let wall_mode = self.event == "wall";
        let mut cache = ChunkCache::default();
        for &(ty, pos) in &chunk.events {
            let name = name_of(ty);
            if name == ACTIVE_SETTING {
                continue;
            }
            let ev = chunk.event(pos, budget)?;
            let int = |field: &str| chunk.raw_field(&ev, field).and_then(|v| chunk.int(v));
            let state = || chunk.raw_field(&ev, "state").and_then(|v| chunk.text(v));
            let mut add = |this: &mut Self, kind: Kind, values: &[i64]| -> Result<()> {
                this.add(chunk, &mut cache, &ev, kind, values)
            };
            match name {
                EXECUTION_SAMPLE => {
                    if state() != Some("STATE_SLEEPING") {
                        add(self, Kind::Cpu, &[period])?;
                    }
                    if wall_mode {
                        add(self, Kind::Wall, &[period])?;
                    }
                }
                WALL_CLOCK_SAMPLE => {
                    let samples = int("samples").unwrap_or(1);
                    if wall_mode && state() == Some("STATE_RUNNABLE") {
                        add(self, Kind::Cpu, &[samples.saturating_mul(period)])?;
                    }
                    add(self, Kind::Wall, &[samples.saturating_mul(period)])?;
                }
                "jdk.ObjectAllocationInNewTLAB" => {
                    add(self, Kind::InNewTlab, &[1, int("tlabSize").unwrap_or(0)])?
                }
                "jdk.ObjectAllocationOutsideTLAB" => add(
                    self,
                    Kind::OutsideTlab,
                    &[1, int("allocationSize").unwrap_or(0)],
                )?,
                "jdk.ObjectAllocationSample" => {
                    add(self, Kind::AllocSample, &[1, int("weight").unwrap_or(0)])?
                }
                // The duration in the recording's ticks, as Pyroscope stores it (see the module doc).
                "jdk.JavaMonitorEnter" => {
                    add(self, Kind::Lock, &[1, int("duration").unwrap_or(0)])?
                }
                "jdk.ThreadPark" => {
                    add(self, Kind::ThreadPark, &[1, int("duration").unwrap_or(0)])?
                }
                "profiler.LiveObject" => add(self, Kind::LiveObject, &[1])?,
                "profiler.Malloc" => add(self, Kind::Malloc, &[1, int("size").unwrap_or(0)])?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Adds an event's stack with `values` (one per sample type of `kind`).
    fn add(
        &mut self,
        chunk: &Chunk<'_>,
        cache: &mut ChunkCache,
        ev: &Value,
        kind: Kind,
        values: &[i64],
    ) -> Result<()> {
        let Some(Value::Ref { key: stack_key, .. }) = chunk.raw_field(ev, "stackTrace") else {
            return Ok(()); // no stack trace: Pyroscope skips the sample too
        };
        let stack_key = *stack_key;
        if !cache.stacks.contains_key(&stack_key) {
            let Some(trace) = chunk.field(ev, "stackTrace") else {
                return Ok(());
            };
            let frames = match chunk.field(trace, "frames") {
                Some(Value::Array(frames)) => frames.as_slice(),
                _ => &[],
            };
            let mut locations = Vec::with_capacity(frames.len());
            for frame in frames {
                let Some(method) = chunk.raw_field(frame, "method") else {
                    continue;
                };
                let function = match method {
                    Value::Ref { key, .. } => match cache.methods.get(key) {
                        Some(f) => *f,
                        None => {
                            let f = self.function(chunk, method);
                            cache.methods.insert(*key, f);
                            f
                        }
                    },
                    _ => self.function(chunk, method),
                };
                let Some(function) = function else {
                    continue; // Pyroscope drops frames of unknown methods and classes
                };
                let line = chunk
                    .raw_field(frame, "lineNumber")
                    .and_then(|v| chunk.int(v))
                    .unwrap_or(0);
                let next = self.symbols.locations.len() as u32;
                let location = *self.locations.entry((function, line)).or_insert(next);
                if location == next {
                    self.symbols.locations.push(Location {
                        lines: Lines::from([Line { function, line }]),
                        ..Default::default()
                    });
                }
                locations.push(location);
            }
            cache.stacks.insert(stack_key, locations);
        }
        let full = &cache.stacks[&stack_key];
        let Ok(()) = kernel::fill_stack(
            &mut self.stack,
            full.iter(),
            self.limits.max_stack_depth,
            |&l| Ok::<_, std::convert::Infallible>(l),
        );

        // Labels of the sample's context, its span and span name.
        self.series_labels.clear();
        let context = chunk
            .raw_field(ev, "contextId")
            .and_then(|v| chunk.int(v))
            .unwrap_or(0);
        if let Some(ctx) = self.labels.contexts.get(&context) {
            for (k, v) in &ctx.labels {
                let (Some(k), Some(v)) = (self.labels.strings.get(k), self.labels.strings.get(v))
                else {
                    continue;
                };
                if !k.is_empty() && !v.is_empty() {
                    self.series_labels.push((k.clone(), v.clone()));
                }
            }
        }
        let span_name = chunk
            .raw_field(ev, "spanName")
            .and_then(|v| chunk.int(v))
            .unwrap_or(0);
        if span_name != 0
            && let Some(name) = self
                .labels
                .strings
                .get(&span_name)
                .filter(|n| !n.is_empty())
        {
            self.series_labels
                .push((LABEL_SPAN_NAME.into(), name.clone()));
        }
        self.series_labels.sort();
        self.series_labels.dedup_by(|a, b| a.0 == b.0);
        let span_id = match chunk.raw_field(ev, "spanId").and_then(|v| chunk.int(v)) {
            Some(id) if id != 0 => parse_span_id(&format!("{:016x}", id as u64)),
            _ => 0,
        };

        let builder = self
            .builders
            .entry(kind)
            .or_insert_with(|| SeriesBuilder::new(kind.sample_types().len()));
        let series = builder.series(self.series_labels.as_slice());
        let key = builder.hash(SampleKey {
            stack: &self.stack,
            span_id,
            ..Default::default()
        });
        for (t, &v) in values.iter().enumerate() {
            builder.add(series, t, &key, v.max(0), self.samples)?;
        }
        Ok(())
    }

    /// The function of a method: `class.method`, symbols merged as Pyroscope merges them;
    /// `None` when the method or its class is missing.
    fn function(&mut self, chunk: &Chunk<'_>, method: &Value) -> Option<u32> {
        let class = chunk.field(method, "type")?;
        let class_name = chunk
            .raw_field(class, "name")
            .and_then(|v| chunk.text(v))
            .unwrap_or("");
        let method_name = chunk
            .raw_field(method, "name")
            .and_then(|v| chunk.text(v))
            .unwrap_or("");
        let name = format!(
            "{}.{}",
            merge_generated(class_name),
            merge_generated(method_name)
        );
        if let Some(&f) = self.functions.get(&name) {
            return Some(f);
        }
        let f = self.symbols.functions.len() as u32;
        self.symbols.functions.push(Function {
            name: name.as_str().into(),
            ..Default::default()
        });
        self.functions.insert(name, f);
        Some(f)
    }

    fn finish(self, meta: &IngestMeta) -> Result<NormalizedProfile> {
        let mut builders: Vec<(Kind, SeriesBuilder<Vec<(String, String)>>)> =
            self.builders.into_iter().collect();
        builders.sort_by_key(|(k, _)| Kind::ALL.iter().position(|x| x == k));
        let mut series = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (kind, builder) in builders {
            for (group_labels, per_type) in builder.finish() {
                let mut labels = meta.labels.clone();
                for (k, v) in group_labels {
                    names.insert(k.clone());
                    labels.set(k, v);
                }
                labels.set(LABEL_NAME.to_owned(), kind.metric().to_owned());
                labels.set(LABEL_JFR_EVENT.to_owned(), self.event.clone());
                validate_series_labels(&labels, &self.limits.labels)?;
                for (t, samples) in per_type.into_iter().enumerate() {
                    if samples.is_empty() {
                        continue;
                    }
                    let (sample_type, sample_unit) = kind.sample_types()[t];
                    let (period_type, period_unit) = kind.period();
                    series.push(Series {
                        labels: labels.clone(),
                        profile_type: ProfileType {
                            name: kind.metric().to_owned(),
                            sample_type: sample_type.to_owned(),
                            sample_unit: sample_unit.to_owned(),
                            period_type: period_type.to_owned(),
                            period_unit: period_unit.to_owned(),
                        },
                        time_nanos: meta.time_nanos,
                        duration_nanos: meta.duration_nanos,
                        samples,
                    });
                }
            }
        }
        if names.len() > self.limits.max_sample_label_names {
            return Err(Error::Invalid(format!(
                "the samples carry {} distinct label names, more than the limit of {}",
                names.len(),
                self.limits.max_sample_label_names
            )));
        }
        Ok(NormalizedProfile {
            symbols: self.symbols,
            series,
        })
    }
}

/// A JFR setting's duration (`10 ms`, `20ms`, `1 s`) in nanoseconds; `None` for anything else
/// (`everyChunk`, `0 ms`).
fn parse_period(value: &str) -> Option<i64> {
    let value = value.trim();
    let split = value.find(|c: char| !c.is_ascii_digit())?;
    let n: i64 = value[..split].parse().ok()?;
    let unit = match value[split..].trim() {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit).filter(|p| *p > 0)
}

/// A class or method name with the per-process part of generated names replaced by `_`, so one
/// lambda or accessor is one frame across processes and restarts (Pyroscope does the same):
/// `jdk/internal/reflect/GeneratedMethodAccessor31` → `…GeneratedMethodAccessor_`,
/// `Main$$Lambda$14/0x0000000800c03000`, `Fib$$Lambda.0x00007ffa600c4da0` and
/// `Busy$$Lambda$88+0x00007f6e14007a08/1790421142` → `…$$Lambda_`,
/// `Shop$$EnhancerBySpringCGLIB$$3f2a` → `Shop$$EnhancerBySpringCGLIB$$_`.
pub fn merge_generated(name: &str) -> std::borrow::Cow<'_, str> {
    const ACCESSOR: &str = "jdk/internal/reflect/GeneratedMethodAccessor";
    if let Some(n) = name.strip_prefix(ACCESSOR)
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return format!("{ACCESSOR}_").into();
    }
    const LAMBDA: &str = "$$Lambda";
    if let Some(i) = name.rfind(LAMBDA).filter(|&i| i > 0) {
        let rest = &name[i + LAMBDA.len()..];
        if lambda_suffix(rest) {
            return format!("{}_", &name[..i + LAMBDA.len()]).into();
        }
    }
    const CGLIB: &str = "$$EnhancerBySpringCGLIB$$";
    if let Some(i) = name.rfind(CGLIB).filter(|&i| i > 0) {
        return format!("{}_", &name[..i + CGLIB.len()]).into();
    }
    name.into()
}

/// What follows `$$Lambda` in a generated class name: `\d+`, or `$?\d*[./+](0x)?[0-9a-f]+`
/// (Pyroscope's forms, the JDK 17 hidden class `$88+0x00007f6e14007a08` among them) optionally
/// followed by `/\d+` (how the JDK's recorder writes the hidden class).
fn lambda_suffix(s: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(s) {
        return true;
    }
    let s = s.strip_prefix('$').unwrap_or(s);
    let s = s.trim_start_matches(|c: char| c.is_ascii_digit());
    let Some(s) = s.strip_prefix(['.', '/', '+']) else {
        return false;
    };
    let s = s.strip_prefix("0x").unwrap_or(s);
    let s = match s.split_once('/') {
        Some((hex, n)) if digits(n) => hex,
        Some(_) => return false,
        None => s,
    };
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests;
