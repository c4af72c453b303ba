//! A bounded, seeded mutation run through the real APIs of the real binary: every write format
//! over HTTP, Connect and gRPC, a few thousand mutated requests each (`KILN_FUZZ_REQUESTS`,
//! default 2,000 a format), then the fuzzer's saved crashers (`../shared/fuzz-findings`) in
//! sequence. Nothing may abort the process, answer 5xx (or a gRPC server error) or reset the
//! connection; a profile acknowledged before the run is still there after it, and only for its
//! tenant. A failure names the format and the mutation seed to replay it;
//! `KILN_FUZZ_FORMATS=pprof,otlp-grpc` runs only the formats named.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use bytes::{Buf, BufMut, Bytes};
use kiln_e2e::{Kiln, corpus_dir};
use kiln_otel::fuzz::seeds::seeds;
use kiln_otel::mutate::{Rng, mutate};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const TENANT: &str = "fuzz";

/// Seeds larger than this are left out: the run is about many mutations, not large inputs.
const MAX_SEED_BYTES: usize = 256 << 10;

fn requests_per_format() -> u64 {
    std::env::var("KILN_FUZZ_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// How a format's body reaches Kiln.
#[derive(Debug, Clone, Copy)]
enum Send {
    Http {
        path: &'static str,
        content_type: &'static str,
    },
    /// A Connect unary call of a `bytes` field 1 message holding the body (Parca WriteArrow).
    ConnectWrapped {
        path: &'static str,
    },
    Grpc {
        path: &'static str,
    },
}

/// (name, fuzz entry whose seeds it mutates, how it is sent)
const FORMATS: [(&str, &str, Send); 11] = [
    (
        "pprof",
        "pprof",
        Send::Http {
            path: "/ingest?name=fuzz.cpu&format=pprof",
            content_type: "application/octet-stream",
        },
    ),
    (
        "otlp-http-protobuf",
        "otlp_protobuf",
        Send::Http {
            path: "/v1development/profiles",
            content_type: "application/x-protobuf",
        },
    ),
    (
        "otlp-http-json",
        "otlp_json",
        Send::Http {
            path: "/v1development/profiles",
            content_type: "application/json",
        },
    ),
    (
        "otlp-grpc",
        "otlp_protobuf",
        Send::Grpc {
            path: "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        },
    ),
    (
        "push-connect",
        "push",
        Send::Http {
            path: "/push.v1.PusherService/Push",
            content_type: "application/proto",
        },
    ),
    (
        "push-grpc",
        "push",
        Send::Grpc {
            path: "/push.v1.PusherService/Push",
        },
    ),
    (
        "jfr",
        "jfr",
        Send::Http {
            path: "/ingest?name=fuzz&format=jfr",
            content_type: "application/octet-stream",
        },
    ),
    (
        "speedscope",
        "speedscope",
        Send::Http {
            path: "/ingest?name=fuzz.cpu&format=speedscope",
            content_type: "application/json",
        },
    ),
    (
        "folded",
        "folded",
        Send::Http {
            path: "/ingest?name=fuzz.cpu",
            content_type: "text/plain",
        },
    ),
    (
        "parca-arrow-connect",
        "parca_arrow",
        Send::ConnectWrapped {
            path: "/parca.profilestore.v1alpha1.ProfileStoreService/WriteArrow",
        },
    ),
    (
        "parca-raw-grpc",
        "parca_raw",
        Send::Grpc {
            path: "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
        },
    ),
];

/// Sends raw bytes as a gRPC message and reads the answer as raw bytes.
#[derive(Debug, Clone, Default)]
struct RawCodec;

#[derive(Debug, Clone, Default)]
struct RawCoder;

impl Encoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }
    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

/// What one request got: an HTTP status (or a gRPC code as its HTTP equivalent), or a failure
/// of the connection.
enum Outcome {
    Answered(u16, String),
    Broken(String),
}

struct Sender<'a> {
    kiln: &'a Kiln,
    rt: tokio::runtime::Runtime,
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl<'a> Sender<'a> {
    fn new(kiln: &'a Kiln) -> Result<Self> {
        let rt = tokio::runtime::Runtime::new()?;
        let channel =
            rt.block_on(tonic::transport::Channel::from_shared(kiln.url(""))?.connect())?;
        let grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
        Ok(Self { kiln, rt, grpc })
    }

    fn send(&mut self, how: Send, body: Vec<u8>) -> Outcome {
        match how {
            Send::Http { path, content_type } => self.http(path, content_type, body),
            Send::ConnectWrapped { path } => {
                let mut wrapped = Vec::new();
                prost::encoding::bytes::encode(1, &body, &mut wrapped);
                self.http(path, "application/proto", wrapped)
            }
            Send::Grpc { path } => {
                let mut grpc = self.grpc.clone();
                let path = http::uri::PathAndQuery::from_static(path);
                let result = self.rt.block_on(async move {
                    grpc.ready().await.map_err(|e| e.to_string())?;
                    let mut req = tonic::Request::new(Bytes::from(body));
                    req.metadata_mut()
                        .insert("x-scope-orgid", TENANT.parse().unwrap());
                    match grpc.unary(req, path, RawCodec).await {
                        Ok(_) => Ok(Ok(())),
                        Err(status) => Ok(Err(status)),
                    }
                });
                match result {
                    Err(e) => Outcome::Broken(e),
                    Ok(Ok(())) => Outcome::Answered(200, String::new()),
                    Ok(Err(status)) => {
                        use tonic::Code;
                        let http = match status.code() {
                            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                                400
                            }
                            Code::Unauthenticated => 401,
                            Code::PermissionDenied => 403,
                            Code::NotFound => 404,
                            Code::ResourceExhausted => 429,
                            Code::Unavailable
                                if status.message().contains("transport")
                                    || status.message().contains("connection") =>
                            {
                                return Outcome::Broken(status.to_string());
                            }
                            Code::Unavailable => 503,
                            _ => 500,
                        };
                        Outcome::Answered(http, status.message().to_owned())
                    }
                }
            }
        }
    }

    fn http(&self, path: &str, content_type: &str, body: Vec<u8>) -> Outcome {
        let result = self
            .kiln
            .http()
            .post(self.kiln.url(path))
            .header("X-Scope-OrgID", TENANT)
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .and_then(|r| {
                let status = r.status().as_u16();
                r.text().map(|t| (status, t))
            });
        match result {
            Ok((status, text)) => Outcome::Answered(status, text),
            Err(e) => Outcome::Broken(format!("{e:?}")),
        }
    }
}

#[test]
fn mutated_requests_never_abort_or_fail_the_server() -> Result<()> {
    // Rates and queues out of the way, so that mutations reach the decoders.
    let kiln = Kiln::start(&["--ingest-rate-bytes", "10737418240"])?;
    let (s, b) = kiln.ingest("fuzz-kept", "name=kept.cpu", b"main;work 7\n".to_vec(), &[])?;
    ensure!(s == 200, "{s} {b}");
    let corpus = corpus_dir();
    if corpus.is_none() {
        eprintln!("../shared/corpus is absent: built-in seeds only");
    }
    let n = requests_per_format();
    let mut sender = Sender::new(&kiln)?;
    let mut table = Vec::new();
    // `KILN_FUZZ_FORMATS=a,b` runs only those formats.
    let only = std::env::var("KILN_FUZZ_FORMATS").ok();
    for (name, entry, how) in FORMATS {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|f| f == name))
        {
            continue;
        }
        let seeds: Vec<Vec<u8>> = seeds(entry, corpus.as_deref())
            .into_iter()
            .filter(|s| s.len() <= MAX_SEED_BYTES)
            .collect();
        if seeds.is_empty() {
            eprintln!("{name} has no seed without the corpus (../shared): not sent");
            continue;
        }
        let started = Instant::now();
        let (mut ok, mut refused) = (0u64, 0u64);
        // The seeds themselves (some real profiles are refused on purpose: invalid UTF-8).
        for s in &seeds {
            match sender.send(how, s.clone()) {
                Outcome::Answered(200..=299, _) => ok += 1,
                Outcome::Answered(400..=499, _) => refused += 1,
                Outcome::Answered(status, text) => {
                    bail!("{name}: a seed was answered {status}: {text}")
                }
                Outcome::Broken(e) => bail!("{name}: a seed broke the connection: {e}"),
            }
        }
        for i in 0..n {
            let mut rng = Rng::new(i ^ fxhash(name));
            let seed = &seeds[rng.below(seeds.len())];
            let other = &seeds[rng.below(seeds.len())];
            let (body, what) = mutate(&mut rng, seed, other);
            match sender.send(how, body) {
                Outcome::Answered(200..=299, _) => ok += 1,
                Outcome::Answered(400..=499, _) => refused += 1,
                Outcome::Answered(status, text) => bail!(
                    "{name}: mutation {i} ({what}) was answered {status}: {text}\n{}",
                    tail(&kiln.log_text())
                ),
                Outcome::Broken(e) => bail!(
                    "{name}: mutation {i} ({what}) broke the connection: {e}; server ready: {}\n{}",
                    kiln.is_ready(),
                    tail(&kiln.log_text())
                ),
            }
        }
        table.push(format!(
            "{name:<22} {:>6} requests  {ok:>6} stored  {refused:>6} refused  {:>6.1} s",
            n + seeds.len() as u64,
            started.elapsed().as_secs_f64()
        ));
    }
    replay_saved_crashers(&kiln)?;
    eprintln!("{}", table.join("\n"));
    ensure!(
        kiln.is_ready(),
        "the server is gone\n{}",
        tail(&kiln.log_text())
    );
    // What was acknowledged before the run is there, for its tenant alone.
    let fg = kiln.flamegraph("fuzz-kept", CPU, r#"{service_name="kept"}"#)?;
    ensure!(fg.total == 70_000_000, "total {}", fg.total);
    kiln.assert_tenant_empty("fuzz-stranger")?;
    Ok(())
}

