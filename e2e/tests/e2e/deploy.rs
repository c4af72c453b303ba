//! What users deploy with (`deploy/`): the Kubernetes manifests pass Kubernetes' own schemas
//! (`kubernetes-validate --strict`, offline), every `KILN_*` variable and `kiln serve` flag they
//! and the image set exists, and the image's layout script lays out a root where the binary
//! runs. The image itself cannot be built here (no container daemon, no registry).

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{kiln_bin, repo_root};

const FILES: [&str; 4] = [
    "deploy/kubernetes/single/kiln.yaml",
    "deploy/kubernetes/cluster/kiln.yaml",
    "deploy/image/Dockerfile",
    "deploy/haproxy/kiln.cfg",
];

/// `kubernetes-validate` of the test venv, if installed.
fn validator() -> Option<PathBuf> {
    let venv = std::env::var_os("KILN_TEST_VENV")?;
    Some(PathBuf::from(venv).join("bin/kubernetes-validate")).filter(|p| p.is_file())
}

#[test]
fn manifests_pass_kubernetes_schemas() -> Result<()> {
    let Some(validate) = validator() else {
        kiln_otel::skip::missing("kubernetes-validate");
        return Ok(());
    };
    let out = std::process::Command::new(validate)
        .arg("--strict")
        .args(&FILES[..2])
        .current_dir(repo_root())
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "kubernetes-validate: {text}");
    for kind in [
        "statefulset/kiln",
        "deployment/kiln-ingest",
        "poddisruptionbudget/kiln-query",
    ] {
        ensure!(
            text.contains(&format!("{kind} against")),
            "{kind} not checked: {text}"
        );
    }
    Ok(())
}

/// Words of `text` that start with `prefix` and go on in `[A-Z0-9_]` (or `[a-z0-9-]` for
/// flags).
fn names(text: &str, prefix: &str, flag: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at + prefix.len()..];
        let len = tail
            .find(|c: char| {
                if flag {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                } else {
                    !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                }
            })
            .unwrap_or(tail.len());
        if len > 0 {
            out.insert(format!("{prefix}{}", &tail[..len]));
        }
        rest = &tail[len..];
    }
    out
}

#[test]
fn deployments_set_only_settings_kiln_has() -> Result<()> {
    let root = repo_root();
    let configuration = std::fs::read_to_string(root.join("docs/configuration.md"))?;
    let help = std::process::Command::new(kiln_bin())
        .args(["serve", "--help"])
        .output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    for file in FILES {
        let text = std::fs::read_to_string(root.join(file)).with_context(|| file.to_owned())?;
        for var in names(&text, "KILN_", false) {
            // The proxy's own variables name addresses for it, not Kiln's settings.
            if file.ends_with("kiln.cfg") {
                continue;
            }
            ensure!(
                configuration.contains(&format!("`{var}`")),
                "{file} sets {var}, which docs/configuration.md does not list"
            );
        }
        // The flags the manifests pass to `kiln serve` (their `args:` lines).
        let args = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("args:"))
            .collect::<Vec<_>>()
            .join("\n");
        for flag in names(&args, "--", true) {
            ensure!(
                help.contains(&format!("{flag} ")),
                "{file} passes {flag}, which kiln serve has not"
            );
        }
    }
    Ok(())
}

#[test]
fn the_image_layout_runs_the_binary_as_an_unprivileged_user() -> Result<()> {
    let root = tempfile::tempdir()?;
    let out = std::process::Command::new("sh")
        .arg(repo_root().join("deploy/image/layout.sh"))
        .arg(kiln_bin())
        .arg(root.path())
        .output()?;
    ensure!(
        out.status.success(),
        "layout.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = root.path().join("usr/local/bin/kiln");
    let version = std::process::Command::new(&bin).arg("--version").output()?;
    ensure!(
        version.status.success(),
        "{} --version failed",
        bin.display()
    );
    ensure!(String::from_utf8_lossy(&version.stdout).contains("kiln"));
    ensure!(root.path().join("data").is_dir());
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd"))?;
    ensure!(passwd.contains("kiln:x:10001:10001:"), "{passwd}");
    // The Dockerfile runs as that user and sets no other.
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/image/Dockerfile"))?;
    ensure!(dockerfile.contains("USER 10001:10001"));
    Ok(())
}
