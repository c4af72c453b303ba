//! JFR recordings written here byte by byte (a small writer of the format), so every event kind,
//! label, setting and malformation is tested without a JVM; the e2e test reads the JDK's own.

use proptest::prelude::*;

use super::*;
use crate::model::Labels;

/// A JFR varint: seven bits a byte, the ninth byte holding eight.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    for _ in 0..8 {
        if v < 0x80 {
            out.push(v as u8);
            return;
        }
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.push(3);
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// An event: its size as the JDK writes it (a varint padded to four bytes), then the body.
fn event(out: &mut Vec<u8>, body: &[u8]) {
    let size = body.len() + 4;
    out.extend_from_slice(&[
        (size as u8 & 0x7f) | 0x80,
        ((size >> 7) as u8 & 0x7f) | 0x80,
        ((size >> 14) as u8 & 0x7f) | 0x80,
        (size >> 21) as u8 & 0x7f,
    ]);
    out.extend_from_slice(body);
}

/// (name, class id, constant pool, array)
type FieldDef = (&'static str, u64, bool, bool);

struct Element {
    name: &'static str,
    attributes: Vec<(&'static str, String)>,
    children: Vec<Element>,
}

fn metadata(classes: &[(u64, &'static str, Vec<FieldDef>)]) -> Vec<u8> {
    let classes = classes
        .iter()
        .map(|(id, name, fields)| Element {
            name: "class",
            attributes: vec![("id", id.to_string()), ("name", name.to_string())],
            children: fields
                .iter()
                .map(|(name, class, pool, array)| {
                    let mut attributes =
                        vec![("name", name.to_string()), ("class", class.to_string())];
                    if *pool {
                        attributes.push(("constantPool", "true".into()));
                    }
                    if *array {
                        attributes.push(("dimension", "1".into()));
                    }
                    Element {
                        name: "field",
                        attributes,
                        children: vec![],
                    }
                })
                .collect(),
        })
        .collect();
    let root = Element {
        name: "root",
        attributes: vec![],
        children: vec![
            Element {
                name: "metadata",
                attributes: vec![],
                children: classes,
            },
            Element {
                name: "region",
                attributes: vec![],
                children: vec![],
            },
        ],
    };
    let mut strings: Vec<String> = Vec::new();
    fn collect(e: &Element, strings: &mut Vec<String>) {
        for s in std::iter::once(e.name.to_owned()).chain(
            e.attributes
                .iter()
                .flat_map(|(k, v)| [k.to_string(), v.clone()]),
        ) {
            if !strings.contains(&s) {
                strings.push(s);
            }
        }
        for c in &e.children {
            collect(c, strings);
        }
    }
    collect(&root, &mut strings);
    fn write(e: &Element, strings: &[String], out: &mut Vec<u8>) {
        let idx = |s: &str| strings.iter().position(|x| x == s).unwrap() as u64;
        varint(out, idx(e.name));
        varint(out, e.attributes.len() as u64);
        for (k, v) in &e.attributes {
            varint(out, idx(k));
            varint(out, idx(v));
        }
        varint(out, e.children.len() as u64);
        for c in &e.children {
            write(c, strings, out);
        }
    }
    let mut body = Vec::new();
    varint(&mut body, 0); // type: metadata
    varint(&mut body, 0); // start time
    varint(&mut body, 0); // duration
    varint(&mut body, 1); // metadata id
    varint(&mut body, strings.len() as u64);
    for s in &strings {
        string(&mut body, s);
    }
    write(&root, &strings, &mut body);
    let mut out = Vec::new();
    event(&mut out, &body);
    out
}

const LONG: u64 = 1;
const INT: u64 = 2;
const BOOLEAN: u64 = 3;
const STRING: u64 = 4;
const SYMBOL: u64 = 10;
const CLASS: u64 = 11;
const METHOD: u64 = 12;
const FRAME: u64 = 13;
const STACK: u64 = 14;
const STATE: u64 = 15;
const EXECUTION: u64 = 20;
const SETTING: u64 = 21;
const MONITOR: u64 = 22;
const ALLOC_SAMPLE: u64 = 23;
const WALL: u64 = 24;
const EMPTY: u64 = 30;
const MANY: u64 = 31;

fn classes() -> Vec<(u64, &'static str, Vec<FieldDef>)> {
    vec![
        (LONG, "long", vec![]),
        (INT, "int", vec![]),
        (BOOLEAN, "boolean", vec![]),
        (STRING, "java.lang.String", vec![]),
        (
            SYMBOL,
            "jdk.types.Symbol",
            vec![("string", STRING, false, false)],
        ),
        (
            CLASS,
            "java.lang.Class",
            vec![("name", SYMBOL, true, false)],
        ),
        (
            METHOD,
            "jdk.types.Method",
            vec![("type", CLASS, true, false), ("name", SYMBOL, true, false)],
        ),
        (
            FRAME,
            "jdk.types.StackFrame",
            vec![
                ("method", METHOD, true, false),
                ("lineNumber", INT, false, false),
            ],
        ),
        (
            STACK,
            "jdk.types.StackTrace",
            vec![
                ("truncated", BOOLEAN, false, false),
                ("frames", FRAME, false, true),
            ],
        ),
        (
            STATE,
            "jdk.types.ThreadState",
            vec![("name", STRING, false, false)],
        ),
        (
            EXECUTION,
            "jdk.ExecutionSample",
            vec![
                ("startTime", LONG, false, false),
                ("stackTrace", STACK, true, false),
                ("state", STATE, true, false),
                ("contextId", LONG, false, false),
                ("spanId", LONG, false, false),
                ("spanName", LONG, false, false),
            ],
        ),
        (
            SETTING,
            "jdk.ActiveSetting",
            vec![
                ("startTime", LONG, false, false),
                ("id", LONG, false, false),
                ("name", STRING, false, false),
                ("value", STRING, false, false),
            ],
        ),
        (
            MONITOR,
            "jdk.JavaMonitorEnter",
            vec![
                ("startTime", LONG, false, false),
                ("duration", LONG, false, false),
                ("stackTrace", STACK, true, false),
            ],
        ),
        (
            ALLOC_SAMPLE,
            "jdk.ObjectAllocationSample",
            vec![
                ("startTime", LONG, false, false),
                ("stackTrace", STACK, true, false),
                ("weight", LONG, false, false),
            ],
        ),
        (
            WALL,
            "profiler.WallClockSample",
            vec![
                ("startTime", LONG, false, false),
                ("stackTrace", STACK, true, false),
                ("state", STATE, true, false),
                ("samples", INT, false, false),
            ],
        ),
        (EMPTY, "kiln.Empty", vec![]),
        (MANY, "kiln.Many", vec![("items", EMPTY, false, true)]),
    ]
}

/// The constant pools: symbols, classes, methods, three stack traces, thread states, and the
/// string "period" in the `java.lang.String` pool.
fn pools() -> Vec<u8> {
    let mut p = Vec::new();
    let mut n = 0;
    let mut pool = |class: u64, entries: Vec<(u64, Vec<u8>)>, p: &mut Vec<u8>| {
        varint(p, class);
        varint(p, entries.len() as u64);
        for (k, v) in entries {
            varint(p, k);
            p.extend(v);
        }
        n += 1;
    };
    let s = |text: &str| {
        let mut v = Vec::new();
        string(&mut v, text);
        v
    };
    let symbols = [
        "com/example/Shop",
        "checkout",
        "pay",
        "main",
        "Shop$$Lambda$14/0x0000000800c03000",
        "run",
    ];
    pool(
        SYMBOL,
        symbols
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u64 + 1, s(t)))
            .collect(),
        &mut p,
    );
    pool(CLASS, vec![(1, vec![1]), (2, vec![5])], &mut p);
    // Method: (class, name symbol)
    pool(
        METHOD,
        vec![
            (1, vec![1, 4]),
            (2, vec![1, 2]),
            (3, vec![1, 3]),
            (4, vec![2, 6]),
        ],
        &mut p,
    );
    let stack = |frames: &[(u8, u8)]| {
        let mut v = vec![0, frames.len() as u8];
        for (m, line) in frames {
            v.extend([*m, *line]);
        }
        v
    };
    pool(
        STACK,
        vec![
            (1, stack(&[(3, 30), (2, 20), (1, 10)])),
            (2, stack(&[(2, 21), (1, 10)])),
            (3, stack(&[(4, 0), (1, 10)])),
        ],
        &mut p,
    );
    pool(
        STATE,
        vec![(1, s("STATE_RUNNABLE")), (2, s("STATE_SLEEPING"))],
        &mut p,
    );
    pool(STRING, vec![(7, s("period"))], &mut p);
    let mut body = Vec::new();
    varint(&mut body, 1); // type: checkpoint
    varint(&mut body, 0); // start time
    varint(&mut body, 0); // duration
    varint(&mut body, 0); // delta to the previous checkpoint
    body.push(1); // flush
    varint(&mut body, n);
    body.extend(p);
    let mut out = Vec::new();
    event(&mut out, &body);
    out
}

fn execution(stack: u64, state: u64, context: u64, span: u64, span_name: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [EXECUTION, 1000, stack, state, context, span, span_name] {
        varint(&mut b, v);
    }
    b
}

fn setting(id: u64, name: Option<&str>, value: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [SETTING, 1000, id] {
        varint(&mut b, v);
    }
    match name {
        Some(n) => string(&mut b, n),
        None => {
            b.push(2); // the "period" of the String pool
            varint(&mut b, 7);
        }
    }
    string(&mut b, value);
    b
}

fn fields(values: &[u64]) -> Vec<u8> {
    let mut b = Vec::new();
    for v in values {
        varint(&mut b, *v);
    }
    b
}

/// One chunk holding `events`, with `ticks_per_second`.
fn chunk(events: &[Vec<u8>], ticks_per_second: u64) -> Vec<u8> {
    let mut body = Vec::new();
    for e in events {
        event(&mut body, e);
    }
    let cp_offset = 68 + body.len();
    body.extend(pools());
    let meta_offset = 68 + body.len();
    body.extend(metadata(&classes()));
    let size = 68 + body.len();
    let mut out = Vec::new();
    out.extend_from_slice(b"FLR\0");
    out.extend_from_slice(&2u16.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    for v in [size, cp_offset, meta_offset] {
        out.extend_from_slice(&(v as i64).to_be_bytes());
    }
    for v in [
        1_700_000_000_000_000_000i64,
        1_000_000_000,
        0,
        ticks_per_second as i64,
    ] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&1u32.to_be_bytes()); // compressed integers
    out.extend(body);
    assert_eq!(out.len(), size);
    out
}

/// A recording of a shop: CPU samples in two contexts and one span, a sleeping sample, a
/// contended monitor (5000 ticks at 1 MHz: 5 ms, stored as its 5000 ticks) and two sampled
/// allocations; the execution sample's period set to 20 ms.
fn shop() -> Vec<u8> {
    let mut events = vec![setting(EXECUTION, None, "20 ms")];
    for _ in 0..3 {
        events.push(execution(1, 1, 1, 0, 0));
    }
    events.push(execution(2, 1, 2, 0, 0));
    events.push(execution(1, 2, 1, 0, 0)); // sleeping: not CPU
    for _ in 0..2 {
        events.push(execution(3, 1, 0, 0xabc, 9));
    }
    events.push(fields(&[MONITOR, 1000, 5000, 2]));
    for _ in 0..2 {
        events.push(fields(&[ALLOC_SAMPLE, 1000, 1, 1024]));
    }
    chunk(&events, 1_000_000)
}

fn snapshot() -> LabelsSnapshot {
    LabelsSnapshot {
        contexts: [
            (
                1,
                Context {
                    labels: [(1, 2)].into(),
                },
            ),
            (
                2,
                Context {
                    labels: [(1, 3)].into(),
                },
            ),
        ]
        .into(),
        strings: [
            (1, "endpoint".to_owned()),
            (2, "/checkout".to_owned()),
            (3, "/pay".to_owned()),
            (9, "GET /run".to_owned()),
        ]
        .into(),
    }
}

fn meta() -> IngestMeta {
    IngestMeta {
        labels: Labels::from_pairs([("service_name", "shop"), ("pyroscope_spy", "javaspy")]),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    }
}

fn run(recording: &[u8], labels: &LabelsSnapshot, rate: Option<u32>) -> Result<NormalizedProfile> {
    parse(
        recording,
        labels,
        rate,
        &meta(),
        &NormalizeLimits::default(),
    )
}

/// The series of a profile type with a label set's `extra` label: root-first stacks → value.
fn stacks(p: &NormalizedProfile, ty: &str, label: (&str, &str)) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = p
        .series
        .iter()
        .filter(|s| s.profile_type.id() == ty && s.labels.get(label.0) == Some(label.1))
        .flat_map(|s| &s.samples)
        .map(|s| {
            let mut names: Vec<&str> = p.symbols.frame_names(&s.stack).collect();
            names.reverse();
            (names.join(";"), s.value)
        })
        .collect();
    out.sort();
    out
}

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn events_become_pyroscope_profile_types() {
    let p = run(&shop(), &LabelsSnapshot::default(), None).unwrap();
    let mut types: Vec<String> = p.series.iter().map(|s| s.profile_type.id()).collect();
    types.dedup();
    assert_eq!(
        types,
        [
            CPU,
            "mutex:contentions:count:mutex:count",
            "mutex:delay:nanoseconds:mutex:count",
            "memory:alloc_sample_objects:count:space:bytes",
            "memory:alloc_sample_bytes:bytes:space:bytes",
        ]
    );
    // 20 ms from the recording's setting; the sleeping sample is not CPU.
    let ms = 1_000_000;
    assert_eq!(
        stacks(&p, CPU, ("service_name", "shop")),
        [
            ("com/example/Shop.main;Shop$$Lambda_.run".into(), 40 * ms),
            (
                "com/example/Shop.main;com/example/Shop.checkout".into(),
                20 * ms
            ),
            (
                "com/example/Shop.main;com/example/Shop.checkout;com/example/Shop.pay".into(),
                60 * ms
            ),
        ]
    );
    let total = |ty: &str| -> i64 {
        p.series
            .iter()
            .filter(|s| s.profile_type.id() == ty)
            .map(Series::total)
            .sum()
    };
    assert_eq!(total("mutex:contentions:count:mutex:count"), 1);
    // 5 ms at 1 MHz is 5,000 ticks: the delay is the duration in ticks, as Pyroscope stores it
    // (its jfr-parser never reads ticksPerSecond; the Kafka broker recording of its goldens ticks
    // at 2.8 GHz, and a conversion to nanoseconds gave 0.357x its delays).
    assert_eq!(
        total("mutex:delay:nanoseconds:mutex:count"),
        5_000,
        "ticks at 1 MHz, as recorded"
    );
    assert_eq!(total("memory:alloc_sample_objects:count:space:bytes"), 2);
    assert_eq!(total("memory:alloc_sample_bytes:bytes:space:bytes"), 2048);
    let s = &p.series[0];
    assert_eq!(s.labels.get("__name__"), Some("process_cpu"));
    assert_eq!(s.labels.get("pyroscope_spy"), Some("javaspy"));
    assert_eq!(
        s.labels.get("jfr_event"),
        None,
        "the JDK's recordings set no event"
    );
    assert_eq!(s.time_nanos, 1_700_000_000_000_000_000);
    // Lines are kept per location.
    let pay = p
        .symbols
        .functions
        .iter()
        .position(|f| f.name.ends_with(".pay"))
        .unwrap();
    assert!(p.symbols.locations.iter().any(|l| l.lines[0]
        == Line {
            function: pay as u32,
            line: 30
        }));

    // The request's sample rate wins over the recording's period.
    let p = run(&shop(), &LabelsSnapshot::default(), Some(100)).unwrap();
    let cpu: i64 = p
        .series
        .iter()
        .filter(|s| s.profile_type.id() == CPU)
        .map(Series::total)
        .sum();
    assert_eq!(cpu, 6 * 10 * ms);
}

#[test]
fn contexts_become_labels_and_spans_stay_per_sample() {
    let p = run(&shop(), &snapshot(), None).unwrap();
    let ms = 1_000_000;
    assert_eq!(
        stacks(&p, CPU, ("endpoint", "/checkout")),
        [(
            "com/example/Shop.main;com/example/Shop.checkout;com/example/Shop.pay".into(),
            60 * ms
        )]
    );
    assert_eq!(
        stacks(&p, CPU, ("endpoint", "/pay")),
        [(
            "com/example/Shop.main;com/example/Shop.checkout".into(),
            20 * ms
        )]
    );
    let span = p
        .series
        .iter()
        .find(|s| s.labels.get("span_name") == Some("GET /run"))
        .unwrap();
    assert_eq!(span.samples.len(), 1);
    assert_eq!(span.samples[0].span_id, parse_span_id("0000000000000abc"));
    assert_ne!(span.samples[0].span_id, 0);
    // Series without a context have no endpoint label.
    assert!(
        p.series
            .iter()
            .filter(|s| s.profile_type.name == "mutex")
            .all(|s| s.labels.get("endpoint").is_none())
    );
}

#[test]
fn wall_mode_and_wall_clock_samples() {
    let mut wall = fields(&[WALL, 1000, 1, 1]);
    varint(&mut wall, 3); // 3 samples
    let events = vec![
        setting(0, Some("event"), "wall"),
        execution(1, 1, 0, 0, 0),
        wall,
    ];
    let p = run(
        &chunk(&events, 1_000_000_000),
        &LabelsSnapshot::default(),
        Some(100),
    )
    .unwrap();
    let total = |ty: &str| -> i64 {
        p.series
            .iter()
            .filter(|s| s.profile_type.id() == ty)
            .map(Series::total)
            .sum()
    };
    // The execution sample counts as CPU and wall; the runnable wall-clock sample as both too.
    assert_eq!(total(CPU), 10_000_000 + 30_000_000);
    assert_eq!(
        total("wall:wall:nanoseconds:wall:nanoseconds"),
        10_000_000 + 30_000_000
    );
    assert!(
        p.series
            .iter()
            .all(|s| s.labels.get("jfr_event") == Some("wall"))
    );
}

#[test]
fn chunks_are_read_one_after_another() {
    let mut two = shop();
    two.extend(shop());
    let one = run(&shop(), &LabelsSnapshot::default(), None).unwrap();
    let both = run(&two, &LabelsSnapshot::default(), None).unwrap();
    let cpu = |p: &NormalizedProfile| -> i64 {
        p.series
            .iter()
            .filter(|s| s.profile_type.id() == CPU)
            .map(Series::total)
            .sum()
    };
    assert_eq!(cpu(&both), 2 * cpu(&one));
    assert_eq!(
        both.symbols.functions.len(),
        one.symbols.functions.len(),
        "symbols shared"
    );
}

#[test]
fn limits_apply() {
    let limits = NormalizeLimits {
        max_samples: 5,
        ..Default::default()
    };
    let err = parse(&shop(), &LabelsSnapshot::default(), None, &meta(), &limits).unwrap_err();
    assert!(
        err.to_string().contains("more than the limit of 5"),
        "{err}"
    );
    let limits = NormalizeLimits {
        max_stack_depth: 1,
        ..Default::default()
    };
    let p = parse(&shop(), &LabelsSnapshot::default(), None, &meta(), &limits).unwrap();
    for s in p.series.iter().flat_map(|s| &s.samples) {
        assert_eq!(s.stack.len(), 1);
        let names: Vec<&str> = p.symbols.frame_names(&s.stack).collect();
        assert_eq!(names, ["com/example/Shop.main"], "the root side is kept");
    }
}

#[test]
fn malformed_recordings_are_refused_with_a_reason() {
    let good = shop();
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    let mut version1 = good.clone();
    version1[5] = 1;
    let mut huge_size = good.clone();
    huge_size[8..16].copy_from_slice(&(1i64 << 40).to_be_bytes());
    // A pool declaring two billion values of a class with no fields.
    let mut many = Vec::new();
    varint(&mut many, 1);
    for v in [0, 0, 0] {
        varint(&mut many, v);
    }
    many.push(0);
    varint(&mut many, 1); // one pool
    varint(&mut many, MANY);
    varint(&mut many, 1); // one constant
    varint(&mut many, 1); // key
    varint(&mut many, 0x7fff_ffff); // items
    let mut bomb = chunk(&[], 1_000_000_000);
    // Put the checkpoint right after the header by rebuilding: header + event + the rest.
    let mut e = Vec::new();
    event(&mut e, &many);
    bomb.splice(68..68, e.iter().copied());
    let shift = e.len() as i64;
    for range in [8..16, 16..24, 24..32] {
        let v = i64::from_be_bytes(bomb[range.clone()].try_into().unwrap()) + shift;
        bomb[range].copy_from_slice(&v.to_be_bytes());
    }
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "empty"),
        ("magic", bad_magic, "no \"FLR\" magic"),
        ("version", version1, "JFR version 1.1 is not supported"),
        ("size", huge_size, "chunk size"),
        ("truncated", good[..good.len() / 2].to_vec(), "chunk size"),
        ("pprof", b"\x1f\x8b\x08\x00".to_vec(), "chunk header"),
        ("values", bomb, "more values than its size can hold"),
    ];
    for (what, body, needle) in cases {
        let err = run(&body, &LabelsSnapshot::default(), None).unwrap_err();
        assert!(err.to_string().contains(needle), "{what}: {err}");
    }
    assert!(LabelsSnapshot::decode(b"\xff\xff").is_err());
}

