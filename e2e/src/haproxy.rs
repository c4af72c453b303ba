//! Debian's `haproxy` (installed by `scripts/install-test-deps.sh`) in front of a Kiln cluster,
//! with the configuration operators are given (`deploy/haproxy/kiln.cfg`): ingest paths to the
//! ingest processes, the rest to the query processes, round-robin per request.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{free_port, repo_root};

/// A running haproxy.
pub struct Haproxy {
    child: Child,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `haproxy` binary on the `PATH`, if there is one.
pub fn haproxy_bin() -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|p| p.join("haproxy"))
        .find(|p| p.is_file())
}

impl Haproxy {
    /// Starts haproxy on a free port before three ingest and two query processes (their
    /// ports), and waits until it sees every process up.
    pub fn start(ingest: [u16; 3], query: [u16; 2]) -> Result<Self> {
        let bin = haproxy_bin().context("haproxy is not installed")?;
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("haproxy.log");
        let port = free_port();
        let addr = |p: u16| format!("127.0.0.1:{p}");
        let mut cmd = Command::new(bin);
        cmd.arg("-db")
            .arg("-f")
            .arg(repo_root().join("deploy/haproxy/kiln.cfg"))
            .env("KILN_LISTEN", addr(port));
        for (i, p) in ingest.iter().enumerate() {
            cmd.env(format!("KILN_INGEST_{}", i + 1), addr(*p));
        }
        for (i, p) in query.iter().enumerate() {
            cmd.env(format!("KILN_QUERY_{}", i + 1), addr(*p));
        }
        let out = std::fs::File::create(&log)?;
        let child = cmd
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context("spawning haproxy")?;
        let mut h = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        h.wait_up()?;
        Ok(h)
    }

    /// Waits until a request through it reaches a process (its health checks found them up).
    fn wait_up(&mut self) -> Result<()> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(5))
            .no_proxy()
            .build()?;
        crate::wait_ready(
            &http,
            &format!("http://127.0.0.1:{}/ready", self.port),
            Some(&mut self.child),
            Duration::from_secs(30),
            "haproxy",
        )
        .map_err(|e| anyhow::anyhow!("{e}: {}", self.log_text()))?;
        // Health checks every 500 ms: two rounds, so every server has been seen.
        std::thread::sleep(Duration::from_millis(1200));
        if let Some(status) = self.child.try_wait()? {
            bail!("haproxy exited with {status}: {}", self.log_text());
        }
        Ok(())
    }

    /// Its log so far (one line per request).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
