//! Kiln profiles itself (`--self-profile`): the process's CPU is sampled (the `pprof` crate:
//! `SIGPROF` at 100 Hz, stacks unwound from the binary's unwind tables, named from its symbol
//! table), and so is its heap (`--self-profile-heap`: jemalloc's own profiler, one allocation
//! per 512 KiB on average, its dumps read by [`heap`]). Every interval the samples become pprof
//! profiles (CPU time; bytes in use) written through the same path as `/ingest`
//! (normalization, the tenant's limits, a durable write) as `service_name="kiln"`, so Kiln's
//! own flame graphs sit beside the services it serves. ADR 0008.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use kiln_otel::model::Labels;
use kiln_otel::normalize::{self, IngestMeta};
use kiln_proto::google::v1 as pb;
use tracing::{debug, warn};

use crate::app::AppRef;

mod heap;

/// The service name Kiln's own profiles carry.
pub const SERVICE_NAME: &str = "kiln";
/// Samples per second of CPU time.
const FREQUENCY: i32 = 100;
/// Libraries whose frames a sample may not start in: unwinding from inside them can deadlock
/// (the unwinder takes locks they may hold), so such samples are dropped.
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

/// Where and how often Kiln's own profiles go.
#[derive(Debug, Clone)]
pub struct SelfProfile {
    pub tenant: crate::auth::TenantId,
    pub interval: Duration,
    /// Sample the heap too (jemalloc's profiler).
    pub heap: bool,
    /// Labels besides `service_name` (`instance`: this process's listen address).
    pub labels: Vec<(String, String)>,
}

/// Starts the profiler in the background. Sampling runs on a thread of its own; the profiles
/// are written on the runtime and stop with it. Failing to start (another profiler in the
/// process, a platform without `SIGPROF`, a binary without a symbol table) is logged, not fatal.
pub fn spawn(app: AppRef, config: SelfProfile) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(pb::Profile, &'static str)>(4);
    let (interval, heap) = (config.interval, config.heap);
    let sampler = std::thread::Builder::new()
        .name("kiln-self-profile".into())
        .spawn(move || sample(interval, heap, &tx));
    if let Err(e) = sampler {
        warn!(error = %e, "self-profiling off: its thread did not start");
        return;
    }
    tokio::spawn(async move {
        while let Some((profile, name)) = rx.recv().await {
            if let Err(e) = write(&app, &config, &profile, name).await {
                debug!(error = %e.log_text(), tenant = %config.tenant, "self-profile not stored");
            }
        }
    });
}

/// How long one sampler runs before it is started afresh. The sampler keeps its counts from
/// its start (stacks its table has no room for spill to a temporary file), and setting one up
/// costs about 70 MB of tables written at once: so one runs for many intervals, each profile
/// being the difference of its counts from the interval before.
const SAMPLER_LIFETIME: Duration = Duration::from_secs(600);

/// A sample's stack (return addresses, leaf first) and thread, as the sampler counts them.
type StackKey = (Vec<usize>, u64);

/// The `__name__` of Kiln's CPU profiles and of its heap profiles.
const CPU_NAME: &str = "process_cpu";
const HEAP_NAME: &str = "memory";