#[test]
fn generated_names_are_merged() {
    for (name, want) in [
        (
            "jdk/internal/reflect/GeneratedMethodAccessor31",
            "jdk/internal/reflect/GeneratedMethodAccessor_",
        ),
        (
            "org/example/OrderService$$Lambda$669/0x0000000800fd7318",
            "org/example/OrderService$$Lambda_",
        ),
        ("Fib$$Lambda.0x00007ffa600c4da0", "Fib$$Lambda_"),
        (
            "Busy$$Lambda$88+0x00007f6e14007a08/1790421142",
            "Busy$$Lambda_",
        ),
        ("App$$Lambda$12", "App$$Lambda$12"),
        (
            "Shop$$EnhancerBySpringCGLIB$$3f2a9",
            "Shop$$EnhancerBySpringCGLIB$$_",
        ),
        ("java/lang/Thread", "java/lang/Thread"),
        ("$$Lambda$1", "$$Lambda$1"),
        ("App$$Lambda$x", "App$$Lambda$x"),
    ] {
        assert_eq!(merge_generated(name), want, "{name}");
    }
    assert_eq!(parse_period("10 ms"), Some(10_000_000));
    assert_eq!(parse_period("20ms"), Some(20_000_000));
    assert_eq!(parse_period("1 s"), Some(1_000_000_000));
    assert_eq!(parse_period("everyChunk"), None);
    assert_eq!(parse_period("0 ms"), None);
}

