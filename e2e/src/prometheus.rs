//! A real Prometheus server (Debian's `prometheus`, installed by
//! `scripts/install-test-deps.sh`) on a free loopback port, its remote-write receiver on, for
//! the recording rules' tests: started, stopped and started again on the same port and data,
//! and asked PromQL over its HTTP API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::free_port;

/// A running Prometheus.
pub struct Prometheus {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    http: reqwest::blocking::Client,
}

/// The `prometheus` binary: `KILN_TEST_PROMETHEUS`, else the one on the `PATH`.
pub fn prometheus_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_TEST_PROMETHEUS") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("prometheus"))
                .find(|p| p.is_file())
        })
        .context("prometheus is not installed: run scripts/install-test-deps.sh")
}

impl Prometheus {
    /// Starts a Prometheus that scrapes nothing and takes remote writes, accepting samples up
    /// to two hours older than its newest (a new rule's backfill).
    pub fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("prometheus.yml"),
            "global:\n  scrape_interval: 1h\nstorage:\n  tsdb:\n    out_of_order_time_window: 2h\n",
        )?;
        let mut p = Self {
            child: None,
            port: free_port(),
            dir,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .no_proxy()
                .build()?,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("prometheus.log"))?;
        let child = Command::new(prometheus_bin()?)
            .arg(format!(
                "--config.file={}",
                self.dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--web.enable-remote-write-receiver")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning prometheus")?;
        self.child = Some(child);
        let url = self.url("/-/ready");
        crate::wait_ready(
            &self.http,
            &url,
            self.child.as_mut(),
            Duration::from_secs(60),
            "prometheus",
        )
        .map_err(|e| anyhow::anyhow!("{e}: {}", self.log_text()))
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The remote-write receiver's URL.
    pub fn write_url(&self) -> String {
        self.url("/api/v1/write")
    }

    /// Stops it with SIGTERM (its data stays) and waits for the exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    child.kill()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            child.wait()?;
        }
        Ok(())
    }

    /// Starts it again on the same port and data.
    pub fn start_again(&mut self) -> Result<()> {
        self.spawn()
    }

    /// An instant query's result vector at `time` (Unix seconds).
    pub fn query(&self, promql: &str, time: f64) -> Result<Vec<Value>> {
        let resp: Value = self
            .http
            .get(self.url("/api/v1/query"))
            .query(&[("query", promql), ("time", &format!("{time:.3}"))])
            .send()?
            .json()?;
        if resp["status"] != "success" {
            bail!("{promql}: {resp}");
        }
        Ok(resp["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
