use proptest::prelude::*;

use super::*;
use crate::labels::parse_app_name;

fn doc(profiles: &str, frames: &[&str]) -> String {
    let frames: Vec<String> = frames
        .iter()
        .map(|f| format!(r#"{{"name":"{f}","file":"x.py","line":3}}"#))
        .collect();
    format!(
        r#"{{"$schema":"{SCHEMA}","shared":{{"frames":[{}]}},"profiles":[{profiles}],"exporter":"test"}}"#,
        frames.join(",")
    )
}

fn run(body: &str, app: &str, rate: u32) -> Result<NormalizedProfile> {
    parse(
        body.as_bytes(),
        &parse_app_name(app).unwrap(),
        rate,
        &IngestMeta::default(),
        &NormalizeLimits::default(),
    )
}

/// Root-first stacks joined by `;` with their values, sorted.
fn stacks(p: &NormalizedProfile, series: usize) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = p.series[series]
        .samples
        .iter()
        .map(|s| {
            let mut names: Vec<&str> = p.symbols.frame_names(&s.stack).collect();
            names.reverse();
            (names.join(";"), s.value)
        })
        .collect();
    out.sort();
    out
}

const SAMPLED: &str = r#"{"type":"sampled","name":"Thread 1 \"MainThread\"","unit":"seconds",
    "startValue":0,"endValue":0.05,"samples":[[0,1],[0,1,2],[0,1],[0]],"weights":[0.01,0.01,0.02,0.01]}"#;

#[test]
fn a_sampled_profile_in_seconds_is_cpu_in_nanoseconds() {
    let p = run(
        &doc(SAMPLED, &["main", "work", "fib"]),
        "py.cpu{env=prod}",
        100,
    )
    .unwrap();
    assert_eq!(p.series.len(), 1);
    let s = &p.series[0];
    assert_eq!(
        s.profile_type.id(),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    );
    assert_eq!(s.labels.get("service_name"), Some("py"));
    assert_eq!(s.labels.get("env"), Some("prod"));
    assert_eq!(
        s.labels.get("profile_name"),
        Some("Thread 1 \"MainThread\"")
    );
    assert_eq!(
        stacks(&p, 0),
        [
            ("main".into(), 10_000_000),
            ("main;work".into(), 30_000_000),
            ("main;work;fib".into(), 10_000_000)
        ]
    );
    let fib = p
        .symbols
        .functions
        .iter()
        .find(|f| &*f.name == "fib")
        .unwrap();
    assert_eq!(&*fib.filename, "x.py");
}