proptest! {
    /// Whatever the bytes, parsing answers; it never panics.
    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = run(&body, &snapshot(), None);
        let mut with_magic = b"FLR\0\0\x02\0\x01".to_vec();
        with_magic.extend(&body);
        let _ = run(&with_magic, &snapshot(), None);
    }

    /// A real-shaped recording with bytes changed or cut anywhere: an answer, never a panic.
    #[test]
    fn damaged_recordings_never_panic(
        changes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut body = shop();
        for (at, byte) in changes {
            let i = at.index(body.len());
            body[i] = byte;
        }
        let _ = run(&body, &snapshot(), None);
        let n = cut.index(body.len());
        let _ = run(&body[..n], &snapshot(), None);
    }
}

/// The shop recording through the fuzz entry, and seeded mutations of it: errors, never a panic
/// (the corpus's real recording is mutated by `tests/fuzz_entries.rs` where it is present).
#[test]
fn mutated_recordings_are_refused_not_a_panic() {
    use crate::mutate::{Rng, mutate};
    let recording = shop();
    assert!(run(&recording, &snapshot(), None).is_ok());
    for seed in 0..3_000 {
        let mut rng = Rng::new(seed);
        let (bad, what) = mutate(&mut rng, &recording, &recording);
        let result = std::panic::catch_unwind(|| {
            let _ = run(&bad, &snapshot(), None);
            crate::fuzz::jfr(&bad);
        });
        assert!(result.is_ok(), "seed {seed} ({what}) panicked");
    }
}
