//! Native symbolization end to end, against independent oracles: programs built here with gcc,
//! g++, rustc and go, split with `objcopy --only-keep-debug` and `strip`; profiles that name
//! them only by build id and address, sent as the OpenTelemetry eBPF profiler sends them (OTLP:
//! addresses in the file's own space, ids as mapping attributes) and as pprof (process
//! addresses, `/proc/<pid>/maps` mappings); debug files uploaded over all three APIs (Kiln's
//! HTTP API, Parca's `DebuginfoService`, Pyroscope's `debuginfo.v1alpha1`) or served by a real
//! debuginfod. Every name, file and line of the flame graphs and pprof downloads equals what
//! binutils' `addr2line -f -i -C` (or `go tool addr2line`) prints; other tenants never see
//! another's files.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::with_tenant;
use kiln_e2e::{ALL_TIME, Kiln};
use kiln_proto::google::v1 as pb;
use kiln_proto::querier::v1 as q;
use kiln_storage::query::tree::flamegraph_stacks;
use kiln_symbolize::testing::{self, Built, Program};
use kiln_symbolize::{Frame, identify_file};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    KeyValueAndUnit, Location, Mapping, Profile, ProfilesDictionary, ResourceProfiles, Sample,
    ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

const NOW: u64 = 1_700_000_000_000_000_000;
/// The CPU period of the OTLP profiles: 50 ms a sample.
const OTLP_PERIOD: i64 = 50_000_000;

/// A program, its ids and the addresses the profiles sample, with the oracle's frames for each.
struct Subject {
    built: Built,
    gnu: Option<String>,
    /// The file id of the program as it runs (the stripped one), as the eBPF profiler computes it.
    file_id: String,
    go: Option<String>,
    addrs: Vec<u64>,
    oracle: Vec<Vec<Frame>>,
    /// The executable segment: file offset, address, size.
    segment: (u64, u64, u64),
    service: String,
}

fn subject(program: Program, dir: &Path, service: &str) -> Result<Subject> {
    let built = testing::build(program, dir).map_err(anyhow::Error::msg)?;
    let addrs = testing::addresses_in(&built.full, &built.functions, 6);
    ensure!(addrs.len() >= 6, "{program:?}: {addrs:?}");
    let oracle = match program {
        Program::GoNoDwarf => testing::go_addr2line(&built.full, &addrs),
        _ => testing::addr2line(&built.debug, &addrs),
    }
    .map_err(anyhow::Error::msg)?;
    let running = identify_file(&built.stripped)?;
    Ok(Subject {
        gnu: running.gnu_build_id.clone(),
        file_id: running.file_id.clone(),
        go: running.go_build_id.clone(),
        segment: testing::executable_segment(&built.full).map_err(anyhow::Error::msg)?,
        built,
        addrs,
        oracle,
        service: service.to_owned(),
    })
}

impl Subject {
    /// The id a profile of this program names it by (what each agent would put first).
    fn build_id(&self) -> String {
        self.gnu
            .clone()
            .or_else(|| self.go.clone())
            .unwrap_or_else(|| self.file_id.clone())
    }