/// The sampling loop: profiles of every `interval` (CPU, and the heap when `heap` is on), sent
/// to `tx` until its receiver is gone.
fn sample(
    interval: Duration,
    heap: bool,
    tx: &tokio::sync::mpsc::Sender<(pb::Profile, &'static str)>,
) {
    // Off the runtime: the profiler's lock is taken blocking.
    let heap = heap.then(Heap::start).flatten();
    let symbols = match Symbolizer::load() {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "self-profiling off: Kiln cannot read its own symbols");
            return;
        }
    };
    let intervals = (SAMPLER_LIFETIME.as_secs() / interval.as_secs().max(1)).max(1);
    loop {
        let guard = match pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            .blocklist(&BLOCKLIST)
            .build()
        {
            Ok(g) => g,
            Err(e) => {
                warn!(error = %e, "self-profiling could not start; Kiln runs without it");
                return;
            }
        };
        let mut before: HashMap<StackKey, i64> = HashMap::new();
        for _ in 0..intervals {
            let start = std::time::SystemTime::now();
            std::thread::sleep(interval);
            let report = match guard.report().build_unresolved() {
                Ok(r) => r,
                Err(e) => {
                    warn!(error = %e, "self-profile report failed");
                    continue;
                }
            };
            let mut now: HashMap<StackKey, i64> = HashMap::with_capacity(report.data.len());
            for (frames, count) in &report.data {
                let ips = frames.frames.iter().map(|f| f.ip() as usize).collect();
                *now.entry((ips, frames.thread_id)).or_default() += *count as i64;
            }
            let counts = now.iter().filter_map(|(key, &n)| {
                let new = n - before.get(key).copied().unwrap_or(0);
                (new > 0).then_some((key.0.as_slice(), new))
            });
            let profile = to_pprof(counts, &symbols, start, report.timing.frequency);
            before = now;
            if !profile.sample.is_empty() && tx.blocking_send((profile, CPU_NAME)).is_err() {
                return;
            }
            let Some(heap) = &heap else { continue };
            match heap.profile(&symbols) {
                Ok(profile) if profile.sample.is_empty() => {}
                Ok(profile) => {
                    if tx.blocking_send((profile, HEAP_NAME)).is_err() {
                        return;
                    }
                }
                Err(e) => warn!(error = %e, "heap self-profile failed"),
            }
        }
    }
}

async fn write(
    app: &AppRef,
    config: &SelfProfile,
    profile: &pb::Profile,
    name: &str,
) -> Result<(), crate::error::ApiError> {
    let mut labels = Labels::from_pairs([
        (kiln_otel::model::LABEL_SERVICE_NAME, SERVICE_NAME),
        ("__name__", name),
    ]);
    for (k, v) in &config.labels {
        labels.set(k.clone(), v.clone());
    }
    let meta = IngestMeta {
        labels,
        time_nanos: profile.time_nanos,
        duration_nanos: profile.duration_nanos,
        display_names: HashMap::new(),
    };
    let limits = app.limits(&config.tenant).normalize();
    let normalized = normalize::normalize_pprof(&profile.into(), &meta, &limits)?;
    let size = prost::Message::encoded_len(profile);
    crate::app::write::store(app, &config.tenant, vec![normalized], size, None, None).await
}

/// Sample counts by stack (return addresses, leaf first) as a pprof CPU profile that started
/// at `start`, one location per address, the profiler's own frames (its signal handler and the
/// kernel's signal trampoline) removed.
fn to_pprof<'a>(
    counts: impl Iterator<Item = (&'a [usize], i64)>,
    symbols: &Symbolizer,
    start: std::time::SystemTime,
    frequency: i32,
) -> pb::Profile {
    let mut b = Builder::default();
    let period = 1_000_000_000 / i64::from(frequency.max(1));
    let mut ips = Vec::new();
    for (stack, count) in counts {
        // Return addresses point after their call: look up the call itself.
        ips.clear();
        ips.extend(
            stack
                .iter()
                .enumerate()
                .map(|(i, &ip)| ip.saturating_sub(usize::from(i > 0))),
        );
        let own = symbols.own_frames(&ips);
        if own.is_empty() {
            continue;
        }
        let location_id = own.iter().map(|&ip| b.location(symbols, ip)).collect();
        b.samples.push(pb::Sample {
            location_id,
            value: vec![count * period],
            ..Default::default()
        });
    }
    let (cpu, nanos) = (b.string("cpu"), b.string("nanoseconds"));
    let since = start.duration_since(UNIX_EPOCH).unwrap_or_default();
    let duration = start.elapsed().unwrap_or_default();
    pb::Profile {
        sample_type: vec![pb::ValueType {
            r#type: cpu,
            unit: nanos,
        }],
        sample: b.samples,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: i64::try_from(since.as_nanos()).unwrap_or(0),
        duration_nanos: i64::try_from(duration.as_nanos()).unwrap_or(0),
        period_type: Some(pb::ValueType {
            r#type: cpu,
            unit: nanos,
        }),
        period,
        ..Default::default()
    }
}

