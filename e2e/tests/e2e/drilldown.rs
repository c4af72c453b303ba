//! Grafana Profiles Drilldown's calls replayed against the spawned `kiln` as the app sends them
//! through Grafana's datasource proxy (`../shared/research/drilldown.md` §1.3): Connect JSON with
//! the app's field names (proto and lowerCamel mixed, int64 as strings), Basic auth in JWT mode,
//! answers checked against Kiln's own data (the function projections against its flame graphs),
//! and every call refusing another tenant's data.

use std::collections::BTreeMap;
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

/// A call as the datasource backend makes it: binary protobuf, the datasource's credentials.
fn connect<Req: prost::Message, Resp: prost::Message + Default>(
    kiln: &Kiln,
    auth: &str,
    path: &str,
    req: &Req,
) -> Result<Resp> {
    let resp = kiln
        .http()
        .post(kiln.url(path))
        .header("Authorization", auth)
        .header("Content-Type", "application/proto")
        .body(req.encode_to_vec())
        .send()?;
    let status = resp.status();
    let body = resp.bytes()?;
    ensure!(
        status.is_success(),
        "{path}: {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(Resp::decode(body.as_ref())?)
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

/// A `kiln` in JWT mode and the key its tokens are signed with.
struct JwtKiln {
    kiln: Kiln,
    key: std::path::PathBuf,
    _keys: tempfile::TempDir,
}

impl JwtKiln {
    fn start() -> Result<Self> {
        let keys = tempfile::tempdir()?;
        let key = keys.path().join("k1.secret");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef-drilldown-e2e")?;
        let keys_dir = keys.path().to_string_lossy().into_owned();
        let kiln = Kiln::start_with(&["--auth", "jwt", "--jwt-keys", &keys_dir])?;
        Ok(Self {
            kiln,
            key,
            _keys: keys,
        })
    }

    /// The datasource's credentials for `tenant`: Basic, user = tenant, password = a token.
    fn basic(&self, tenant: &str) -> Result<String> {
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
            .arg(&self.key)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8(out.stdout)?.trim().to_owned();
        Ok(format!(
            "Basic {}",
            kiln_otel::base64::encode(format!("{tenant}:{token}").as_bytes())
        ))
    }
}

/// The app's services, in JWT mode with Basic auth (the datasource's user = tenant, password =
/// token), over one tenant's data; a second tenant sees none of it through the same calls.
#[test]
fn the_drilldown_app_s_calls_work_and_stay_in_their_tenant() -> Result<()> {
    let jwt = JwtKiln::start()?;
    let (a, b) = (jwt.basic("team-a")?, jwt.basic("team-b")?);
    let mut kiln = jwt.kiln;
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
    // 11. Metrics from profiles: the app's create, list and delete (the rules' evaluation is
    // `recording_rules.rs`'s).
    let rr = "/settings.v1.RecordingRulesService";
    let made = ok(
        &kiln,
        &a,
        &format!("{rr}/UpsertRecordingRule"),
        json!({"metricName": "profiles_recorded_shop_cpu",
               "matchers": ["{ service_name=\"shop\" }", format!("{{ __profile_type__=\"{CPU}\"}}")],
               "groupBy": []}),
    )?;
    let id = made["rule"]["id"].as_str().context("a rule id")?.to_owned();
    let listed = ok(&kiln, &a, &format!("{rr}/ListRecordingRules"), json!({}))?;
    ensure!(
        listed["rules"][0]["id"] == id.as_str()
            && listed["rules"][0]["profileType"] == CPU
            && listed["rules"][0]["matchers"][0] == "{ service_name=\"shop\" }",
        "{listed}"
    );
    let other = ok(&kiln, &b, &format!("{rr}/ListRecordingRules"), json!({}))?;
    ensure!(
        other.get("rules").is_none(),
        "team-b sees team-a's rules: {other}"
    );
    ok(
        &kiln,
        &a,
        &format!("{rr}/DeleteRecordingRule"),
        json!({"id": id}),
    )?;
    // 12. A service Kiln does not offer: 501 `unimplemented`, so the app hides it.
    let (status, v) = call(&kiln, &a, "/vcs.v1.VCSService/GithubApp", json!({}))?;
    ensure!(
        status == 501 && v["code"] == "unimplemented",
        "vcs: {status} {v}"
    );
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

/// Runs `cmd`, failing with its output when it fails; returns its stdout.
fn run(cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `cpu.pb.gz` and `heap.pb.gz` as the Go runtime writes them (`e2e/clients/go/main.go`,
/// built offline with the system's Go), in `dir`.
fn go_profiles(dir: &std::path::Path) -> Result<()> {
    let bin = dir.join("profdemo");
    run(std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(kiln_e2e::repo_root().join("e2e/clients/go/main.go"))
        .env("GO111MODULE", "off")
        .env("GOPROXY", "off")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOFLAGS", "-buildvcs=false"))?;
    run(std::process::Command::new(&bin).arg(dir))?;
    Ok(())
}

/// The upload tab (`adhocprofiles.v1`) with the Go runtime's own pprof files, as the app sends
/// them (`{name, profile: <base64>}`, Basic auth): every sample type listed and drawn with the
/// total the file holds, the uploads listed and kept across a restart; another tenant lists
/// none and cannot get them.
#[test]
fn the_upload_tab_draws_go_profiles_and_keeps_them_per_tenant() -> Result<()> {
    let go = tempfile::tempdir()?;
    go_profiles(go.path())?;
    let jwt = JwtKiln::start()?;
    let (a, b) = (jwt.basic("team-a")?, jwt.basic("team-b")?);
    let mut kiln = jwt.kiln;
    let svc = "/adhocprofiles.v1.AdHocProfileService";
    let mut ids = Vec::new();
    for file in ["cpu.pb.gz", "heap.pb.gz"] {
        let data = std::fs::read(go.path().join(file))?;
        let totals = kiln_e2e::pprof_totals(&data)?;
        let up = ok(
            &kiln,
            &a,
            &format!("{svc}/Upload"),
            json!({"name": file, "profile": kiln_otel::base64::encode(&data)}),
        )?;
        let id = up["id"].as_str().context("id")?.to_owned();
        let types: Vec<&str> = up["profileTypes"]
            .as_array()
            .context("profileTypes")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let want: Vec<&str> = totals.iter().map(|((t, _), _)| t.as_str()).collect();
        ensure!(types == want, "{file}: {types:?} vs {want:?}");
        for ((sample_type, _), total) in &totals {
            let got = ok(
                &kiln,
                &a,
                &format!("{svc}/Get"),
                json!({"id": id, "profile_type": sample_type}),
            )?;
            let fb: Value =
                serde_json::from_str(got["flamebearerProfile"].as_str().context("fb")?)?;
            ensure!(
                int(&fb["flamebearer"]["numTicks"]) == *total,
                "{file} {sample_type}: {} vs {total}",
                fb["flamebearer"]["numTicks"]
            );
            ensure!(
                fb["metadata"]["name"] == sample_type.as_str(),
                "{}",
                fb["metadata"]
            );
        }
        ids.push(id);
    }
    let listed = |kiln: &Kiln, auth: &str| -> Result<Vec<String>> {
        let list = ok(kiln, auth, &format!("{svc}/List"), json!({}))?;
        Ok(list["profiles"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|p| p["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    };
    ensure!(
        listed(&kiln, &a)? == [ids[1].clone(), ids[0].clone()],
        "newest first"
    );
    ensure!(listed(&kiln, &b)?.is_empty());
    let (status, v) = call(&kiln, &b, &format!("{svc}/Get"), json!({"id": ids[0]}))?;
    ensure!(status == 404 && v["code"] == "not_found", "{status} {v}");

    kiln.restart()?;
    ensure!(listed(&kiln, &a)?.len() == 2, "kept across a restart");
    ensure!(listed(&kiln, &b)?.is_empty());
    let (status, v) = call(&kiln, &a, &format!("{svc}/Get"), json!({"id": ids[0]}))?;
    ensure!(status == 200, "{status} {v}");
    kiln.stop()?;
    Ok(())
}

/// Reads Pyroscope's tree encoding (`PROFILE_FORMAT_TREE`) from its description: nodes in
/// pre-order, each `uvarint(len) name uvarint(self) uvarint(children)`, under a nameless root.
/// Returns root-first stacks (without the root) with their self values, and each node's
/// root-first path with its total.
fn read_tree(b: &[u8]) -> Result<(BTreeMap<Vec<String>, i64>, BTreeMap<Vec<String>, i64>)> {
    fn uvarint(b: &[u8], at: &mut usize) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*at).context("truncated varint")?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
        }
        anyhow::bail!("varint too long")
    }
    let (mut stacks, mut totals) = (BTreeMap::new(), BTreeMap::new());
    let mut at = 0;
    // Per open node: its path and how many children are still to come.
    let mut open: Vec<(Vec<String>, u64)> = vec![(Vec::new(), u64::from(!b.is_empty()))];
    let mut root = true;
    while let Some((path, left)) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        let mut path = path.clone();
        let len = usize::try_from(uvarint(b, &mut at)?)?;
        let name = std::str::from_utf8(b.get(at..at + len).context("truncated name")?)?;
        at += len;
        let self_value = uvarint(b, &mut at)? as i64;
        let children = uvarint(b, &mut at)?;
        if root {
            ensure!(name.is_empty(), "the root has a name: {name:?}");
            root = false;
        } else {
            path.push(name.to_owned());
        }
        if self_value != 0 {
            *stacks.entry(path.clone()).or_insert(0) += self_value;
        }
        for depth in 1..=path.len() {
            *totals.entry(path[..depth].to_vec()).or_insert(0) += self_value;
        }
        open.push((path, children));
    }
    ensure!(at == b.len(), "{} bytes after the tree", b.len() - at);
    Ok((stacks, totals))
}

/// `go tool pprof -top` of a profile: its total, in the profile's unit (nanoseconds here).
fn pprof_top_total(profile: &[u8], dir: &std::path::Path, name: &str) -> Result<i64> {
    let path = dir.join(name);
    std::fs::write(&path, profile)?;
    let out = run(std::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-unit=ns"])
        .arg(&path)
        .env("HOME", dir))?;
    let line = out
        .lines()
        .find(|l| l.contains(" total"))
        .with_context(|| format!("no total in {out}"))?;
    let total = line
        .rsplit_once(" of ")
        .and_then(|(_, t)| t.strip_suffix(" total"))
        .and_then(|t| t.trim().strip_suffix("ns"))
        .with_context(|| format!("{line:?}"))?;
    Ok(total.parse()?)
}

/// `PROFILE_FORMAT_TREE` and `SelectMergeProfile`'s `max_nodes` over the Go runtime's CPU
/// profile: the tree bytes read back are the flame graph's stacks and total (cut to the same
/// nodes under a budget, and for a call site too); the cut pprof keeps the heaviest nodes and
/// `go tool pprof` reads the flame graph's total from it, for a call site too; another tenant
/// gets an empty tree and an empty profile.
#[test]
fn tree_bytes_and_cut_pprof_agree_with_the_flame_graph() -> Result<()> {
    use kiln_proto::querier::v1 as q;
    use kiln_proto::types::v1 as t;
    use kiln_storage::query::tree::flamegraph_stacks;

    let go = tempfile::tempdir()?;
    go_profiles(go.path())?;
    let jwt = JwtKiln::start()?;
    let (a, b) = (jwt.basic("team-a")?, jwt.basic("team-b")?);
    let mut kiln = jwt.kiln;
    for (auth, tenant, name, body) in [
        (
            &a,
            "team-a",
            "go-demo",
            std::fs::read(go.path().join("cpu.pb.gz"))?,
        ),
        (&b, "team-b", "other", b"main;team_b_secret 9\n".to_vec()),
    ] {
        kiln.set_auth(vec![("Authorization".into(), auth.clone())]);
        let format = if tenant == "team-a" {
            "pprof"
        } else {
            "folded"
        };
        let (s, text) = kiln.ingest(tenant, &format!("name={name}&format={format}"), body, &[])?;
        ensure!(s == 200, "{s} {text}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let q = "/querier.v1.QuerierService";
    let selector = "{service_name=\"go-demo\"}";
    let stacktraces = |auth: &str, format: q::ProfileFormat, max_nodes: i64, site: &[String]| {
        let req = q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            max_nodes: Some(max_nodes),
            format: format as i32,
            stack_trace_selector: Some(t::StackTraceSelector {
                call_site: site
                    .iter()
                    .map(|n| t::Location { name: n.clone() })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        connect(&kiln, auth, &format!("{q}/SelectMergeStacktraces"), &req)
    };
    let fg_of = |r: q::SelectMergeStacktracesResponse| r.flamegraph.unwrap_or_default();
    let all = fg_of(stacktraces(&a, q::ProfileFormat::Flamegraph, 1 << 20, &[])?);
    ensure!(all.total > 0, "no CPU samples");
    let tree = stacktraces(&a, q::ProfileFormat::Tree, 1 << 20, &[])?.tree;
    let (stacks, totals) = read_tree(&tree)?;
    ensure!(
        stacks == flamegraph_stacks(&all)?,
        "the tree's stacks are the flame graph's"
    );
    ensure!(stacks.values().sum::<i64>() == all.total);

    // The same bytes in the app's JSON (base64 in `tree`), and with a budget: the nodes the
    // flame graph keeps, the total whole.
    let json_tree = ok(
        &kiln,
        &a,
        &format!("{q}/SelectMergeStacktraces"),
        json!({"profile_typeID": CPU, "label_selector": selector, "maxNodes": 8,
               "format": "PROFILE_FORMAT_TREE"}),
    )?;
    let cut =
        kiln_otel::base64::decode(json_tree["tree"].as_str().context("tree")?).context("base64")?;
    let (cut_stacks, cut_totals) = read_tree(&cut)?;
    let budget8 = fg_of(stacktraces(&a, q::ProfileFormat::Flamegraph, 8, &[])?);
    ensure!(
        cut_stacks == flamegraph_stacks(&budget8)?,
        "cut as the flame graph is"
    );
    ensure!(cut_stacks.values().sum::<i64>() == all.total);
    let threshold = |n: usize| {
        let mut v: Vec<i64> = totals.values().copied().collect();
        v.sort_unstable_by(|x, y| y.cmp(x));
        v.get(n - 1).copied().unwrap_or(0)
    };
    let kept = |n: usize| totals.values().filter(|v| **v >= threshold(n)).count();
    let named = cut_totals
        .keys()
        .filter(|p| p.last().is_some_and(|n| n != "other"))
        .count();
    ensure!(
        named <= kept(8) && named < totals.len(),
        "{named} nodes for a budget of 8"
    );

    // A call site: the heaviest root-first pair of frames.
    let site: Vec<String> = totals
        .iter()
        .filter(|(p, _)| p.len() == 2)
        .max_by_key(|(_, v)| **v)
        .map(|(p, _)| p.clone())
        .context("a stack two frames deep")?;
    let focused = fg_of(stacktraces(
        &a,
        q::ProfileFormat::Flamegraph,
        1 << 20,
        &site,
    )?);
    let (site_stacks, _) =
        read_tree(&stacktraces(&a, q::ProfileFormat::Tree, 1 << 20, &site)?.tree)?;
    ensure!(site_stacks == flamegraph_stacks(&focused)?);
    ensure!(site_stacks.keys().all(|k| k.starts_with(&site)));

    // SelectMergeProfile as the export sends it (binary proto), cut to 16 nodes.
    let merge = |auth: &str, max_nodes: Option<i64>, site: &[String]| {
        let req = q::SelectMergeProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            max_nodes,
            stack_trace_selector: Some(t::StackTraceSelector {
                call_site: site
                    .iter()
                    .map(|n| t::Location { name: n.clone() })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        connect::<_, kiln_proto::google::v1::Profile>(
            &kiln,
            auth,
            &format!("{q}/SelectMergeProfile"),
            &req,
        )
    };
    let function_names = |p: &kiln_proto::google::v1::Profile| -> Vec<String> {
        p.function
            .iter()
            .map(|f| p.string_table[f.name as usize].clone())
            .collect()
    };
    let whole = merge(&a, None, &[])?;
    let cut = merge(&a, Some(16), &[])?;
    let cut_site = merge(&a, Some(4), &site)?;
    let names = function_names(&cut);
    let real: Vec<&String> = names.iter().filter(|n| *n != "other").collect();
    ensure!(names.iter().any(|n| n == "other"), "{names:?}");
    ensure!(
        real.len() <= kept(16) && real.len() < function_names(&whole).len(),
        "{} functions for a budget of 16 ({} uncut)",
        real.len(),
        function_names(&whole).len()
    );
    let bytes = |p: &kiln_proto::google::v1::Profile| prost::Message::encode_to_vec(p);
    ensure!(pprof_top_total(&bytes(&whole), go.path(), "whole.pb")? == all.total);
    ensure!(pprof_top_total(&bytes(&cut), go.path(), "cut.pb")? == all.total);
    ensure!(cut_site.sample.len() < whole.sample.len());
    ensure!(pprof_top_total(&bytes(&cut_site), go.path(), "site.pb")? == focused.total);

    // The other tenant: nothing of team-a's.
    ensure!(
        stacktraces(&b, q::ProfileFormat::Tree, 1 << 20, &[])?
            .tree
            .is_empty()
    );
    ensure!(merge(&b, Some(16), &[])?.sample.is_empty());
    kiln.stop()?;
    Ok(())
}

/// `GetFeatureFlags` says what Kiln serves, as Pyroscope names it, and each flag it turns on
/// holds: a function recording rule is made and listed, and a UTF-8 label name is written,
/// listed and matched; another tenant sees neither.
#[test]
fn feature_flags_say_what_kiln_serves() -> Result<()> {
    use kiln_proto::capabilities::v1 as caps;
    use kiln_proto::settings::v1 as st;
    use kiln_proto::types::v1 as t;
    let kiln = Kiln::start(&[])?;
    let flags: caps::GetFeatureFlagsResponse = kiln.connect(
        "flags",
        "/capabilities.v1.FeatureFlagsService/GetFeatureFlags",
        &caps::GetFeatureFlagsRequest {},
    )?;
    let got: Vec<(&str, bool)> = flags
        .feature_flags
        .iter()
        .map(|f| (f.name.as_str(), f.enabled))
        .collect();
    ensure!(
        got == [
            ("functionProjections", true),
            ("pyroscopeRuler", true),
            ("pyroscopeRulerFunctions", true),
            ("utf8LabelNames", true),
            ("v2StorageLayer", false),
        ],
        "{got:?}"
    );

    // pyroscopeRuler and pyroscopeRulerFunctions: a rule of one function.
    let made: st::UpsertRecordingRuleResponse = kiln.connect(
        "flags",
        "/settings.v1.RecordingRulesService/UpsertRecordingRule",
        &st::UpsertRecordingRuleRequest {
            metric_name: "profiles_recorded_pay_cpu".into(),
            matchers: vec![format!("{{__profile_type__=\"{CPU}\"}}")],
            stacktrace_filter: Some(st::StacktraceFilter {
                function_name: Some(st::StacktraceFilterFunctionName {
                    function_name: "pay".into(),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        },
    )?;
    let id = made.rule.context("the rule")?.id;
    for (tenant, want) in [("flags", 1), ("flags-other", 0)] {
        let list: st::ListRecordingRulesResponse = kiln.connect(
            tenant,
            "/settings.v1.RecordingRulesService/ListRecordingRules",
            &st::ListRecordingRulesRequest {},
        )?;
        let found = list
            .rules
            .iter()
            .filter(|r| r.id == id && r.stacktrace_filter.is_some())
            .count();
        ensure!(found == want, "{tenant}: {list:?}");
    }

    // utf8LabelNames: a name of another script, with a dot.
    let (s, text) = kiln.ingest(
        "flags",
        &format!(
            "name={}&from={T0}",
            urlencoding("café.cpu{zone.région=eu-ouest}")
        ),
        b"main;pay 3\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {text}");
    ensure!(
        kiln.label_names("flags")?
            .iter()
            .any(|n| n == "zone.région"),
        "{:?}",
        kiln.label_names("flags")?
    );
    for selector in [
        r#"{zone.région="eu-ouest"}"#,
        r#"{"zone.région"="eu-ouest"}"#,
    ] {
        let fg = kiln.flamegraph("flags", CPU, selector)?;
        ensure!(fg.total == 3 * 10_000_000, "{selector}: {}", fg.total);
    }
    let values: t::LabelValuesResponse = kiln.connect(
        "flags-other",
        "/querier.v1.QuerierService/LabelValues",
        &t::LabelValuesRequest {
            name: "zone.région".into(),
            matchers: vec![],
            start: kiln_e2e::ALL_TIME.0,
            end: kiln_e2e::ALL_TIME.1,
        },
    )?;
    ensure!(values.names.is_empty(), "{values:?}");
    kiln.assert_tenant_empty("flags-other")?;
    Ok(())
}

/// `s` percent-encoded for a query string.
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
