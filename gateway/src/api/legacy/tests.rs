use super::*;

const NOW: i64 = 1_700_000_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn times_in_pyroscope_forms() {
    let at = |s: &str| parse_at_time(s, NOW);
    assert_eq!(at("now"), Some(NOW));
    assert_eq!(at("now-1h"), Some(NOW - 3_600_000));
    assert_eq!(at("now-1h30m"), Some(NOW - 5_400_000));
    assert_eq!(at("now-15min"), Some(NOW - 900_000));
    assert_eq!(at("now-1M"), Some(NOW - 30 * 86_400_000));
    assert_eq!(at("now+2d"), Some(NOW + 2 * 86_400_000));
    assert_eq!(at("-1w"), Some(NOW - 7 * 86_400_000));
    assert_eq!(at("1700000000"), Some(NOW));
    assert_eq!(at("1700000000123"), Some(NOW + 123));
    assert_eq!(at("1700000000123456"), Some(NOW + 123));
    assert_eq!(at("1700000000123456789"), Some(NOW + 123));
    assert_eq!(at(" 1_700_000_000 "), Some(NOW));
    assert_eq!(at("20231114"), Some(1_699_920_000_000));
    assert_eq!(at("20240229"), Some(1_709_164_800_000));
    // Not a date: eight digits of seconds.
    assert_eq!(at("20231399"), Some(20_231_399_000));
    for bad in ["yesterday", "now-1x", "now-h", "then-1h"] {
        assert_eq!(at(bad), None, "{bad}");
    }
}

#[test]
fn timeline_steps_as_pyroscope_picks_them() {
    let hour = 3_600_000;
    for (range, step) in [
        (0, 15),
        (hour, 15),
        (6 * hour, 15),
        (24 * hour, 60),
        (7 * 24 * hour, 300),
        (30 * 24 * hour, 1_800),
        (365 * 24 * hour, 21_600),
    ] {
        assert_eq!(point_interval_secs(NOW, NOW + range), step, "{range}");
    }
    // 17.5 s per point is still 15 s; a millisecond more is 20 s.
    assert_eq!(point_interval_secs(0, 26_250_000), 15);
    assert_eq!(point_interval_secs(0, 26_250_001), 20);
}

fn query(q: &str) -> Result<Query, ApiError> {
    Query::parse("query", q)
}

#[test]
fn queries_name_a_profile_type_and_a_selector() {
    let q = query(&format!("{CPU}{{service_name=\"api\", env=~\"prod|dev\"}}")).unwrap();
    assert_eq!(q.profile_type.id(), CPU);
    assert_eq!(
        q.selector_text(),
        r#"{"service_name"="api","env"=~"prod|dev"}"#
    );
    // The selector text reads back to the same matchers.
    assert_eq!(parse_selector(&q.selector_text()).unwrap(), q.selector);

    let q = query(&format!("{{__name__=\"{CPU}\",pod!=\"a\\\"b\"}}")).unwrap();
    assert_eq!(q.profile_type.id(), CPU);
    assert_eq!(q.selector_text(), r#"{"pod"!="a\"b"}"#);
    assert_eq!(parse_selector(&q.selector_text()).unwrap(), q.selector);

    // A sixth `:delta` part is accepted; no selector selects everything.
    let q = query(&format!("{CPU}:delta")).unwrap();
    assert_eq!(
        (q.profile_type.id(), q.selector_text()),
        (CPU.into(), "{}".into())
    );

    // The first HTTP API's application names select the service.
    let q = query("myapp.cpu{env=\"prod\"}").unwrap();
    assert_eq!(q.profile_type.id(), CPU);
    assert_eq!(
        q.selector_text(),
        r#"{"env"="prod","service_name"="myapp"}"#
    );
    let q = query("shop.alloc_space").unwrap();
    assert_eq!(q.profile_type.id(), "memory:alloc_space:bytes::");

    for (bad, says) in [
        (
            "{service_name=\"x\"}",
            "must contain a profile-type selection",
        ),
        ("a:b{}", "failed to parse \"query\""),
        ("myapp.bogus{}", "unknown profile type"),
        (
            &format!("{CPU}{{service_name=}}"),
            "failed to parse \"query\"",
        ),
    ] {
        let e = query(bad).unwrap_err();
        assert!(e.message.contains(says), "{bad}: {}", e.message);
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidInput);
    }
    let e = Query::parse_required("leftQuery", None).unwrap_err();
    assert_eq!(e.message, "\"leftQuery\" is required");
}

#[test]
fn label_api_matchers() {
    assert!(Query::matchers(None).unwrap().is_empty());
    assert!(Query::matchers(Some(" ")).unwrap().is_empty());
    assert_eq!(
        Query::matchers(Some("{env=\"prod\"}")).unwrap(),
        [r#"{"env"="prod"}"#]
    );
    assert_eq!(
        Query::matchers(Some(&format!("{CPU}{{env=\"prod\"}}"))).unwrap(),
        [format!(r#"{{"env"="prod","__profile_type__"="{CPU}"}}"#)]
    );
}

#[test]
fn params_decode_and_take_the_first_value() {
    let uri: Uri = "/x?query=a%7Bb%3D%22c+d%22%7D&max-nodes=5&groupBy=a&groupBy=b&flag"
        .parse()
        .unwrap();
    let p = Params::parse(&uri).unwrap();
    assert_eq!(p.get("query"), Some("a{b=\"c d\"}"));
    assert_eq!(p.get("flag"), Some(""));
    assert_eq!(p.all("groupBy").collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(p.max_nodes().unwrap(), 5);
    let p = Params::parse(&"/x?max-nodes=5&maxNodes=7".parse().unwrap()).unwrap();
    assert_eq!(p.max_nodes().unwrap(), 7, "maxNodes wins, as in Pyroscope");
    let p = Params::parse(&"/x?max-nodes=many".parse().unwrap()).unwrap();
    assert!(p.max_nodes().is_err());
    let p = Params::parse(&"/x?from=now-1h".parse().unwrap()).unwrap();
    assert_eq!(
        p.range("from", "until", NOW).unwrap(),
        (NOW - 3_600_000, NOW)
    );
    assert!(
        Params::parse(&"/x".parse().unwrap())
            .unwrap()
            .optional_range(NOW)
            .unwrap()
            == (0, 0)
    );
    let p = Params::parse(&"/x?until=soon".parse().unwrap()).unwrap();
    assert!(
        p.range("from", "until", NOW)
            .unwrap_err()
            .message
            .contains("invalid until")
    );
    assert!(Params::parse(&"/x?q=%ff".parse().unwrap()).is_err());
}
