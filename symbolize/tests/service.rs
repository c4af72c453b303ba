//! The symbolizer as a server runs it: a tenant's uploads name its frames and no other
//! tenant's; refused uploads are stored nowhere; debuginfod names what no upload covers, and a
//! dead debuginfod only delays names (a warning, then names once it is back).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_storage::{Storage, StorageConfig};
use kiln_symbolize::debuginfod::DebuginfodConfig;
use kiln_symbolize::store::{UploadError, UploadLimits};
use kiln_symbolize::testing::{self, Program};
use kiln_symbolize::{Frame, MappingRange, Metrics, Request, Symbolizer, SymbolizerConfig};

const LIMITS: UploadLimits = UploadLimits {
    max_file_bytes: 64 << 20,
    max_tenant_bytes: 256 << 20,
    max_inflated_bytes: 512 << 20,
};

async fn symbolizer(dir: &std::path::Path, debuginfod: Vec<String>) -> Symbolizer {
    let storage = Storage::open(StorageConfig::new(dir.join("data")))
        .await
        .unwrap();
    let config = SymbolizerConfig {
        cache_dir: dir.join("cache"),
        cache_bytes: 1 << 30,
        open_bytes: 1 << 30,
        resolved_bytes: 64 << 20,
        max_inflated_bytes: 512 << 20,
        debuginfod: DebuginfodConfig {
            urls: debuginfod,
            timeout: Duration::from_secs(10),
            concurrency: 2,
            tenant_concurrency: 2,
            missing_ttl: Duration::from_secs(3600),
            retry_after: Duration::from_secs(1),
            max_file_bytes: 1 << 30,
            max_stored_bytes: 0,
            attempts: 2,
            scratch_dir: dir.join("scratch"),
        },
    };
    Symbolizer::new(
        storage.store().clone(),
        config,
        Arc::new(Metrics::default()),
    )
    .unwrap()
}

