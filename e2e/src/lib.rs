//! Kiln's end-to-end harness: spawns the real `kiln` binary on a free loopback port with its own
//! data directory, talks to it over HTTP (Connect and `/ingest`), and records what real profiling
//! clients send through a small loopback proxy so tests can compare stored totals with the
//! values the clients really sent.

pub mod haproxy;
pub mod prometheus;
pub mod proxy;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use prost::Message;

/// The operator tenant of [`Kiln::start`]'s servers: its `X-Scope-OrgID` reads `/metrics`.
pub const OPERATOR: &str = "kiln-operator";

/// The whole time range: profiles of any age are queryable.
pub const ALL_TIME: (i64, i64) = (1, 4_102_444_800_000);

/// Path of the `kiln` binary the test build made (`KILN_BIN` overrides).
pub fn kiln_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KILN_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/e2e-<hash> → target/<profile>/kiln
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join("kiln")
}

/// Path of the `gpx_kiln` Grafana plugin binary the test build made (`KILN_PLUGIN_BIN` overrides).
pub fn plugin_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KILN_PLUGIN_BIN") {
        return PathBuf::from(p);
    }
    kiln_bin().with_file_name("gpx_kiln")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// `../shared/corpus`, when present.
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = repo_root().join("../shared/corpus");
    dir.is_dir().then_some(dir)
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`); 0 when it cannot be read.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `kiln token create` with the key file `key` (an HMAC secret, say): a token of `tenant` with
/// `scope` (`read`, `write`, `admin`, or several comma-separated).
pub fn token(key: &Path, tenant: &str, scope: &str) -> Result<String> {
    let out = Command::new(kiln_bin())
        .args([
            "token", "create", "--tenant", tenant, "--scope", scope, "--key",
        ])
        .arg(key)
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// Waits until `url` answers 2xx, or `child` exits, or `within` passes; says which.
pub fn wait_ready(
    http: &reqwest::blocking::Client,
    url: &str,
    mut child: Option<&mut Child>,
    within: Duration,
    what: &str,
) -> Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(r) = http.get(url).send()
            && r.status().is_success()
        {
            return Ok(());
        }
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!("{what} exited with {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what} did not become ready within {within:?}")
}

/// A running `kiln serve`.
pub struct Kiln {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    http: reqwest::blocking::Client,
    auth: Option<Vec<(String, String)>>,
    /// `http`, or `https` for a server started with TLS.
    scheme: &'static str,
}

impl Kiln {
    /// Starts kiln in `trusted-header` mode (tenants from `X-Scope-OrgID`) with `extra` flags;
    /// [`OPERATOR`] is the operator tenant (`--admin-tenant`) unless `extra` names one.
    pub fn start(extra: &[&str]) -> Result<Self> {
        let mut args = vec!["--auth", "trusted-header"];
        if !extra.contains(&"--admin-tenant") {
            args.extend(["--admin-tenant", OPERATOR]);
        }
        args.extend_from_slice(extra);
        Self::start_with(&args)
    }

    /// `/metrics` on the API port, as the operator's proxy reads it (trusted-header mode).
    pub fn metrics_text(&self) -> Result<String> {
        let resp = self
            .http
            .get(self.url("/metrics"))
            .header("X-Scope-OrgID", OPERATOR)
            .send()?;
        if !resp.status().is_success() {
            bail!("/metrics: {}", resp.status());
        }
        Ok(resp.text()?)
    }

    /// A handle on a server this harness did not start (a load balancer in front of several
    /// processes): the same clients, no process to stop or kill.
    pub fn attach(port: u16) -> Result<Self> {
        Ok(Self {
            child: None,
            port,
            data_dir: tempfile::tempdir()?,
            args: Vec::new(),
            env: Vec::new(),
            log: PathBuf::new(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .no_proxy()
                .build()?,
            auth: None,
            scheme: "http",
        })
    }

    /// Starts kiln with exactly these flags (plus listen address, data dir and a short flush).
    pub fn start_with(flags: &[&str]) -> Result<Self> {
        Self::start_with_env(flags, &[])
    }

    /// [`Kiln::start_with`] for a server with TLS on its port (`--tls-cert` among `flags`):
    /// `http` is the client that trusts its certificate (and presents one, for mutual TLS).
    pub fn start_tls(flags: &[&str], http: reqwest::blocking::Client) -> Result<Self> {
        Self::start_as(flags, &[], http, "https")
    }

    /// [`Kiln::start_with`] with these environment variables set for the process.
    pub fn start_with_env(flags: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        Self::start_as(flags, env, http, "http")
    }

    fn start_as(
        flags: &[&str],
        env: &[(&str, &str)],
        http: reqwest::blocking::Client,
        scheme: &'static str,
    ) -> Result<Self> {
        let data_dir = tempfile::tempdir()?;
        let log = data_dir.path().join("kiln.log");
        let mut args = vec![
            "serve".to_string(),
            "--flush-interval-ms".into(),
            "50".into(),
        ];
        // Kiln's own profiles would land beside each test's data; a test that wants them says so.
        if !flags.iter().any(|f| f.starts_with("--self-profile")) {
            args.push("--self-profile=false".into());
        }
        args.extend(flags.iter().map(|s| s.to_string()));
        let mut k = Self {
            child: None,
            port: free_port(),
            data_dir,
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log,
            http,
            auth: None,
            scheme,
        };
        k.spawn()?;
        Ok(k)
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = kiln_bin();
        if !bin.exists() {
            bail!(
                "{} does not exist: build the workspace tests first",
                bin.display()
            );
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&bin)
            .args(&self.args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(self.data_dir.path().join("data"))
            .env("KILN_LOG", "info,kiln_storage=debug")
            // A machine's own debuginfod servers (Debian's `debuginfod` package sets them for
            // login shells) are not the tests': traffic stays on 127.0.0.1.
            .env_remove("DEBUGINFOD_URLS")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        self.child = Some(child);
        let url = self.url("/ready");
        wait_ready(
            &self.http,
            &url,
            self.child.as_mut(),
            Duration::from_secs(30),
            "kiln",
        )
        .map_err(|e| anyhow!("{e}: {}", self.log_text()))
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Headers sent with every request of this harness (credentials), replacing `X-Scope-OrgID`
    /// when set.
    pub fn set_auth(&mut self, headers: Vec<(String, String)>) {
        self.auth = Some(headers);
    }

    fn with_auth(
        &self,
        req: reqwest::blocking::RequestBuilder,
        tenant: &str,
    ) -> reqwest::blocking::RequestBuilder {
        match &self.auth {
            None => req.header("X-Scope-OrgID", tenant),
            Some(headers) => headers.iter().fold(req, |r, (k, v)| r.header(k, v)),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM failed");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!(
                        "kiln exited with {status} after SIGTERM: {}",
                        self.log_text()
                    );
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("kiln did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server with SIGKILL (no flush, no goodbye) and waits for it to be gone.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the server again (after [`Kiln::kill`] or [`Kiln::stop`]) on the same port and data.
    pub fn start_again(&mut self) -> Result<()> {
        self.spawn()
    }

    /// Stops with SIGTERM and starts again on the same port and data.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// Whether the server still answers `/ready`. Tries three times: after a refused oversized
    /// body the server closes that connection, and the client's pool may hand it out once more.
    pub fn is_ready(&self) -> bool {
        (0..3).any(|attempt| {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.http
                .get(self.url("/ready"))
                .send()
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        })
    }

    /// `http://127.0.0.1:PORT{path}` (`https://` when started with TLS).
    pub fn url(&self, path: &str) -> String {
        format!("{}://127.0.0.1:{}{path}", self.scheme, self.port)
    }

    /// The HTTP client.
    pub fn http(&self) -> &reqwest::blocking::Client {
        &self.http
    }

    /// `POST /ingest?{query}` for `tenant`; returns status and body text.
    pub fn ingest(
        &self,
        tenant: &str,
        query: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, String)> {
        let mut req = self
            .with_auth(
                self.http.post(self.url(&format!("/ingest?{query}"))),
                tenant,
            )
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send()?;
        Ok((resp.status().as_u16(), resp.text()?))
    }

    /// A Connect call with binary protobuf, as Grafana makes it.
    pub fn connect<Req: Message, Resp: Message + Default>(
        &self,
        tenant: &str,
        path: &str,
        req: &Req,
    ) -> Result<Resp> {
        let resp = self
            .with_auth(self.http.post(self.url(path)), tenant)
            .header("Content-Type", "application/proto")
            .body(req.encode_to_vec())
            .send()?;
        let status = resp.status();
        let mut body = Vec::new();
        resp.take(u64::MAX).read_to_end(&mut body)?;
        if !status.is_success() {
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Resp::decode(body.as_slice()).map_err(|e| anyhow!("{path}: bad response: {e}"))
    }

    /// Profile types of a tenant over all time.
    pub fn profile_types(&self, tenant: &str) -> Result<Vec<t::ProfileType>> {
        let r: q::ProfileTypesResponse = self.connect(
            tenant,
            "/querier.v1.QuerierService/ProfileTypes",
            &q::ProfileTypesRequest {
                start: ALL_TIME.0,
                end: ALL_TIME.1,
            },
        )?;
        Ok(r.profile_types)
    }

    /// Label names of a tenant's series over all time.
    pub fn label_names(&self, tenant: &str) -> Result<Vec<String>> {
        let r: t::LabelNamesResponse = self.connect(
            tenant,
            "/querier.v1.QuerierService/LabelNames",
            &t::LabelNamesRequest {
                matchers: vec![],
                start: ALL_TIME.0,
                end: ALL_TIME.1,
            },
        )?;
        Ok(r.names)
    }

    /// The flame graph of a profile type and selector over all time.
    pub fn flamegraph(
        &self,
        tenant: &str,
        profile_type: &str,
        selector: &str,
    ) -> Result<q::FlameGraph> {
        let r: q::SelectMergeStacktracesResponse = self.connect(
            tenant,
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            &q::SelectMergeStacktracesRequest {
                profile_type_id: profile_type.into(),
                label_selector: selector.into(),
                start: ALL_TIME.0,
                end: ALL_TIME.1,
                max_nodes: Some(1 << 20),
                ..Default::default()
            },
        )?;
        r.flamegraph
            .ok_or_else(|| anyhow!("no flame graph in the response"))
    }

    /// Asserts that `tenant` sees no data at all.
    pub fn assert_tenant_empty(&self, tenant: &str) -> Result<()> {
        let types = self.profile_types(tenant)?;
        if !types.is_empty() {
            bail!("tenant {tenant} sees profile types {types:?}");
        }
        let names = self.label_names(tenant)?;
        if !names.is_empty() {
            bail!("tenant {tenant} sees label names {names:?}");
        }
        Ok(())
    }
}