    fn file_name(&self) -> String {
        self.built
            .stripped
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// The flame graph this program's OTLP profile should have once named: each address's
    /// frames, outermost first, valued by its sample's count times the period.
    fn named_stacks(&self) -> BTreeMap<Vec<String>, i64> {
        self.named_stacks_of(OTLP_PERIOD)
    }

    /// [`Self::named_stacks`] with each count times `scale`.
    fn named_stacks_of(&self, scale: i64) -> BTreeMap<Vec<String>, i64> {
        let mut out = BTreeMap::new();
        for (i, frames) in self.oracle.iter().enumerate() {
            let stack: Vec<String> = frames.iter().rev().map(|f| f.function.clone()).collect();
            *out.entry(stack).or_insert(0) += (i as i64 + 1) * scale;
        }
        out
    }

    /// The same flame graph before naming: ingest's names (`file 0xaddr`).
    fn unnamed_stacks(&self, addresses: &[u64]) -> BTreeMap<Vec<String>, i64> {
        let mut out = BTreeMap::new();
        for (i, a) in addresses.iter().enumerate() {
            let name = format!("{} 0x{a:x}", self.file_name());
            *out.entry(vec![name]).or_insert(0) += (i as i64 + 1) * OTLP_PERIOD;
        }
        out
    }

    /// An OTLP request as the eBPF profiler sends it: one sample per address, the mapping in
    /// the file's own address space, its ids as attributes, addresses as the file's.
    fn otlp(&self) -> Vec<u8> {
        self.otlp_at(NOW)
    }

    /// [`Self::otlp`] of a profile taken at `time_unix_nano`.
    fn otlp_at(&self, time_unix_nano: u64) -> Vec<u8> {
        let (offset, vaddr, memsz) = self.segment;
        let mut strings: Vec<String> = [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "process.executable.build_id.gnu",
            "process.executable.build_id.htlhash",
            "process.executable.build_id.go",
        ]
        .map(String::from)
        .to_vec();
        strings.push(self.file_name());
        let file = strings.len() as i32 - 1;
        let attr = |key: i32, value: &str| KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            unit_strindex: 0,
        };
        let mut attributes = vec![KeyValueAndUnit::default(), attr(6, &self.file_id)];
        if let Some(g) = &self.gnu {
            attributes.push(attr(5, g));
        }
        if let Some(g) = &self.go {
            attributes.push(attr(7, g));
        }
        let attribute_indices = (1..attributes.len() as i32).collect();
        let mut locations = vec![Location::default()];
        let mut stacks = vec![Stack::default()];
        let mut samples = Vec::new();
        for (i, &a) in self.addrs.iter().enumerate() {
            locations.push(Location {
                mapping_index: 1,
                address: a,
                ..Default::default()
            });
            stacks.push(Stack {
                location_indices: vec![locations.len() as i32 - 1],
            });
            samples.push(Sample {
                stack_index: stacks.len() as i32 - 1,
                values: vec![i as i64 + 1],
                ..Default::default()
            });
        }
        let page = |v: u64| v & !0xfff;
        let dictionary = ProfilesDictionary {
            string_table: strings,
            mapping_table: vec![
                Mapping::default(),
                Mapping {
                    memory_start: page(vaddr),
                    memory_limit: vaddr + memsz,
                    file_offset: page(offset),
                    filename_strindex: file,
                    attribute_indices,
                },
            ],
            location_table: locations,
            stack_table: stacks,
            attribute_table: attributes,
            ..Default::default()
        };
        ExportProfilesServiceRequest {
            resource_profiles: vec![ResourceProfiles {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(self.service.clone())),
                        }),
                        key_strindex: 0,
                    }],
                    ..Default::default()
                }),
                scope_profiles: vec![ScopeProfiles {
                    profiles: vec![Profile {
                        sample_type: Some(ValueType {
                            type_strindex: 1,
                            unit_strindex: 2,
                        }),
                        period_type: Some(ValueType {
                            type_strindex: 3,
                            unit_strindex: 4,
                        }),
                        period: OTLP_PERIOD,
                        time_unix_nano,
                        duration_nano: 10_000_000_000,
                        samples,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            dictionary: Some(dictionary),
        }
        .encode_to_vec()
    }

    /// A pprof as Go's runtime/pprof writes one for a process: the program loaded at `bias`,
    /// the mapping as `/proc/<pid>/maps` shows it, process addresses.
    fn pprof(&self, bias: u64) -> Vec<u8> {
        let (offset, vaddr, memsz) = self.segment;
        let page = |v: u64| v & !0xfff;
        self.pprof_mapped(bias, page(vaddr) + bias, vaddr + memsz + bias, page(offset))
    }

    /// [`Self::pprof`] with one mapping for the whole file from offset 0, as several pprof
    /// converters write it (and non-PIE layouts map it): from the first loadable segment's page
    /// to the code's end.
    fn pprof_whole_file(&self, bias: u64) -> Result<Vec<u8>> {
        let (_, vaddr, memsz) = self.segment;
        let first = testing::first_load_vaddr(&self.built.stripped).map_err(anyhow::Error::msg)?;
        Ok(self.pprof_mapped(bias, (first & !0xfff) + bias, vaddr + memsz + bias, 0))
    }

    /// A pprof of the program's addresses loaded at `bias` in one mapping.
    fn pprof_mapped(&self, bias: u64, start: u64, limit: u64, offset: u64) -> Vec<u8> {
        let strings = vec![
            String::new(),
            "cpu".into(),
            "nanoseconds".into(),
            format!("/usr/bin/{}", self.file_name()),
            self.build_id(),
        ];
        let mut p = pb::Profile {
            string_table: strings,
            sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
            period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
            period: 1,
            mapping: vec![pb::Mapping {
                id: 1,
                memory_start: start,
                memory_limit: limit,
                file_offset: offset,
                filename: 3,
                build_id: 4,
                ..Default::default()
            }],
            time_nanos: NOW as i64,
            ..Default::default()
        };
        for (i, &a) in self.addrs.iter().enumerate() {
            p.location.push(pb::Location {
                id: i as u64 + 1,
                mapping_id: 1,
                address: a + bias,
                ..Default::default()
            });
            p.sample.push(pb::Sample {
                location_id: vec![i as u64 + 1],
                value: vec![i as i64 + 1],
                label: vec![],
            });
        }
        p.encode_to_vec()
    }
}

fn send_otlp(kiln: &Kiln, tenant: &str, body: Vec<u8>) -> Result<()> {
    let resp = kiln
        .http()
        .post(kiln.url("/v1development/profiles"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/x-protobuf")
        .body(body)
        .send()?;
    ensure!(
        resp.status() == 200,
        "OTLP: {} {}",
        resp.status(),
        resp.text()?
    );
    Ok(())
}

/// The profile type OTLP's CPU profiles get (their counts times the period, in nanoseconds, as
/// Pyroscope stores the eBPF profiler's).
fn profile_type(kiln: &Kiln, tenant: &str) -> Result<String> {
    let types: Vec<String> = kiln
        .profile_types(tenant)?
        .into_iter()
        .map(|t| t.id)
        .collect();
    types
        .iter()
        .find(|id| id.contains(":cpu:nanoseconds:"))
        .cloned()
        .with_context(|| format!("no CPU profile type for {tenant}: {types:?}"))
}

/// The stacks of a service's flame graph, with the query's `kiln-warning` header.
fn stacks(
    kiln: &Kiln,
    tenant: &str,
    ty: &str,
    service: &str,
) -> Result<(BTreeMap<Vec<String>, i64>, Option<String>)> {
    let req = q::SelectMergeStacktracesRequest {
        profile_type_id: ty.into(),
        label_selector: format!(r#"{{service_name="{service}"}}"#),
        start: ALL_TIME.0,
        end: ALL_TIME.1,
        max_nodes: Some(1 << 20),
        ..Default::default()
    };
    let resp = kiln
        .http()
        .post(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/proto")
        .body(req.encode_to_vec())
        .send()?;
    ensure!(resp.status() == 200, "flame graph: {}", resp.status());
    let warning = resp
        .headers()
        .get("kiln-warning")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = resp.bytes()?;
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_ref())?
        .flamegraph
        .context("no flame graph")?;
    Ok((flamegraph_stacks(&fg)?, warning))
}

/// The pprof download of a service: each location's lines as (function, file, line).
fn pprof_lines(
    kiln: &Kiln,
    tenant: &str,
    ty: &str,
    service: &str,
) -> Result<BTreeMap<u64, Vec<Frame>>> {
    let p: pb::Profile = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectMergeProfile",
        &q::SelectMergeProfileRequest {
            profile_type_id: ty.into(),
            label_selector: format!(r#"{{service_name="{service}"}}"#),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            ..Default::default()
        },
    )?;
    let s = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    for loc in &p.location {
        let frames = loc
            .line
            .iter()
            .map(|l| {
                let f = p.function.iter().find(|f| f.id == l.function_id).unwrap();
                let file = s(f.filename);
                Frame {
                    function: s(f.name),
                    file: (!file.is_empty()).then_some(file),
                    line: l.line as u32,
                }
            })
            .collect();
        out.insert(loc.address, frames);
    }
    Ok(out)
}

fn upload_http(
    kiln: &Kiln,
    tenant: &str,
    file: &Path,
    gzip: bool,
) -> Result<(u16, serde_json::Value)> {
    let mut body = std::fs::read(file)?;
    let mut req = kiln
        .http()
        .post(kiln.url(&format!(
            "/api/v1/debuginfo?name={}",
            file.file_name().unwrap().to_string_lossy()
        )))
        .header("X-Scope-OrgID", tenant);
    if gzip {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&body)?;
        body = enc.finish()?;
        req = req.header("Content-Encoding", "gzip");
    }
    let resp = req.body(body).send()?;
    let status = resp.status().as_u16();
    let text = resp.text()?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    ))
}

fn list(kiln: &Kiln, tenant: &str) -> Result<Vec<serde_json::Value>> {
    let resp = kiln
        .http()
        .get(kiln.url("/api/v1/debuginfo"))
        .header("X-Scope-OrgID", tenant)
        .send()?;
    ensure!(resp.status() == 200, "list: {}", resp.status());
    let v: serde_json::Value = resp.json()?;
    Ok(v["files"].as_array().cloned().unwrap_or_default())
}

fn log_tail(kiln: &Kiln) -> String {
    let log = kiln.log_text();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Polls `check` (the gateway names frames of a new file at its next query; a block may still be
/// flushing) for up to 20 s.
fn eventually(mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    for _ in 0..100 {
        if check()? {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    bail!("the condition never held")
}

/// Kiln's HTTP upload API: a tenant's flame graphs and pprof downloads are named after its
/// upload (for OTLP and pprof, PIE and non-PIE), another tenant's never are, a delete takes the
/// names away, and bad uploads are refused and stored nowhere.
#[test]
fn uploads_name_otlp_and_pprof_frames_for_their_tenant_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kiln = Kiln::start(&["--max-debuginfo-file-bytes", "33554432"])?;
    let c = subject(Program::CPie, dir.path(), "c-pie")?;
    let cpp = subject(Program::Cpp, dir.path(), "cpp")?;
    // Profiles first, files after: names apply to what is already stored.
    send_otlp(&kiln, "team-a", c.otlp())?;
    send_otlp(&kiln, "team-b", c.otlp())?;
    let (s, b) = kiln.ingest(
        "team-a",
        &format!("name={}&format=pprof", cpp.service),
        cpp.pprof(0x5555_0000_0000),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    let ty = profile_type(&kiln, "team-a")?;
    let (before, _) = stacks(&kiln, "team-a", &ty, "c-pie")?;
    ensure!(before == c.unnamed_stacks(&c.addrs), "{before:?}");

    let (s, v) = upload_http(&kiln, "team-a", &c.built.debug, false)?;
    ensure!(s == 200, "{s} {v}");
    ensure!(v["kind"] == "debug-only", "{v}");
    ensure!(
        v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| Some(i.as_str().unwrap()) == c.gnu.as_deref())
    );
    // `kiln debuginfo upload` (gzip on the way) for the second.
    let out = std::process::Command::new(kiln_e2e::kiln_bin())
        .args(["debuginfo", "upload"])
        .arg(&cpp.built.debug)
        .args(["--url", &kiln.url(""), "--tenant", "team-a"])
        .env_remove("DEBUGINFOD_URLS")
        .output()?;
    let printed = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "kiln debuginfo upload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        printed.contains("debug-only") && printed.contains(cpp.gnu.as_deref().unwrap()),
        "{printed}"
    );

    let want = c.named_stacks();
    eventually(|| Ok(stacks(&kiln, "team-a", &ty, "c-pie")?.0 == want))?;
    // The pprof of process addresses (the program loaded at a bias) is named as well.
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let cpp_want = cpp.named_stacks_of(1);
    eventually(|| Ok(stacks(&kiln, "team-a", cpu, &cpp.service)?.0 == cpp_want))?;
    // pprof downloads carry every line: function, file, line, inlined frames innermost first.
    let lines = pprof_lines(&kiln, "team-a", &ty, "c-pie")?;
    for (a, want) in c.addrs.iter().zip(&c.oracle) {
        ensure!(
            lines.get(a) == Some(want),
            "{a:#x}: {:?} != {want:?}",
            lines.get(a)
        );
    }
    // Another tenant with the same profile sees its frames unnamed, and no files.
    let (other, _) = stacks(&kiln, "team-b", &ty, "c-pie")?;
    ensure!(other == c.unnamed_stacks(&c.addrs), "team-b: {other:?}");
    ensure!(list(&kiln, "team-b")?.is_empty());
    ensure!(list(&kiln, "team-a")?.len() == 2);

    // Bad uploads: 400, 413, 422, and nothing stored.
    let write = |name: &str, data: &[u8]| -> Result<std::path::PathBuf> {
        let p = dir.path().join(name);
        std::fs::write(&p, data)?;
        Ok(p)
    };
    let debug = std::fs::read(&c.built.debug)?;
    for (path, gzip, want) in [
        (write("notes.txt", b"not an ELF file at all")?, false, 400),
        (write("cut.debug", &debug[..debug.len() / 3])?, false, 400),
        (c.built.stripped.clone(), false, 422),
        (write("huge.debug", &vec![0x7f; 40 << 20])?, false, 413),
        // Small on the wire, past the limit once inflated.
        (write("bomb.debug", &vec![0; 40 << 20])?, true, 413),
    ] {
        let (s, v) = upload_http(&kiln, "team-c", &path, gzip)?;
        ensure!(s == want, "{}: {s} {v}", path.display());
    }
    ensure!(list(&kiln, "team-c")?.is_empty());

    // Deleted: the names go.
    let resp = kiln
        .http()
        .delete(kiln.url(&format!("/api/v1/debuginfo/{}", c.gnu.clone().unwrap())))
        .header("X-Scope-OrgID", "team-a")
        .send()?;
    ensure!(resp.status() == 200, "delete: {}", resp.status());
    eventually(|| Ok(stacks(&kiln, "team-a", &ty, "c-pie")?.0 == c.unnamed_stacks(&c.addrs)))?;
    let resp = kiln
        .http()
        .delete(kiln.url("/api/v1/debuginfo/0123456789abcdef"))
        .header("X-Scope-OrgID", "team-a")
        .send()?;
    ensure!(resp.status() == 404, "delete of nothing: {}", resp.status());
    Ok(())
}

fn grpc_channel(kiln: &Kiln, rt: &tokio::runtime::Runtime) -> Result<tonic::transport::Channel> {
    Ok(rt.block_on(tonic::transport::Channel::from_shared(kiln.url(""))?.connect())?)
}

/// The Parca agent's upload (ShouldInitiateUpload, InitiateUpload, the streamed Upload,
/// MarkUploadFinished over gRPC) of a Go program built without DWARF, named by the file id as
/// the agent names a binary without a GNU build id: its frames are named through `.gopclntab`
/// exactly as `go tool addr2line` names them.
#[test]
fn parca_agent_uploads_name_go_frames_through_the_line_table() -> Result<()> {
    use d::debuginfo_service_client::DebuginfoServiceClient;
    use kiln_proto::parca::debuginfo::v1alpha1 as d;
    if !testing::have("go") {
        kiln_otel::skip::missing("go");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let kiln = Kiln::start(&[])?;
    let go = subject(Program::GoNoDwarf, dir.path(), "go-nodwarf")?;
    ensure!(go.gnu.is_none() && go.go.is_some());
    send_otlp(&kiln, "team-a", go.otlp())?;
    // The agent uploads the program as it runs (`--debuginfo-strip=false`: a Go program without
    // DWARF has nothing else), named by its file id.
    let data = std::fs::read(&go.built.stripped)?;
    let rt = tokio::runtime::Runtime::new()?;
    let channel = grpc_channel(&kiln, &rt)?;
    let mut client = DebuginfoServiceClient::new(channel).max_encoding_message_size(64 << 20);
    let id = go.file_id.clone();
    rt.block_on(async {
        parca_upload(&mut client, "team-a", &id, d::BuildIdType::Hash, &data).await?;
        // Known now for this tenant; not for another.
        let again = client
            .should_initiate_upload(with_tenant(
                d::ShouldInitiateUploadRequest {
                    build_id: id.clone(),
                    build_id_type: d::BuildIdType::Hash as i32,
                    ..Default::default()
                },
                "team-a",
            ))
            .await?
            .into_inner();
        ensure!(!again.should_initiate_upload, "{again:?}");
        let other = client
            .should_initiate_upload(with_tenant(
                d::ShouldInitiateUploadRequest {
                    build_id: id.clone(),
                    build_id_type: d::BuildIdType::Hash as i32,
                    ..Default::default()
                },
                "team-b",
            ))
            .await?
            .into_inner();
        ensure!(other.should_initiate_upload, "{other:?}");
        // An upload nobody initiated is refused.
        let stray = client
            .upload(with_tenant(
                futures::stream::iter(vec![d::UploadRequest {
                    data: Some(d::upload_request::Data::Info(d::UploadInfo {
                        build_id: id.clone(),
                        upload_id: "no-such-upload".into(),
                        r#type: 0,
                    })),
                }]),
                "team-a",
            ))
            .await;
        ensure!(stray.is_err(), "{stray:?}");
        Ok(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\n{}", log_tail(&kiln)))?;
    let ty = profile_type(&kiln, "team-a")?;
    let want = go.named_stacks();
    eventually(|| Ok(stacks(&kiln, "team-a", &ty, &go.service)?.0 == want))?;
    let lines = pprof_lines(&kiln, "team-a", &ty, &go.service)?;
    for (a, want) in go.addrs.iter().zip(&go.oracle) {
        ensure!(
            lines.get(a) == Some(want),
            "{a:#x}: {:?} != {want:?}",
            lines.get(a)
        );
    }
    Ok(())
}

/// Pyroscope's uploads, both generations: the first clients' bidirectional `Upload` stream (a
/// shared library), and the later ShouldInitiateUpload, `POST …/Upload/<gnu id>` and
/// UploadFinished (a Rust program); then ListDebuginfo and DeleteDebuginfo.
#[test]
fn pyroscope_uploads_of_both_generations_name_frames() -> Result<()> {
    use d::debuginfo_service_client::DebuginfoServiceClient;
    use kiln_proto::debuginfo::v1alpha1 as d;
    let dir = tempfile::tempdir()?;
    let kiln = Kiln::start(&[])?;
    let lib = subject(Program::CShared, dir.path(), "libsum")?;
    let rust = subject(Program::Rust, dir.path(), "rust-svc")?;
    send_otlp(&kiln, "team-a", lib.otlp())?;
    send_otlp(&kiln, "team-a", rust.otlp())?;
    let rt = tokio::runtime::Runtime::new()?;
    let channel = grpc_channel(&kiln, &rt)?;
    let mut client = DebuginfoServiceClient::new(channel.clone());
    let lib_data = std::fs::read(&lib.built.debug)?;
    let lib_id = lib.gnu.clone().context("the library has a GNU build id")?;
    rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel::<d::UploadRequest>(4);
        tx.send(d::UploadRequest {
            data: Some(d::upload_request::Data::Init(
                d::ShouldInitiateUploadRequest {
                    file: Some(d::FileMetadata {
                        gnu_build_id: lib_id.clone(),
                        otel_file_id: lib.file_id.clone(),
                        name: "libsum.so".into(),
                        r#type: d::file_metadata::Type::ExecutableNoText as i32,
                        ..Default::default()
                    }),
                },
            )),
        })
        .await?;
        let mut answers = client
            .upload(with_tenant(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                "team-a",
            ))
            .await?
            .into_inner();
        let first = answers.message().await?.context("no answer to init")?;
        let Some(d::upload_response::Data::Init(init)) = first.data else {
            bail!("{first:?}");
        };
        ensure!(init.should_initiate_upload, "{init:?}");
        for chunk in lib_data.chunks(64 << 10) {
            tx.send(d::UploadRequest {
                data: Some(d::upload_request::Data::Chunk(d::UploadChunk {
                    chunk: chunk.to_vec().into(),
                })),
            })
            .await?;
        }
        drop(tx);
        while answers.message().await?.is_some() {}
        Ok::<_, anyhow::Error>(())
    })?;

    // The later generation: ask, POST the bytes, say it is finished.
    let rust_id = rust.gnu.clone().context("rustc writes a GNU build id")?;
    let should: d::ShouldInitiateUploadResponse = kiln.connect(
        "team-a",
        "/debuginfo.v1alpha1.DebuginfoService/ShouldInitiateUpload",
        &d::ShouldInitiateUploadRequest {
            file: Some(d::FileMetadata {
                gnu_build_id: rust_id.clone(),
                name: "rust".into(),
                r#type: d::file_metadata::Type::ExecutableNoText as i32,
                ..Default::default()
            }),
        },
    )?;
    ensure!(should.should_initiate_upload, "{should:?}");
    let resp = kiln
        .http()
        .post(kiln.url(&format!(
            "/debuginfo.v1alpha1.DebuginfoService/Upload/{rust_id}"
        )))
        .header("X-Scope-OrgID", "team-a")
        .body(std::fs::read(&rust.built.debug)?)
        .send()?;
    ensure!(
        resp.status() == 200,
        "POST upload: {} {}",
        resp.status(),
        resp.text()?
    );
    let _: d::UploadFinishedResponse = kiln.connect(
        "team-a",
        "/debuginfo.v1alpha1.DebuginfoService/UploadFinished",
        &d::UploadFinishedRequest {
            gnu_build_id: rust_id.clone(),
        },
    )?;
    let listed: d::ListDebuginfoResponse = kiln.connect(
        "team-a",
        "/debuginfo.v1alpha1.DebuginfoService/ListDebuginfo",
        &d::ListDebuginfoRequest {},
    )?;
    ensure!(listed.object.len() == 2, "{listed:?}");
    ensure!(
        listed
            .object
            .iter()
            .all(|o| o.state == d::object_metadata::State::Uploaded as i32)
    );
    let other: d::ListDebuginfoResponse = kiln.connect(
        "team-b",
        "/debuginfo.v1alpha1.DebuginfoService/ListDebuginfo",
        &d::ListDebuginfoRequest {},
    )?;
    ensure!(other.object.is_empty(), "{other:?}");

    let ty = profile_type(&kiln, "team-a")?;
    for s in [&lib, &rust] {
        let want = s.named_stacks();
        eventually(|| Ok(stacks(&kiln, "team-a", &ty, &s.service)?.0 == want)).map_err(|e| {
            let got = stacks(&kiln, "team-a", &ty, &s.service).map(|s| s.0);
            anyhow::anyhow!(
                "{}: {e}: got {got:?}, want {want:?}\n{}",
                s.service,
                log_tail(&kiln)
            )
        })?;
    }
    let _: d::DeleteDebuginfoResponse = kiln.connect(
        "team-a",
        "/debuginfo.v1alpha1.DebuginfoService/DeleteDebuginfo",
        &d::DeleteDebuginfoRequest {
            gnu_build_id: rust_id,
        },
    )?;
    eventually(|| {
        Ok(stacks(&kiln, "team-a", &ty, &rust.service)?.0 == rust.unnamed_stacks(&rust.addrs))
    })?;
    Ok(())
}

/// A real debuginfod (Debian's, over a directory of debug files) names what no upload covers;
/// stopped mid-test, queries still answer within their deadline with a warning, and name the
/// frames once it is back. What it gave is kept for every tenant within
/// `--debuginfod-stored-size`, the least recently used file removed first and fetched again.
#[test]
fn debuginfod_names_frames_and_a_dead_server_only_delays_them() -> Result<()> {
    if !testing::have("debuginfod") {
        kiln_otel::skip::missing("debuginfod");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served)?;
    let c = subject(Program::C, &served, "c-debuginfod")?;
    let mut server =
        testing::DebuginfodServer::start(&served, dir.path()).map_err(anyhow::Error::msg)?;
    server
        .wait_for(c.gnu.as_deref().unwrap())
        .map_err(anyhow::Error::msg)?;
    // Room for the larger of the two files the server gives, not both.
    let cpp = subject(Program::Cpp, &served, "cpp-debuginfod")?;
    server
        .wait_for(cpp.gnu.as_deref().unwrap())
        .map_err(anyhow::Error::msg)?;
    let served_size = |s: &Subject| -> Result<u64> {
        let id = s.gnu.as_deref().unwrap();
        for kind in ["debuginfo", "executable"] {
            let resp = reqwest::blocking::get(format!("{}/buildid/{id}/{kind}", server.url()))?;
            if resp.status().is_success() {
                return Ok(resp.bytes()?.len() as u64);
            }
        }
        anyhow::bail!("the server has no file of {id}")
    };
    let (c_size, cpp_size) = (served_size(&c)?, served_size(&cpp)?);
    let room = c_size.max(cpp_size) + c_size.min(cpp_size) / 2;
    let kiln = Kiln::start(&[
        "--debuginfod-url",
        &server.url(),
        "--debuginfod-retry-after-secs",
        "1",
        "--symbolize-deadline-ms",
        "1500",
        "--debuginfod-stored-size",
        &room.to_string(),
        "--retention-interval",
        "1s",
    ])?;
    send_otlp(&kiln, "team-a", c.otlp())?;
    let ty = profile_type(&kiln, "team-a")?;
    let want = c.named_stacks();
    eventually(|| Ok(stacks(&kiln, "team-a", &ty, &c.service)?.0 == want))?;

    // Down: a program it would have served.
    server.stop();
    send_otlp(&kiln, "team-a", cpp.otlp())?;
    let started = std::time::Instant::now();
    let (down, warning) = stacks(&kiln, "team-a", &ty, &cpp.service)?;
    ensure!(started.elapsed() < std::time::Duration::from_secs(10));
    ensure!(down == cpp.unnamed_stacks(&cpp.addrs), "{down:?}");
    let warning = warning.context("no kiln-warning while debuginfod is down")?;
    ensure!(
        warning.contains("debuginfod") || warning.contains("named"),
        "{warning}"
    );
    // Back.
    server.restart().map_err(anyhow::Error::msg)?;
    server
        .wait_for(cpp.gnu.as_deref().unwrap())
        .map_err(anyhow::Error::msg)?;
    let want = cpp.named_stacks();
    eventually(|| Ok(stacks(&kiln, "team-a", &ty, &cpp.service)?.0 == want))?;
    // Kept within the bound: the first program's file, used longest ago, was removed once the
    // second's came. With the server gone, another tenant's profile of the second is named
    // and of the first is not.
    let object = |s: &Subject| {
        let path = kiln_symbolize::debuginfod::object_path(s.gnu.as_deref().unwrap());
        kiln.data_dir.path().join("data/objects").join(path)
    };
    eventually(|| Ok(!object(&c).exists()))?;
    ensure!(object(&cpp).exists(), "the file used last is kept");
    server.stop();
    send_otlp(&kiln, "team-b", cpp.otlp())?;
    eventually(|| Ok(stacks(&kiln, "team-b", &ty, &cpp.service)?.0 == cpp.named_stacks()))?;
    send_otlp(&kiln, "team-b", c.otlp())?;
    let (gone, _) = stacks(&kiln, "team-b", &ty, &c.service)?;
    ensure!(gone == c.unnamed_stacks(&c.addrs), "{gone:?}");
    // Fetched again once the server is back.
    server.restart().map_err(anyhow::Error::msg)?;
    server
        .wait_for(c.gnu.as_deref().unwrap())
        .map_err(anyhow::Error::msg)?;
    eventually(|| Ok(stacks(&kiln, "team-b", &ty, &c.service)?.0 == c.named_stacks()))?;
    Ok(())
}

/// A debug-only file (`objcopy --only-keep-debug`), the only one Debian's debuginfod has of
/// a program, names its pprof profiles of each mapping shape: the code segment's mapping as
/// `/proc/<pid>/maps` has it, and one mapping of the whole file from offset 0; for a
/// position-dependent and a position-independent executable (loaded at a bias).
#[test]
fn a_served_debug_only_file_names_each_mapping_shape() -> Result<()> {
    if !testing::have("debuginfod") {
        kiln_otel::skip::missing("debuginfod");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served)?;
    let programs = [
        (subject(Program::C, &served, "c-shapes")?, 0),
        (
            subject(Program::CPie, &served, "pie-shapes")?,
            0x5555_0000_0000,
        ),
    ];
    // Only the stripped executable and the debug-only file are left to serve.
    for (p, _) in &programs {
        std::fs::remove_file(&p.built.full)?;
    }
    let server =
        testing::DebuginfodServer::start(&served, dir.path()).map_err(anyhow::Error::msg)?;
    for (p, _) in &programs {
        server
            .wait_for(p.gnu.as_deref().unwrap())
            .map_err(anyhow::Error::msg)?;
    }
    let kiln = Kiln::start(&["--debuginfod-url", &server.url()])?;
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    for (p, bias) in &programs {
        for (shape, body) in [
            ("segment", p.pprof(*bias)),
            ("whole-file", p.pprof_whole_file(*bias)?),
        ] {
            let service = format!("{}-{shape}", p.service);
            let (s, b) =
                kiln.ingest("team-a", &format!("name={service}&format=pprof"), body, &[])?;
            ensure!(s == 200, "{s} {b}");
            let want = p.named_stacks_of(1);
            eventually(|| Ok(stacks(&kiln, "team-a", cpu, &service)?.0 == want)).with_context(
                || {
                    format!(
                        "{service}: {:?}",
                        stacks(&kiln, "team-a", cpu, &service).map(|s| s.0)
                    )
                },
            )?;
        }
    }
    // Another tenant never sees team-a's series.
    ensure!(
        stacks(&kiln, "team-b", cpu, "c-shapes-segment")?
            .0
            .is_empty()
    );
    Ok(())
}

/// The Parca agent's upload of a C program's debug file (ShouldInitiateUpload, InitiateUpload,
/// the streamed Upload, MarkUploadFinished over gRPC) sent to `ingest` (a load balancer may
/// send each call to another process), its OTLP profile too; then the frames are named when
/// `query` answers. Another tenant's frames stay unnamed. For the cluster test.
pub(super) fn parca_upload_names_frames_elsewhere(ingest: &Kiln, query: &Kiln) -> Result<()> {
    use d::debuginfo_service_client::DebuginfoServiceClient;
    use kiln_proto::parca::debuginfo::v1alpha1 as d;
    let dir = tempfile::tempdir()?;
    let c = subject(Program::C, dir.path(), "c-spread")?;
    let gnu = c.gnu.clone().context("a GNU build id")?;
    send_otlp(ingest, "team-a", c.otlp())?;
    send_otlp(ingest, "team-b", c.otlp())?;
    let data = std::fs::read(&c.built.debug)?;
    let rt = tokio::runtime::Runtime::new()?;
    let channel = grpc_channel(ingest, &rt)?;
    let mut client = DebuginfoServiceClient::new(channel).max_encoding_message_size(64 << 20);
    rt.block_on(async {
        parca_upload(&mut client, "team-a", &gnu, d::BuildIdType::Gnu, &data).await?;
        let again = client
            .should_initiate_upload(with_tenant(
                d::ShouldInitiateUploadRequest {
                    build_id: gnu.clone(),
                    build_id_type: d::BuildIdType::Gnu as i32,
                    ..Default::default()
                },
                "team-a",
            ))
            .await?
            .into_inner();
        ensure!(!again.should_initiate_upload, "{again:?}");
        Ok(())
    })?;
    let ty = profile_type(query, "team-a")?;
    let want = c.named_stacks();
    eventually(|| Ok(stacks(query, "team-a", &ty, &c.service)?.0 == want))?;
    let (other, _) = stacks(query, "team-b", &ty, &c.service)?;
    ensure!(other == c.unnamed_stacks(&c.addrs), "team-b: {other:?}");
    Ok(())
}

/// The Parca agent's upload of one file for `tenant`, as the agent makes it: ShouldInitiateUpload
/// (which must say yes), InitiateUpload (gRPC instructions), the streamed Upload in 256 KiB
/// chunks, MarkUploadFinished.
async fn parca_upload(
    client: &mut kiln_proto::parca::debuginfo::v1alpha1::debuginfo_service_client::DebuginfoServiceClient<
        tonic::transport::Channel,
    >,
    tenant: &str,
    id: &str,
    id_type: kiln_proto::parca::debuginfo::v1alpha1::BuildIdType,
    data: &[u8],
) -> Result<()> {
    use kiln_proto::parca::debuginfo::v1alpha1 as d;
    let should = client
        .should_initiate_upload(with_tenant(
            d::ShouldInitiateUploadRequest {
                build_id: id.to_owned(),
                build_id_type: id_type as i32,
                ..Default::default()
            },
            tenant,
        ))
        .await?
        .into_inner();
    ensure!(should.should_initiate_upload, "{should:?}");
    let instructions = client
        .initiate_upload(with_tenant(
            d::InitiateUploadRequest {
                build_id: id.to_owned(),
                size: data.len() as i64,
                hash: id.to_owned(),
                build_id_type: id_type as i32,
                ..Default::default()
            },
            tenant,
        ))
        .await?
        .into_inner()
        .upload_instructions
        .context("no instructions")?;
    ensure!(
        instructions.upload_strategy == d::upload_instructions::UploadStrategy::Grpc as i32,
        "{instructions:?}"
    );
    let mut messages = vec![d::UploadRequest {
        data: Some(d::upload_request::Data::Info(d::UploadInfo {
            build_id: id.to_owned(),
            upload_id: instructions.upload_id.clone(),
            r#type: 0,
        })),
    }];
    for chunk in data.chunks(256 << 10) {
        messages.push(d::UploadRequest {
            data: Some(d::upload_request::Data::ChunkData(chunk.to_vec().into())),
        });
    }
    let uploaded = client
        .upload(with_tenant(futures::stream::iter(messages), tenant))
        .await?
        .into_inner();
    ensure!(uploaded.size == data.len() as u64, "{uploaded:?}");
    client
        .mark_upload_finished(with_tenant(
            d::MarkUploadFinishedRequest {
                build_id: id.to_owned(),
                upload_id: instructions.upload_id,
                r#type: 0,
            },
            tenant,
        ))
        .await?;
    Ok(())
}

/// A recording rule on a native function counts the frames ingest could not name, once the
/// tenant's debug file names them: sealing reads the rule's open intervals back from storage.
/// Another tenant with the same profile and rule but no debug file counts nothing.
#[test]
fn a_function_rule_counts_native_frames_named_by_debug_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kiln = Kiln::start(&[
        "--max-debuginfo-file-bytes",
        "33554432",
        "--recording-interval",
        "1s",
        "--recording-delay",
        "1s",
        "--recording-backfill",
        "0s",
    ])?;
    let c = subject(Program::CPie, dir.path(), "c-pie")?;
    send_otlp(&kiln, "probe", c.otlp())?;
    let ty = profile_type(&kiln, "probe")?;
    // The leaf function of the last address, and what the profile holds of it.
    let function = c
        .oracle
        .last()
        .and_then(|f| f.first())
        .context("frames")?
        .function
        .clone();
    let want: i64 = c
        .oracle
        .iter()
        .enumerate()
        .filter(|(_, frames)| frames.iter().any(|f| f.function == function))
        .map(|(i, _)| (i as i64 + 1) * OTLP_PERIOD)
        .sum();
    ensure!(want > 0);
    let (s, v) = upload_http(&kiln, "team-a", &c.built.debug, false)?;
    ensure!(s == 200, "{s} {v}");
    let matcher = format!(r#"{{service_name="c-pie", __profile_type__="{ty}"}}"#);
    for tenant in ["team-a", "team-b"] {
        crate::recording_rules::make_rule(&kiln, tenant, "hot", &[&matcher], &[], Some(&function))?;
    }
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    for tenant in ["team-a", "team-b"] {
        send_otlp(&kiln, tenant, c.otlp_at(at.as_nanos() as u64))?;
    }
    let counter = |tenant: &str| -> Result<(Option<i64>, i64)> {
        let text = kiln
            .http()
            .get(kiln.url("/api/v1/recording-rules/metrics"))
            .header("X-Scope-OrgID", tenant)
            .send()?
            .text()?;
        let mut value = None;
        let mut sealed = 0;
        for l in text
            .lines()
            .filter(|l| l.starts_with("profiles_recorded_hot"))
        {
            let mut parts = l.rsplitn(3, ' ');
            sealed = parts.next().context("time")?.parse()?;
            value = Some(parts.next().context("value")?.parse::<f64>()? as i64);
        }
        Ok((value, sealed))
    };
    let past = at.as_millis() as i64 + 1000;
    let mut got = (None, 0);
    for _ in 0..100 {
        got = counter("team-a")?;
        if got.1 > past {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    ensure!(
        got.1 > past,
        "team-a not sealed past {past}: {got:?}\n{}",
        log_tail(&kiln)
    );
    ensure!(
        got.0 == Some(want),
        "team-a: {got:?}, want {want} of {function}"
    );
    // team-b's frames stay unnamed: its rule has no series.
    ensure!(
        counter("team-b")?.0.is_none(),
        "team-b: {:?}",
        counter("team-b")?
    );
    Ok(())
}