/// jemalloc's heap profiler, active while Kiln runs with `--self-profile-heap`.
struct Heap(heap::HeapProfiler);

impl Heap {
    /// Turns sampling on; `None` (and a warning) when this jemalloc was built without
    /// profiling or configured without it (`JEMALLOC_SYS_WITH_MALLOC_CONF`, `.cargo/config.toml`).
    fn start() -> Option<Self> {
        match heap::HeapProfiler::start() {
            Ok(Some(p)) => Some(Self(p)),
            Ok(None) => {
                warn!("heap self-profiling off: jemalloc was not started with prof:true");
                None
            }
            Err(e) => {
                warn!(error = %e, "heap self-profiling off: jemalloc's profiler did not start");
                None
            }
        }
    }

    /// The live allocations now, as bytes in use by allocating stack (an estimate from the
    /// sampled ones, as jemalloc scales them).
    fn profile(&self, symbols: &Symbolizer) -> Result<pb::Profile, SelfProfileError> {
        let dump = self
            .0
            .dump()
            .map_err(|e| SelfProfileError::Heap(e.to_string()))?;
        let mut b = Builder::default();
        let mut ips = Vec::new();
        for stack in &dump {
            let bytes = stack.bytes.round() as i64;
            if bytes <= 0 {
                continue;
            }
            // Return addresses, leaf first as the profile wants them: look up the call itself.
            ips.clear();
            ips.extend(stack.addrs.iter().map(|&ip| ip.saturating_sub(1)));
            let own = symbols.allocating_frames(&ips);
            if own.is_empty() {
                continue;
            }
            let location_id = own.iter().map(|&ip| b.location(symbols, ip)).collect();
            b.samples.push(pb::Sample {
                location_id,
                value: vec![bytes],
                ..Default::default()
            });
        }
        let (space, bytes) = (b.string("space"), b.string("bytes"));
        let (inuse, now) = (b.string("inuse_space"), std::time::SystemTime::now());
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        Ok(pb::Profile {
            sample_type: vec![pb::ValueType {
                r#type: inuse,
                unit: bytes,
            }],
            sample: b.samples,
            location: b.locations,
            function: b.functions,
            string_table: b.strings,
            time_nanos: i64::try_from(since.as_nanos()).unwrap_or(0),
            period_type: Some(pb::ValueType {
                r#type: space,
                unit: bytes,
            }),
            period: 1 << 19,
            ..Default::default()
        })
    }
}

/// Why a self-profile could not be taken.
#[derive(Debug, thiserror::Error)]
enum SelfProfileError {
    #[error("cannot read this executable's symbols: {0}")]
    Symbols(String),
    #[error("the executable has no symbol table (stripped?)")]
    Stripped,
    #[error("jemalloc's heap profile could not be read: {0}")]
    Heap(String),
}

/// Never inlined, so its address finds where the executable was loaded.
#[inline(never)]
fn load_address_probe() -> usize {
    load_address_probe as *const () as usize
}

/// The function symbols of this executable, from its ELF symbol table (a few MB read from the
/// file, not its debug info, which would cost hundreds of MB to parse), to name sampled
/// addresses. Inlined frames are named by the function they were inlined into.
struct Symbolizer {
    /// Runtime address minus the symbol table's.
    bias: usize,
    /// (start, end, offset and length of the mangled name in `names`), by start.
    symbols: Vec<(u64, u64, u32, u32)>,
    names: String,
}