impl Drop for Kiln {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A gRPC request of `msg` for `tenant` (its `x-scope-orgid` metadata).
pub fn with_tenant<T>(msg: T, tenant: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "x-scope-orgid",
        tenant.parse().expect("a tenant id is valid metadata"),
    );
    req
}

/// Per (sample type, unit): the total of values a pprof profile carries, counting only samples
/// without a negative value (what Pyroscope's normalization keeps).
pub fn pprof_totals(data: &[u8]) -> Result<Vec<((String, String), i64)>> {
    let raw = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out)?;
        out
    } else {
        data.to_vec()
    };
    let p = kiln_proto::google::v1::Profile::decode(raw.as_slice())?;
    let s = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
    let mut totals: Vec<((String, String), i64)> = p
        .sample_type
        .iter()
        .map(|vt| ((s(vt.r#type), s(vt.unit)), 0))
        .collect();
    for sample in &p.sample {
        if sample.value.iter().any(|v| *v < 0) {
            continue;
        }
        for (i, v) in sample.value.iter().enumerate() {
            if let Some(t) = totals.get_mut(i) {
                t.1 += v;
            }
        }
    }
    Ok(totals)
}

/// Function names of a pprof profile.
pub fn pprof_function_names(data: &[u8]) -> Result<Vec<String>> {
    let raw = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out)?;
        out
    } else {
        data.to_vec()
    };
    let p = kiln_proto::google::v1::Profile::decode(raw.as_slice())?;
    Ok(p.function
        .iter()
        .map(|f| {
            p.string_table
                .get(f.name as usize)
                .cloned()
                .unwrap_or_default()
        })
        .collect())
}

/// Finds the profile type of a tenant with this sample type and unit.
pub fn find_type<'a>(
    types: &'a [t::ProfileType],
    sample_type: &str,
    unit: &str,
) -> Option<&'a t::ProfileType> {
    types
        .iter()
        .find(|t| t.sample_type == sample_type && t.sample_unit == unit)
}

