//! `kiln debuginfo upload FILE...`: debug files from a build pipeline to Kiln's
//! `POST /api/v1/debuginfo`, gzip-compressed on the way (a part at a time: a file is never read
//! whole into memory). Kiln reads each file's ids itself and answers with them; they are printed
//! one file a line.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// `kiln debuginfo` commands.
#[derive(Debug, clap::Subcommand)]
pub enum DebuginfoCommand {
    /// Upload ELF debug files (or programs with symbols) for a tenant's native frames.
    Upload(UploadArgs),
}

/// `kiln debuginfo upload` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct UploadArgs {
    /// The files (debug files from `objcopy --only-keep-debug`, `-dbgsym` files, programs).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Kiln's address, e.g. `http://127.0.0.1:4040`.
    #[arg(long, env = "KILN_URL")]
    pub url: String,
    /// A bearer token with the write scope (`--auth jwt`).
    #[arg(long, env = "KILN_TOKEN")]
    pub token: Option<String>,
    /// The tenant, sent as `X-Scope-OrgID` (for `--auth trusted-header`).
    #[arg(long, env = "KILN_TENANT")]
    pub tenant: Option<String>,
}

/// Uploads every file; fails at the first refusal, naming the file and Kiln's reason.
pub async fn run(cmd: DebuginfoCommand) -> anyhow::Result<()> {
    let DebuginfoCommand::Upload(args) = cmd;
    let http = reqwest::Client::new();
    for file in &args.files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = gzip_stream(file.clone())?;
        let mut req = http
            .post(format!(
                "{}/api/v1/debuginfo?name={}",
                args.url.trim_end_matches('/'),
                percent_encoding::utf8_percent_encode(&name, percent_encoding::NON_ALPHANUMERIC)
            ))
            .header("Content-Encoding", "gzip")
            .header("Content-Type", "application/octet-stream")
            .body(body);
        if let Some(t) = &args.token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = &args.tenant {
            req = req.header("X-Scope-OrgID", t);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{}: cannot reach {}", file.display(), args.url))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{}: {status}: {text}", file.display());
        }
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let ids: Vec<&str> = v["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i.as_str()).collect())
            .unwrap_or_default();
        println!(
            "{}\t{}\t{}",
            file.display(),
            v["kind"].as_str().unwrap_or("?"),
            ids.join(" ")
        );
    }
    Ok(())
}

/// The file's bytes gzip-compressed, produced on a thread as the request sends them.
fn gzip_stream(path: PathBuf) -> anyhow::Result<reqwest::Body> {
    use std::io::{Read, Write};
    let mut file = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    std::thread::spawn(move || {
        /// Sends what the encoder writes.
        struct Sink(tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .blocking_send(Ok(buf.to_vec()))
                    .map_err(|_| std::io::Error::other("the upload stopped"))?;
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = std::io::BufWriter::with_capacity(256 << 10, Sink(tx.clone()));
        let mut enc = flate2::write::GzEncoder::new(sink, flate2::Compression::fast());
        let mut buf = vec![0u8; 1 << 20];
        let result = (|| -> std::io::Result<()> {
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                enc.write_all(&buf[..n])?;
            }
            enc.finish()?.flush()?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = tx.blocking_send(Err(e));
        }
    });
    Ok(reqwest::Body::wrap_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ))
}