impl Symbolizer {
    fn load() -> Result<Self, SelfProfileError> {
        use object::{Object, ObjectSymbol, SymbolKind};
        let file = std::fs::File::open("/proc/self/exe")
            .map_err(|e| SelfProfileError::Symbols(e.to_string()))?;
        let cache = object::ReadCache::new(file);
        let elf =
            object::File::parse(&cache).map_err(|e| SelfProfileError::Symbols(e.to_string()))?;
        let mut symbols = Vec::new();
        let mut names = String::new();
        let mut probe = None;
        for sym in elf.symbols() {
            if sym.kind() != SymbolKind::Text || sym.size() == 0 || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            if name.contains("load_address_probe") && name.contains("self_profile") {
                probe = Some(sym.address());
            }
            let offset = u32::try_from(names.len())
                .map_err(|_| SelfProfileError::Symbols("symbol names past 4 GiB".into()))?;
            names.push_str(name);
            symbols.push((
                sym.address(),
                sym.address() + sym.size(),
                offset,
                name.len() as u32,
            ));
        }
        let probe = probe.ok_or(SelfProfileError::Stripped)?;
        symbols.sort_unstable_by_key(|s| s.0);
        Ok(Self {
            bias: load_address_probe().wrapping_sub(probe as usize),
            symbols,
            names,
        })
    }

    /// The symbol (index) holding runtime address `ip`.
    fn find(&self, ip: usize) -> Option<usize> {
        let addr = ip.wrapping_sub(self.bias) as u64;
        let i = self
            .symbols
            .partition_point(|s| s.0 <= addr)
            .checked_sub(1)?;
        (addr < self.symbols[i].1).then_some(i)
    }

    /// A symbol's name, demangled, without the hash Rust's mangling appends.
    fn name(&self, i: usize) -> String {
        let (_, _, offset, len) = self.symbols[i];
        let raw = &self.names[offset as usize..(offset + len) as usize];
        format!("{:#}", rustc_demangle::demangle(raw))
    }

    /// The frames of a sample (leaf first) below the profiler: everything up to its signal
    /// handler, and the trampoline outside the executable under it, is the profiler's own; the
    /// C library's thread start at the root is left out too.
    fn own_frames<'a>(&self, ips: &'a [usize]) -> &'a [usize] {
        let handler = ips.iter().rposition(|&ip| {
            self.find(ip)
                .is_some_and(|i| self.name(i).contains("perf_signal_handler"))
        });
        let mut rest = match handler {
            Some(h) => &ips[h + 1..],
            None => ips,
        };
        if handler.is_some()
            && let Some((&ip, tail)) = rest.split_first()
            && self.find(ip).is_none()
        {
            rest = tail;
        }
        self.without_thread_start(rest)
    }

    /// A stack (leaf first) without the frames outside the executable at its root (the C
    /// library's thread start).
    fn without_thread_start<'a>(&self, mut rest: &'a [usize]) -> &'a [usize] {
        while let Some((&ip, head)) = rest.split_last()
            && self.find(ip).is_none()
        {
            rest = head;
        }
        rest
    }

    /// The frames of a heap sample (leaf first) from the code that allocated: the allocator's
    /// own (jemalloc's profiler and allocation paths, the global allocator shim) are left out
    /// at the leaf, and the C library's thread start at the root.
    fn allocating_frames<'a>(&self, ips: &'a [usize]) -> &'a [usize] {
        let allocator = ips
            .iter()
            .rposition(|&ip| self.find(ip).is_some_and(|i| self.is_allocator(i)));
        let mut rest = &ips[allocator.map_or(0, |i| i + 1)..];
        while let Some((&ip, tail)) = rest.split_first()
            && self.find(ip).is_none()
        {
            rest = tail;
        }
        self.without_thread_start(rest)
    }

    /// The allocator's functions: jemalloc's (its API and private namespace are prefixed
    /// `_rjem_`; its backtrace helper is static), the `GlobalAlloc` of `tikv_jemallocator`, and
    /// the shims Rust's allocation calls go through.
    fn is_allocator(&self, i: usize) -> bool {
        let name = self.name(i);
        let name = name.strip_prefix("__rustc::").unwrap_or(&name);
        [
            "_rjem_",
            "prof_backtrace",
            "__rust_alloc",
            "__rust_realloc",
            "__rdl_",
            "__rg_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || name.contains("tikv_jemallocator::")
    }
}