#[test]
fn an_evented_profile_gives_each_stack_the_time_it_was_open() {
    // a opens at 0, b at 1, c from 2 to 4, d from 4 to 7, b closes at 9, a at 10.
    let events = [
        ("O", 0, 0),
        ("O", 1, 1),
        ("O", 2, 2),
        ("C", 4, 2),
        ("O", 4, 3),
        ("C", 7, 3),
        ("C", 9, 1),
        ("C", 10, 0),
    ]
    .map(|(t, at, f)| format!(r#"{{"type":"{t}","at":{at},"frame":{f}}}"#))
    .join(",");
    let profile = format!(
        r#"{{"type":"evented","name":"simple","unit":"milliseconds","startValue":0,"endValue":10,"events":[{events}]}}"#
    );
    let p = run(&doc(&profile, &["a", "b", "c", "d"]), "app", 100).unwrap();
    assert_eq!(
        p.series[0].profile_type.id(),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    );
    assert_eq!(
        stacks(&p, 0),
        [
            ("a".into(), 2_000_000),
            ("a;b".into(), 2_000_000 + 1_000_000),
            ("a;b;c".into(), 2_000_000),
            ("a;b;d".into(), 3_000_000)
        ]
    );
    assert_eq!(
        p.series[0].total(),
        10_000_000,
        "every millisecond is somewhere"
    );

    // Unit none counts samples at the request's rate: 100 Hz, 10 ms each.
    let none = profile.replace("milliseconds", "none");
    let p = run(&doc(&none, &["a", "b", "c", "d"]), "app", 100).unwrap();
    assert_eq!(p.series[0].total(), 10 * 10_000_000);
}

#[test]
fn several_profiles_are_named_by_unit_and_duplicates_merge() {
    let two = |unit: &str, second: &str| {
        [
            SAMPLED.replace("seconds", unit),
            SAMPLED.replace("seconds", unit).replace("Thread 1", second),
        ]
        .join(",")
    };
    let p = run(
        &doc(&two("seconds", "Thread 2"), &["main", "work", "fib"]),
        "app",
        100,
    )
    .unwrap();
    assert_eq!(p.series.len(), 2);
    for s in &p.series {
        assert_eq!(s.profile_type.id(), "wall:wall:nanoseconds:cpu:nanoseconds");
        assert_eq!(s.labels.get("service_name"), Some("app"));
        assert_eq!(s.total(), 50_000_000);
    }
    assert_ne!(p.series[0].labels, p.series[1].labels);

    let bytes = two("bytes", "Thread 2")
        .replace("0.01", "100")
        .replace("0.02", "200");
    let p = run(&doc(&bytes, &["main", "work", "fib"]), "app", 100).unwrap();
    assert_eq!(p.series[0].profile_type.id(), "memory:samples:bytes::");
    assert_eq!(p.series[0].total(), 500);

    // The same name, type, unit and start: one profile.
    let p = run(
        &doc(&two("seconds", "Thread 1"), &["main", "work", "fib"]),
        "app",
        100,
    )
    .unwrap();
    assert_eq!(p.series.len(), 1);
    assert_eq!(
        p.series[0].profile_type.id(),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    );
    assert_eq!(p.series[0].total(), 100_000_000);
}

#[test]
fn a_lone_bytes_profile_is_memory_and_a_suffix_still_wins() {
    let bytes = SAMPLED
        .replace("seconds", "bytes")
        .replace("0.01", "100")
        .replace("0.02", "200");
    let p = run(&doc(&bytes, &["main", "work", "fib"]), "app", 100).unwrap();
    assert_eq!(p.series[0].profile_type.id(), "memory:samples:bytes::");
    assert_eq!(p.series[0].total(), 500);
    let p = run(&doc(SAMPLED, &["main", "work", "fib"]), "app.wall", 100).unwrap();
    assert_eq!(
        p.series[0].profile_type.id(),
        "wall:wall:nanoseconds:cpu:nanoseconds"
    );
}

#[test]
fn malformed_documents_are_refused_with_a_reason() {
    let frames = &["main", "work", "fib"];
    let cases = [
        ("not json".to_owned(), "invalid speedscope JSON"),
        (
            doc(SAMPLED, frames).replace(SCHEMA, "https://example.com/other.json"),
            "unknown speedscope schema",
        ),
        (
            doc(&SAMPLED.replace("[0,1,2]", "[0,1,3]"), frames),
            "frame 3",
        ),
        (
            doc(&SAMPLED.replace("[0,1,2]", "[0,1,-1]"), frames),
            "frame -1",
        ),
        (
            doc(&SAMPLED.replace("[0,1,2]", "[0,1,1.5]"), frames),
            "frame 1.5",
        ),
        (
            doc(&SAMPLED.replace(",0.01]", "]"), frames),
            "4 samples and 3 weights",
        ),
        (
            doc(&SAMPLED.replace("0.02", "-0.02"), frames),
            "weight -0.02",
        ),
        (doc(&SAMPLED.replace("0.02", "1e300"), frames), "weight"),
        (
            doc(&SAMPLED.replace("seconds", "parsecs"), frames),
            "unit \"parsecs\"",
        ),
        (
            doc(&SAMPLED.replace("sampled", "traced"), frames),
            "type \"traced\"",
        ),
        (
            doc(
                r#"{"type":"evented","unit":"none","events":[{"type":"O","at":1,"frame":0},{"type":"C","at":2,"frame":1}]}"#,
                frames,
            ),
            "not the innermost open frame",
        ),
        (
            doc(
                r#"{"type":"evented","unit":"none","events":[{"type":"O","at":2,"frame":0},{"type":"C","at":1,"frame":0}]}"#,
                frames,
            ),
            "comes before",
        ),
        (
            doc(
                r#"{"type":"evented","unit":"none","events":[{"type":"X","at":2,"frame":0}]}"#,
                frames,
            ),
            "type \"X\"",
        ),
    ];
    for (body, needle) in cases {
        let err = run(&body, "app", 100).unwrap_err();
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

#[test]
fn detection_by_content() {
    assert!(looks_like_speedscope(doc(SAMPLED, &["a"]).as_bytes()));
    assert!(looks_like_speedscope(
        format!("\n  {}", doc(SAMPLED, &["a"])).as_bytes()
    ));
    assert!(!looks_like_speedscope(b"main;work 3\n"));
    assert!(!looks_like_speedscope(b"{\"resourceProfiles\": []}"));
}

proptest! {
    /// Whatever the bytes, parsing answers; it never panics.
    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(
            &body,
            &parse_app_name("app").unwrap(),
            100,
            &IngestMeta::default(),
            &NormalizeLimits::default(),
        );
    }

    /// A sampled profile's total is the sum of its weights, in nanoseconds.
    #[test]
    fn sampled_totals_are_kept(samples in prop::collection::vec(
        (prop::collection::vec(0usize..4, 0..6), 0u32..1000), 1..40)
    ) {
        let stacks: Vec<String> = samples.iter().map(|(s, _)| format!("{s:?}")).collect();
        let weights: Vec<String> = samples.iter().map(|(_, w)| w.to_string()).collect();
        let profile = format!(
            r#"{{"type":"sampled","name":"p","unit":"microseconds","samples":[{}],"weights":[{}]}}"#,
            stacks.join(","),
            weights.join(",")
        );
        let p = run(&doc(&profile, &["a", "b", "c", "d"]), "app", 100).unwrap();
        let want: i64 = samples.iter().map(|(_, w)| i64::from(*w) * 1000).sum();
        prop_assert_eq!(p.series.iter().map(Series::total).sum::<i64>(), want);
    }
}