/// Test prerequisites (Go, the Python venv, node_modules), installed by
/// `scripts/install-test-deps.sh`.
pub struct Tools {
    pub go: PathBuf,
    pub python: PathBuf,
    pub py_spy: PathBuf,
    pub node: PathBuf,
    pub node_dir: PathBuf,
}

impl Tools {
    /// Finds the tools, or says what is missing and how to install it.
    pub fn find() -> Result<Self> {
        let root = repo_root();
        let venv = std::env::var("KILN_TEST_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("target/test-venv"));
        let which = |name: &str| -> Option<PathBuf> {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join(name))
                    .find(|p| p.is_file())
            })
        };
        let tools = Self {
            go: which("go").ok_or_else(|| anyhow!("go not found"))?,
            python: venv.join("bin/python"),
            py_spy: venv.join("bin/py-spy"),
            node: which("node").ok_or_else(|| anyhow!("node not found"))?,
            node_dir: root.join("e2e/clients/node"),
        };
        for p in [&tools.python, &tools.py_spy] {
            if !p.exists() {
                bail!(
                    "{} is missing: run scripts/install-test-deps.sh",
                    p.display()
                );
            }
        }
        if !tools
            .node_dir
            .join("node_modules/@pyroscope/nodejs")
            .exists()
        {
            bail!("@pyroscope/nodejs is missing: run scripts/install-test-deps.sh");
        }
        Ok(tools)
    }
}