fn requests(build_id: &str, addrs: &[u64]) -> Vec<Request> {
    addrs
        .iter()
        .map(|&address| Request {
            build_id: build_id.to_owned(),
            mapping: MappingRange::default(),
            address,
        })
        .collect()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_name_their_tenants_frames_only() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let addrs = testing::addresses_in(&built.full, &built.functions, 8);
    let oracle = testing::addr2line(&built.debug, &addrs).unwrap();
    let s = symbolizer(dir.path(), vec![]).await;
    let stored = s
        .store()
        .add("team-a", "/build/c.debug", &built.debug, &[], LIMITS)
        .await
        .unwrap();
    s.changed("team-a");
    assert_eq!(stored.kind, "debug-only");
    assert_eq!(stored.name, "c.debug");
    let gnu = stored.gnu_build_id.clone().unwrap();
    assert!(stored.ids.contains(&gnu) && stored.ids.contains(&stored.file_id));

    let got = s.resolve("team-a", &requests(&gnu, &addrs), soon()).await;
    assert!(
        got.warnings.is_empty() && !got.incomplete,
        "{:?}",
        got.warnings
    );
    let frames: Vec<Vec<Frame>> = got
        .frames
        .iter()
        .map(|f| f.as_deref().unwrap_or_default().to_vec())
        .collect();
    assert_eq!(frames, oracle);
    // Another tenant has no such file: its frames stay unnamed, and it lists nothing.
    let other = s.resolve("team-b", &requests(&gnu, &addrs), soon()).await;
    assert!(other.frames.iter().all(Option::is_none));
    assert!(s.store().list("team-b").await.unwrap().is_empty());
    assert!(s.store().find("team-b", &gnu).await.unwrap().is_none());

    // The same bytes again: stored once; under a claimed id too.
    let again = s
        .store()
        .add(
            "team-a",
            "c.debug",
            &built.debug,
            &["0123abcd".into()],
            LIMITS,
        )
        .await
        .unwrap();
    assert_eq!(again.sha256, stored.sha256);
    assert!(again.ids.iter().any(|i| i == "0123abcd"));
    assert_eq!(s.store().list("team-a").await.unwrap().len(), 1);
    assert_eq!(
        s.store()
            .find("team-a", "0123abcd")
            .await
            .unwrap()
            .unwrap()
            .sha256,
        stored.sha256
    );

    // Deleted: the names go with it.
    let gone = s.store().delete("team-a", &gnu).await.unwrap().unwrap();
    s.forget("team-a", &gone).await;
    let after = s.resolve("team-a", &requests(&gnu, &addrs), soon()).await;
    assert!(after.frames.iter().all(Option::is_none));
    assert!(s.store().list("team-a").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_stored_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let s = symbolizer(dir.path(), vec![]).await;
    let write = |name: &str, data: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let debug = std::fs::read(&built.debug).unwrap();
    let not_elf = write("notes.txt", b"hello, not an ELF file");
    let truncated = write("cut.debug", &debug[..debug.len() / 2]);
    for (path, want) in [(&not_elf, "not an ELF file"), (&truncated, "truncated")] {
        let err = s
            .store()
            .add("team-a", "x", path, &[], LIMITS)
            .await
            .unwrap_err();
        assert!(
            matches!(err, UploadError::Invalid(_)) && err.to_string().contains(want),
            "{err}"
        );
    }
    // A program stripped of everything that names code.
    let err = s
        .store()
        .add("team-a", "c.stripped", &built.stripped, &[], LIMITS)
        .await
        .unwrap_err();
    assert!(matches!(err, UploadError::NoSymbols), "{err}");
    let small = UploadLimits {
        max_file_bytes: 1000,
        ..LIMITS
    };
    let err = s
        .store()
        .add("team-a", "c.debug", &built.debug, &[], small)
        .await
        .unwrap_err();
    assert!(matches!(err, UploadError::FileTooLarge { .. }), "{err}");
    let full = UploadLimits {
        max_tenant_bytes: 1000,
        ..LIMITS
    };
    let err = s
        .store()
        .add("team-a", "c.debug", &built.debug, &[], full)
        .await
        .unwrap_err();
    assert!(matches!(err, UploadError::TenantFull { .. }), "{err}");
    assert!(s.store().list("team-a").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debuginfod_names_what_no_upload_covers_and_a_dead_one_only_delays() {
    if !testing::have("debuginfod") {
        kiln_otel::skip::missing("debuginfod");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let first = testing::build(Program::C, &served).unwrap();
    let mut server = testing::DebuginfodServer::start(&served, dir.path()).unwrap();
    let id = kiln_symbolize::identify_file(&first.debug)
        .unwrap()
        .gnu_build_id
        .unwrap();
    server.wait_for(&id).unwrap();
    let s = symbolizer(dir.path(), vec![server.url()]).await;
    let addrs = testing::addresses_in(&first.full, &first.functions, 8);
    let oracle = testing::addr2line(&first.debug, &addrs).unwrap();
    let got = s.resolve("team-a", &requests(&id, &addrs), soon()).await;
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    let frames: Vec<Vec<Frame>> = got
        .frames
        .iter()
        .map(|f| f.as_deref().unwrap_or_default().to_vec())
        .collect();
    assert_eq!(frames, oracle);

    // The server goes away; a build id it would have served is asked for: the answer comes
    // within the deadline, unnamed, with a warning.
    server.stop();
    let second = testing::build(Program::Cpp, &served).unwrap();
    let id2 = kiln_symbolize::identify_file(&second.debug)
        .unwrap()
        .gnu_build_id
        .unwrap();
    let addrs2 = testing::addresses_in(&second.full, &second.functions, 8);
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(2);
    let down = s
        .resolve("team-a", &requests(&id2, &addrs2), deadline)
        .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(down.frames.iter().all(Option::is_none));
    assert!(down.incomplete && !down.warnings.is_empty(), "{down:?}");
    // Back: once the failure's wait is over, the names come.
    server.restart().unwrap();
    server.wait_for(&id2).unwrap();
    let oracle2 = testing::addr2line(&second.debug, &addrs2).unwrap();
    let mut named = false;
    for _ in 0..50 {
        let up = s.resolve("team-a", &requests(&id2, &addrs2), soon()).await;
        if up.frames.iter().all(Option::is_some) {
            let frames: Vec<Vec<Frame>> = up
                .frames
                .iter()
                .map(|f| f.as_deref().unwrap().to_vec())
                .collect();
            assert_eq!(frames, oracle2);
            named = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(named, "debuginfod's file was never used after it came back");
    // What debuginfod gave is kept: the first file resolves with the server down.
    server.stop();
    let kept = s.resolve("team-b", &requests(&id, &addrs), soon()).await;
    assert!(kept.frames.iter().all(Option::is_some));
}

/// A debuginfod that has nothing: 404 for every build id, after 3 s for those starting with
/// `5` (slow ones), at once for the rest. Plain HTTP/1.1 on a loopback port.
async fn slow_empty_debuginfod() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let Ok(n) = conn.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if head.contains("/buildid/5") {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    let answer = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_slow_fetches_leave_fetch_permits_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let url = slow_empty_debuginfod().await;
    // Three fetches at once in all, two for one tenant (with three, this test fails).
    let storage = Storage::open(StorageConfig::new(dir.path().join("data")))
        .await
        .unwrap();
    let mut config = SymbolizerConfig::without_debuginfod(dir.path());
    config.debuginfod.urls = vec![url];
    config.debuginfod.concurrency = 3;
    config.debuginfod.tenant_concurrency = 2;
    config.debuginfod.attempts = 1;
    let s = Symbolizer::new(
        storage.store().clone(),
        config,
        Arc::new(Metrics::default()),
    )
    .unwrap();
    // The noisy tenant's queries name six slow build ids; they wait past their deadline.
    let noisy: Vec<Request> = (0..6)
        .flat_map(|i| requests(&format!("5{i:039x}"), &[0x1000]))
        .collect();
    let short = Instant::now() + Duration::from_millis(300);
    let got = s.resolve("noisy", &noisy, short).await;
    assert!(got.incomplete, "{:?}", got.warnings);
    // Another tenant's lookup is answered at once: the noisy one holds two of three fetches.
    let started = Instant::now();
    let got = s
        .resolve(
            "quiet",
            &requests("a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", &[0x1000]),
            Instant::now() + Duration::from_secs(2),
        )
        .await;
    assert!(
        !got.incomplete,
        "{:?} after {:?}",
        got.warnings,
        started.elapsed()
    );
    assert!(got.frames.iter().all(Option::is_none));
    assert!(started.elapsed() < Duration::from_secs(2));
}