/// `../shared/fuzz-findings`: each `.bin` body with its `.json` note (path, headers), in name
/// order, through one server; each answered with a 2xx or 4xx.
fn replay_saved_crashers(kiln: &Kiln) -> Result<()> {
    let dir = kiln_e2e::repo_root().join("../shared/fuzz-findings");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        // A part of the test, not all of it: said, not counted as a skipped test.
        eprintln!(
            "{} is absent (../shared): no saved crasher replayed",
            dir.display()
        );
        return Ok(());
    };
    let mut notes: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    notes.sort();
    for note in &notes {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(note)?)?;
        let body = std::fs::read(note.with_extension("bin"))?;
        let path = v["path"].as_str().context("path")?;
        let mut req = kiln
            .http()
            .post(kiln.url(path))
            .header("X-Scope-OrgID", TENANT)
            .body(body);
        for (k, value) in v["headers"].as_object().context("headers")? {
            req = req.header(k.as_str(), value.as_str().unwrap_or_default());
        }
        let resp = req
            .send()
            .with_context(|| format!("{}: {}", note.display(), tail(&kiln.log_text())))?;
        let status = resp.status();
        ensure!(
            status.is_success() || status.is_client_error(),
            "{}: {status} {}",
            note.display(),
            resp.text().unwrap_or_default()
        );
    }
    eprintln!("replayed {} saved crashers", notes.len());
    Ok(())
}

/// A stable hash of a format's name, so each format gets its own mutation seeds.
fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