#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<pb::Function>,
    /// Function ids by symbol index (`None`: an address outside the executable).
    function_ids: HashMap<Option<usize>, u64>,
    locations: Vec<pb::Location>,
    location_ids: HashMap<usize, u64>,
    samples: Vec<pb::Sample>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if self.strings.is_empty() {
            self.strings.push(String::new());
            self.string_ids.insert(String::new(), 0);
        }
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, symbols: &Symbolizer, symbol: Option<usize>) -> u64 {
        if let Some(&id) = self.function_ids.get(&symbol) {
            return id;
        }
        let name = symbol.map_or_else(|| "unknown".to_owned(), |i| symbols.name(i));
        let name = self.string(&name);
        let id = self.functions.len() as u64 + 1;
        self.functions.push(pb::Function {
            id,
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        self.function_ids.insert(symbol, id);
        id
    }

    /// The location of an address (one per address, its function as its one line).
    fn location(&mut self, symbols: &Symbolizer, ip: usize) -> u64 {
        if let Some(&id) = self.location_ids.get(&ip) {
            return id;
        }
        let function_id = self.function(symbols, symbols.find(ip));
        let id = self.locations.len() as u64 + 1;
        self.locations.push(pb::Location {
            id,
            address: ip as u64,
            line: vec![pb::Line {
                function_id,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.location_ids.insert(ip, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn spin_for_the_self_profile_test(until: std::time::Instant) -> u64 {
        let mut x = 1u64;
        while std::time::Instant::now() < until {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        x
    }

    #[test]
    fn the_symbol_table_names_this_binary_s_functions() {
        let s = Symbolizer::load().unwrap();
        let probe = load_address_probe();
        let i = s.find(probe).expect("the probe's own address");
        assert!(s.name(i).ends_with("self_profile::load_address_probe"));
        assert!(s.find(1).is_none(), "an address outside the executable");
    }

    /// The whole path but the write: samples of a busy function, named, the profiler's own
    /// frames gone, normalized as `/ingest` would.
    #[test]
    fn a_busy_function_is_in_the_profile() {
        let symbols = Symbolizer::load().unwrap();
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            .blocklist(&BLOCKLIST)
            .build()
            .unwrap();
        let start = std::time::SystemTime::now();
        // Spin until the sampler has seen 30 samples (CPU time, not wall time: a loaded machine
        // gives the thread less of it), for at most a minute.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let samples = |guard: &pprof::ProfilerGuard<'_>| -> isize {
            let report = guard.report().build_unresolved().unwrap();
            report.data.values().sum()
        };
        while samples(&guard) < 30 && std::time::Instant::now() < deadline {
            spin_for_the_self_profile_test(std::time::Instant::now() + Duration::from_millis(100));
        }
        let report = guard.report().build_unresolved().unwrap();
        drop(guard);
        let stacks: Vec<(Vec<usize>, i64)> = report
            .data
            .iter()
            .map(|(f, n)| {
                (
                    f.frames.iter().map(|f| f.ip() as usize).collect(),
                    *n as i64,
                )
            })
            .collect();
        let profile = to_pprof(
            stacks.iter().map(|(s, n)| (s.as_slice(), *n)),
            &symbols,
            start,
            report.timing.frequency,
        );
        let names: Vec<&str> = profile.string_table.iter().map(String::as_str).collect();
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("spin_for_the_self_profile_test")),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.contains("perf_signal_handler")));
        let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        assert!(
            total >= 20 * 10_000_000,
            "at least 20 samples of 10 ms: {total}"
        );
        let meta = IngestMeta {
            labels: Labels::from_pairs([("service_name", "kiln"), ("__name__", "process_cpu")]),
            time_nanos: 0,
            duration_nanos: 0,
            display_names: HashMap::new(),
        };
        let n = normalize::normalize_pprof(&(&profile).into(), &meta, &Default::default()).unwrap();
        assert_eq!(n.series.len(), 1);
        assert_eq!(
            n.series[0].profile_type.id(),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(n.series[0].total(), total);
    }
}
