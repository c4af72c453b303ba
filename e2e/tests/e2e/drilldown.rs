//! Grafana Profiles Drilldown's calls replayed against the spawned `kiln` as the app sends them
//! through Grafana's datasource proxy (`../shared/research/drilldown.md` §1.3): Connect JSON with
//! the app's field names (proto and lowerCamel mixed, int64 as strings), Basic auth in JWT mode,
//! answers checked against Kiln's own data (the function projections against its flame graphs),
//! and every call refusing another tenant's data.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kiln_e2e::Kiln;
use serde_json::{Value, json};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// 10 ms per folded sample at the default 100 Hz.
const MS10: i64 = 10_000_000;
const T0: i64 = 1_700_000_000;

/// A call as the proxy forwards it: Connect JSON and the datasource's credentials.
fn call(kiln: &Kiln, auth: &str, path: &str, body: Value) -> Result<(u16, Value)> {
    let resp = kiln
        .http()
        .post(kiln.url(path))
        .header("Authorization", auth)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json; allow-utf8-labelnames=true")
        .body(body.to_string())
        .send()?;
    let status = resp.status().as_u16();
    let text = resp.text()?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

fn ok(kiln: &Kiln, auth: &str, path: &str, body: Value) -> Result<Value> {
    let (status, v) = call(kiln, auth, path, body)?;
    ensure!(status == 200, "{path}: {status} {v}");
    Ok(v)
}

fn int(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

fn range() -> (String, String) {
    (
        (T0 * 1000 - 60_000).to_string(),
        (T0 * 1000 + 7_200_000).to_string(),
    )
}

/// The app's services, in JWT mode with Basic auth (the datasource's user = tenant, password =
/// token), over one tenant's data; a second tenant sees none of it through the same calls.
#[test]
fn the_drilldown_app_s_calls_work_and_stay_in_their_tenant() -> Result<()> {
    let keys = tempfile::tempdir()?;
    std::fs::write(
        keys.path().join("k1.secret"),
        "0123456789abcdef0123456789abcdef-drilldown-e2e",
    )?;
    let key = keys.path().join("k1.secret");
    let keys_dir = keys.path().to_string_lossy().into_owned();
    let mut kiln = Kiln::start_with(&["--auth", "jwt", "--jwt-keys", &keys_dir])?;
    let token = |tenant: &str| -> Result<String> {
        let out = std::process::Command::new(kiln_e2e::kiln_bin())
            .args([
                "token",
                "create",
                "--tenant",
                tenant,
                "--scope",
                "read,write",
            ])
            .arg("--key")
            .arg(&key)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    };
    let basic = |tenant: &str| -> Result<String> {
        Ok(format!(
            "Basic {}",
            kiln_otel::base64::encode(format!("{tenant}:{}", token(tenant)?).as_bytes())
        ))
    };
    let (a, b) = (basic("team-a")?, basic("team-b")?);
    // Two profiles an hour apart for team-a, one unrelated for team-b.
    for (tenant, auth, t, body) in [
        ("team-a", &a, T0, "main;checkout;pay 3\nmain;browse 1\n"),
        (
            "team-a",
            &a,
            T0 + 3600,
            "main;checkout;pay 1\nmain;search 5\n",
        ),
        ("team-b", &b, T0, "main;team_b_secret 9\n"),
    ] {
        kiln.set_auth(vec![("Authorization".into(), auth.clone())]);
        let (s, text) = kiln.ingest(
            tenant,
            &format!("name=shop.cpu%7Benv%3Dprod%7D&from={t}"),
            body.as_bytes().to_vec(),
            &[],
        )?;
        ensure!(s == 200, "{s} {text}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let (start, end) = range();
    let q = "/querier.v1.QuerierService";

    // 1. Services and profile types, from Series with __profile_type__.
    let series = ok(
        &kiln,
        &a,
        &format!("{q}/Series"),
        json!({"start": start, "end": end, "labelNames": ["service_name", "__profile_type__"],
               "matchers": ["{}"]}),
    )?;
    let text = series.to_string();
    ensure!(text.contains("\"shop\"") && text.contains(CPU), "{series}");
    // 2. Label pickers.
    let names = ok(
        &kiln,
        &a,
        &format!("{q}/LabelNames"),
        json!({"matchers": [format!("{{__profile_type__=\"{CPU}\", service_name=\"shop\"}}")],
               "start": start, "end": end}),
    )?;
    ensure!(names.to_string().contains("\"env\""), "{names}");
    let values = ok(
        &kiln,
        &a,
        &format!("{q}/LabelValues"),
        json!({"name": "env", "matchers": [format!("{{__profile_type__=\"{CPU}\"}}")],
               "start": start, "end": end}),
    )?;
    ensure!(values["names"] == json!(["prod"]), "{values}");
    // 3. Onboarding gate.
    let stats = ok(&kiln, &a, &format!("{q}/GetProfileStats"), json!({}))?;
    ensure!(stats["dataIngested"] == true, "{stats}");
    ensure!(int(&stats["oldestProfileTime"]) == T0 * 1000, "{stats}");
    // 4. Query-size tooltip.
    let analyzed = ok(
        &kiln,
        &a,
        &format!("{q}/AnalyzeQuery"),
        json!({"start": start, "end": end, "query": format!("{CPU}{{service_name=\"shop\"}}")}),
    )?;
    ensure!(
        int(&analyzed["queryImpact"]["totalQueriedSeries"]) == 1,
        "{analyzed}"
    );
    // 6. Function details: SelectMergeProfile in JSON with a call site.
    let pprof = ok(
        &kiln,
        &a,
        &format!("{q}/SelectMergeProfile"),
        json!({"profile_typeID": CPU, "label_selector": "{service_name=\"shop\"}",
               "start": start, "end": end, "maxNodes": 500,
               "stackTraceSelector": {"call_site": [{"name": "main"}, {"name": "checkout"}]}}),
    )?;
    let total: i64 = pprof["sample"]
        .as_array()
        .context("samples")?
        .iter()
        .map(|s| int(&s["value"][0]))
        .sum();
    ensure!(total == 4 * MS10, "checkout's stacks only: {total}");
    // Progressive flame graph: the root's children refined one by one add up to the whole.
    let flame = |auth: &str, sites: Value, max_nodes: i64| -> Result<i64> {
        let v = ok(
            &kiln,
            auth,
            &format!("{q}/SelectMergeStacktraces"),
            json!({"profile_typeID": CPU, "label_selector": "{service_name=\"shop\"}",
                   "start": start, "end": end, "maxNodes": max_nodes,
                   "stackTraceSelector": {"call_site": sites}}),
        )?;
        Ok(int(&v["flamegraph"]["total"]))
    };
    let whole = flame(&a, json!([]), 1 << 20)?;
    ensure!(whole == 10 * MS10, "{whole}");
    let parts = flame(&a, json!([{"name": "main"}, {"name": "checkout"}]), 2)?
        + flame(&a, json!([{"name": "main"}, {"name": "browse"}]), 2)?
        + flame(&a, json!([{"name": "main"}, {"name": "search"}]), 2)?;
    ensure!(parts == whole, "refinements {parts} vs {whole}");
    // 8b. Diff of the two hours.
    let side = |from: i64, to: i64| {
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}",
               "start": (from * 1000).to_string(), "end": to * 1000, "maxNodes": 100})
    };
    let diff = ok(
        &kiln,
        &a,
        &format!("{q}/Diff"),
        json!({"left": side(T0 - 60, T0 + 60), "right": side(T0 + 3540, T0 + 3660)}),
    )?;
    ensure!(int(&diff["flamegraph"]["leftTicks"]) == 4 * MS10, "{diff}");
    ensure!(int(&diff["flamegraph"]["rightTicks"]) == 6 * MS10, "{diff}");
    // 9. Heatmap: two profiles, one per slot.
    let heatmap = ok(
        &kiln,
        &a,
        &format!("{q}/SelectHeatmap"),
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}",
               "start": start, "end": end, "step": 3600, "groupBy": [],
               "queryType": "HEATMAP_QUERY_TYPE_INDIVIDUAL", "exemplarType": "EXEMPLAR_TYPE_NONE"}),
    )?;
    let counts: i64 = heatmap["series"][0]["slots"]
        .as_array()
        .context("slots")?
        .iter()
        .flat_map(|s| s["counts"].as_array().cloned().unwrap_or_default())
        .map(|c| c.as_i64().unwrap_or(0))
        .sum();
    ensure!(counts == 2, "{heatmap}");
    // 9b. Exemplars: the series' individual exemplars name each profile, and the flame graph
    // the app opens for one (`profileIdSelector`) is that profile alone; team-b cannot open it.
    let exemplars = ok(
        &kiln,
        &a,
        &format!("{q}/SelectSeries"),
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}",
               "start": start, "end": end, "step": 3600, "groupBy": [],
               "exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL"}),
    )?;
    let points = exemplars["series"][0]["points"]
        .as_array()
        .context("points")?;
    ensure!(points.len() == 2, "{exemplars}");
    for (point, want) in points.iter().zip([4 * MS10, 6 * MS10]) {
        let e = &point["exemplars"][0];
        ensure!(int(&e["value"]) == want, "{point}");
        let id = e["profileId"].as_str().context("profileId")?;
        let one = |auth: &str| -> Result<i64> {
            let v = ok(
                &kiln,
                auth,
                &format!("{q}/SelectMergeStacktraces"),
                json!({"profile_typeID": CPU, "label_selector": "{service_name=\"shop\"}",
                       "start": start, "end": end, "maxNodes": 16384,
                       "profileIdSelector": [id]}),
            )?;
            Ok(int(&v["flamegraph"]["total"]))
        };
        ensure!(one(&a)? == want, "profile {id}");
        ensure!(one(&b)? == 0, "team-b opened team-a's profile {id}");
    }
    // 10. Plugin settings.
    let setting = json!({"setting": {"name": "pluginSettings", "value": "{\"maxNodes\":16384}"}});
    ok(&kiln, &a, "/settings.v1.SettingsService/Set", setting)?;
    let got = ok(&kiln, &a, "/settings.v1.SettingsService/Get", json!({}))?;
    ensure!(got["settings"][0]["name"] == "pluginSettings", "{got}");
    // 11–13. Services Kiln does not offer: 501 `unimplemented`, so the app hides them.
    for path in [
        "/settings.v1.RecordingRulesService/ListRecordingRules",
        "/vcs.v1.VCSService/GithubApp",
        "/adhocprofiles.v1.AdHocProfileService/List",
    ] {
        let (status, v) = call(&kiln, &a, path, json!({}))?;
        ensure!(
            status == 501 && v["code"] == "unimplemented",
            "{path}: {status} {v}"
        );
    }
    // 14. Capability probe.
    let flags = ok(
        &kiln,
        &a,
        "/capabilities.v1.FeatureFlagsService/GetFeatureFlags",
        json!({}),
    )?;
    let projections = flags["featureFlags"]
        .as_array()
        .context("feature flags")?
        .iter()
        .any(|f| f["name"] == "functionProjections" && f["enabled"] == true);
    ensure!(projections, "{flags}");
    // 15. Function projections, as the app asks once the flag is on; their values are the
    // flame graph's for the same query.
    let query = |extra: Value| -> Value {
        let mut body = json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}",
                              "start": start, "end": end});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    let smst = format!("{q}/SelectMergeStacktraces");
    let table = ok(
        &kiln,
        &a,
        &smst,
        query(json!({"format": "PROFILE_FORMAT_FUNCTIONS",
                     "formatOptions": {"functions": {"limit": "0"}}})),
    )?;
    let rows = |v: &Value| -> Vec<(String, i64, i64)> {
        v["functions"]["functions"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        let name = r["name"].as_str().unwrap_or_default().to_owned();
                        (name, int(&r["self"]) / MS10, int(&r["total"]) / MS10)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let expected: Vec<(String, i64, i64)> = [
        ("search", 5, 5),
        ("pay", 4, 4),
        ("browse", 1, 1),
        ("main", 0, 10),
        ("checkout", 0, 4),
    ]
    .map(|(n, s, t)| (n.to_owned(), s, t))
    .to_vec();
    ensure!(rows(&table) == expected, "{table}");
    ensure!(int(&table["functions"]["total"]) == whole, "{table}");
    ensure!(int(&table["functions"]["totalFunctions"]) == 5, "{table}");
    let checkout = flame(&a, json!([{"name": "main"}, {"name": "checkout"}]), 100)?;
    ensure!(checkout == 4 * MS10, "{checkout}");
    // The table client: maxNodes rows, the profile's totals.
    let top = ok(
        &kiln,
        &a,
        &smst,
        query(json!({"format": "PROFILE_FORMAT_FUNCTIONS", "maxNodes": 2})),
    )?;
    ensure!(rows(&top) == expected[..2], "{top}");
    ensure!(int(&top["functions"]["total"]) == whole, "{top}");
    // The sandwich of checkout: its total and its callers' root are the flame graph's.
    let sandwich = ok(
        &kiln,
        &a,
        &smst,
        query(
            json!({"format": "PROFILE_FORMAT_SANDWICH", "sandwichFunction": "checkout",
                     "maxNodes": 16384}),
        ),
    )?;
    let sw = &sandwich["sandwich"];
    ensure!(int(&sw["total"]) == checkout, "{sandwich}");
    ensure!(int(&sw["callers"]["total"]) == checkout, "{sandwich}");
    let name = |n: &Value| sw["names"][n["nameIndex"].as_u64().unwrap_or(0) as usize].clone();
    ensure!(name(&sw["callers"]) == "checkout", "{sandwich}");
    ensure!(name(&sw["callers"]["children"][0]) == "main", "{sandwich}");
    ensure!(name(&sw["callees"]["children"][0]) == "pay", "{sandwich}");
    ensure!(
        int(&sw["callees"]["children"][0]["total"]) == checkout,
        "{sandwich}"
    );
    // The call tree below main, one level: its children add up to the flame graph's total.
    let tree = ok(
        &kiln,
        &a,
        &smst,
        query(json!({"format": "PROFILE_FORMAT_FUNCTION_TREE",
                     "formatOptions": {"functionTree": {
                         "selection": "FUNCTION_TREE_SELECTION_ROOT_PATH",
                         "direction": "FUNCTION_TREE_DIRECTION_CALLEES", "maxDepth": 1}},
                     "stackTraceSelector": {"callSite": [{"name": "main"}]}})),
    )?;
    let root = &tree["functionTree"]["callees"]["root"];
    ensure!(int(&root["total"]) == whole, "{tree}");
    let below: i64 = root["children"]
        .as_array()
        .context("children")?
        .iter()
        .map(|c| int(&c["total"]))
        .sum();
    ensure!(below == whole, "{tree}");
    // The diff's function tables: the two hours' rows side by side.
    let diff_table = ok(
        &kiln,
        &a,
        &format!("{q}/Diff"),
        json!({"left": {"profileTypeID": CPU, "labelSelector": "{service_name=\"shop\"}",
                        "start": ((T0 - 60) * 1000).to_string(), "end": (T0 + 60) * 1000,
                        "format": "PROFILE_FORMAT_FUNCTIONS",
                        "formatOptions": {"functions": {"limit": "0"}}},
               "right": side(T0 + 3540, T0 + 3660)}),
    )?;
    let f = &diff_table["functions"];
    ensure!(int(&f["left"]["total"]) == 4 * MS10, "{diff_table}");
    ensure!(int(&f["right"]["total"]) == 6 * MS10, "{diff_table}");
    ensure!(int(&f["left"]["totalFunctions"]) == 5, "{diff_table}");

    // The other tenant: nothing of team-a through the same calls, its settings its own.
    let series = ok(
        &kiln,
        &b,
        &format!("{q}/Series"),
        json!({"start": start, "end": end, "labelNames": ["service_name"], "matchers": ["{}"]}),
    )?;
    ensure!(!series.to_string().contains("checkout"), "{series}");
    ensure!(flame(&b, json!([{"name": "main"}, {"name": "checkout"}]), 100)? == 0);
    let diff = ok(
        &kiln,
        &b,
        &format!("{q}/Diff"),
        json!({"left": side(T0 + 3540, T0 + 3660), "right": side(T0 + 3540, T0 + 3660)}),
    )?;
    ensure!(int(&diff["flamegraph"]["rightTicks"]) == 0, "{diff}");
    let table = ok(
        &kiln,
        &b,
        &smst,
        query(json!({"format": "PROFILE_FORMAT_FUNCTIONS"})),
    )?;
    // team-b's own profile only.
    let own: Vec<(String, i64, i64)> = vec![("team_b_secret".into(), 9, 9), ("main".into(), 0, 9)];
    ensure!(rows(&table) == own, "{table}");
    let sandwich = ok(
        &kiln,
        &b,
        &smst,
        query(json!({"format": "PROFILE_FORMAT_SANDWICH", "sandwichFunction": "checkout"})),
    )?;
    let sw = &sandwich["sandwich"];
    ensure!(
        int(&sw["total"]) == 0
            && int(&sw["callers"]["total"]) == 0
            && sw["callees"].get("children").is_none(),
        "{sandwich}"
    );
    let got = ok(&kiln, &b, "/settings.v1.SettingsService/Get", json!({}))?;
    ensure!(
        got["settings"].as_array().is_none_or(|s| s.is_empty()),
        "{got}"
    );
    // Without credentials: 401.
    for path in [format!("{q}/Series"), "/vcs.v1.VCSService/GithubApp".into()] {
        let (status, _) = call(&kiln, "", &path, json!({}))?;
        ensure!(status == 401, "{path}: {status}");
    }
    kiln.stop()?;
    Ok(())
}
