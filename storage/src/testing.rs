//! Helpers for tests of the storage engine (feature `testing`): profiles built from root-first
//! stacks of function names, and a storage on a temporary directory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kiln_otel::model::{
    Function, Labels, Line, Location, NormalizedProfile, ProfileType, Sample, Series, Symbols,
};

use crate::compaction::LevelPolicy;
use crate::query::SampleFilter;
use crate::selector::parse_selector;
use crate::store::ObjectStorage;
use crate::store::faulty::FaultyStore;
use crate::{Storage, StorageConfig};

/// The CPU profile type id the helpers use.
pub const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// The CPU profile type.
pub fn cpu_type() -> ProfileType {
    ProfileType::parse(CPU).expect("a valid profile type id")
}

/// A CPU profile of service `service` at `time_nanos` with the given root-first stacks and
/// values (stacks may repeat).
pub fn profile(service: &str, stacks: &[(Vec<String>, i64)], time_nanos: i64) -> NormalizedProfile {
    profile_with_labels(
        Labels::from_pairs([("__name__", "process_cpu"), ("service_name", service)]),
        stacks,
        time_nanos,
    )
}

/// A CPU profile of the series `labels` at `time_nanos` with the given root-first stacks.
pub fn profile_with_labels(
    labels: Labels,
    stacks: &[(Vec<String>, i64)],
    time_nanos: i64,
) -> NormalizedProfile {
    let mut symbols = Symbols::default();
    let mut index: HashMap<&str, u32> = HashMap::new();
    let mut samples = Vec::with_capacity(stacks.len());
    for (frames, value) in stacks {
        let stack = frames
            .iter()
            .rev()
            .map(|f| {
                *index.entry(f.as_str()).or_insert_with(|| {
                    let i = symbols.functions.len() as u32;
                    symbols.functions.push(Function {
                        name: f.as_str().into(),
                        ..Default::default()
                    });
                    symbols.locations.push(Location {
                        lines: kiln_otel::model::smallvec![Line {
                            function: i,
                            line: 1,
                        }],
                        ..Default::default()
                    });
                    i
                })
            })
            .collect();
        samples.push(Sample {
            stack,
            value: *value,
            ..Default::default()
        });
    }
    NormalizedProfile {
        symbols,
        series: vec![Series {
            labels,
            profile_type: cpu_type(),
            time_nanos,
            duration_nanos: 10_000_000_000,
            samples,
        }],
    }
}

/// A CPU profile of `service` at `time_nanos` with `stacks` distinct stacks (`main;work;f<k>`),
/// so a series' samples fill Parquet pages of 8 Ki rows within a few hundred profiles.
pub fn wide_profile(service: &str, stacks: usize, step: i64, time_nanos: i64) -> NormalizedProfile {
    let stacks: Vec<(Vec<String>, i64)> = (0..stacks)
        .map(|k| (frames(&format!("main;work;f{k}")), 1 + k as i64 + step % 7))
        .collect();
    profile(service, &stacks, time_nanos)
}

/// Root-first frames from `a;b;c`.
pub fn frames(folded: &str) -> Vec<String> {
    folded.split(';').map(str::to_owned).collect()
}

/// Every CPU stack of `tenant` within an hour either side of `around`, summed (root first).
pub async fn stacks_around(s: &Storage, tenant: &str, around: i64) -> BTreeMap<Vec<String>, i64> {
    const HOUR: i64 = 3600 * 1_000_000_000;
    s.query()
        .merge_tree(&filter(tenant, "{}", around - HOUR, around + HOUR))
        .await
        .expect("a query")
        .stacks()
}

/// A filter over every CPU sample of `tenant` matching `selector` in `[start, end)`.
pub fn filter(tenant: &str, selector: &str, start: i64, end: i64) -> SampleFilter {
    SampleFilter {
        tenant: tenant.into(),
        profile_type: CPU.into(),
        selector: parse_selector(selector).expect("a valid selector"),
        start_nanos: start,
        end_nanos: end,
        span_ids: vec![],
        trace_ids: vec![],
        profile_ids: vec![],
    }
}

/// Every stack of `tenant` in `[start, end]` (nanoseconds), merged: root-first names → value.
pub async fn merged_stacks(
    s: &Storage,
    tenant: &str,
    start: i64,
    end: i64,
) -> std::collections::BTreeMap<Vec<String>, i64> {
    s.query()
        .merge_tree(&filter(tenant, "{}", start, end))
        .await
        .expect("a merged tree")
        .stacks()
}

/// Loses the embedded metastore of the data directory `dir` and recreates it from the objects'
/// footers, as `kiln metastore rebuild` does (the storage on `dir` closed).
pub async fn rebuild_lost_metastore(dir: &std::path::Path) -> crate::Rebuilt {
    let meta = dir.join("metastore");
    std::fs::remove_dir_all(&meta).expect("the metastore's directory");
    let store = ObjectStorage::local(&dir.join("objects")).expect("a local store");
    let m = crate::metastore::embedded::Embedded::open(&meta.join("metastore.redb"))
        .expect("an empty metastore");
    crate::rebuild_metastore(&store, &m)
        .await
        .expect("a rebuild")
}

/// Settings for tests: a short flush interval, compaction by count only (no age trigger within
/// a test's lifetime) with small fan-ins, no delete delay.
pub fn config(dir: &std::path::Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.writer.flush_interval = Duration::from_millis(5);
    let p = |blocks| LevelPolicy {
        blocks,
        age: Duration::from_secs(365 * 24 * 3600),
    };
    c.compaction.levels = vec![p(4), p(3), p(2)];
    c.compaction.batch_rows = 64;
    c.compaction.row_group_rows = 256;
    c.delete_delay = Duration::ZERO;
    c.orphan_grace = Duration::ZERO;
    c
}

/// [`config`] with object ids made at the time `ms` holds (their metastore partition).
pub fn config_with_clock(
    dir: &std::path::Path,
    ms: Arc<std::sync::atomic::AtomicU64>,
) -> StorageConfig {
    let mut c = config(dir);
    c.writer.clock = crate::clock::Clock::manual(ms);
    c
}

/// A storage on the local directory `dir` whose object store fails on demand.
pub async fn faulty_storage(config: StorageConfig) -> (Storage, Arc<FaultyStore>) {
    let local = ObjectStorage::local(&config.data_dir.join("objects")).expect("a local store");
    let faulty = Arc::new(FaultyStore::new(Arc::clone(local.inner())));
    let store = local.with_store(faulty.clone());
    let metastore: Arc<dyn crate::metastore::Metastore> = Arc::new(
        crate::metastore::embedded::Embedded::open(
            &config.data_dir.join("metastore").join("metastore.redb"),
        )
        .expect("a metastore"),
    );
    let storage = Storage::with_parts(config, store, metastore).expect("a storage");
    (storage, faulty)
}

/// The PostgreSQL server the tests use: `KILN_TEST_POSTGRES_URL`, which the test command
/// (`scripts/test-services.sh`) sets after starting a private server.
pub fn postgres_server_url() -> String {
    std::env::var("KILN_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "KILN_TEST_POSTGRES_URL is not set: run the tests with scripts/test.sh, or start \
             the test services with `eval \"$(bash scripts/test-services.sh)\"`"
        )
    })
}

/// A fresh, empty database on the test server, for one test; returns its URL.
pub async fn postgres_database() -> String {
    let server = postgres_server_url();
    let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test PostgreSQL at {server}: {e}"));
    tokio::spawn(connection);
    let name = format!(
        "kiln_test_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    let mut config: tokio_postgres::Config = server.parse().expect("a PostgreSQL URL");
    config.dbname(&name);
    url_of(&config, &name)
}

/// A `postgres://` URL for `config` with database `dbname`.
fn url_of(config: &tokio_postgres::Config, dbname: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let auth = match config.get_password() {
        Some(p) => format!("{user}:{}", String::from_utf8_lossy(p)),
        None => user.to_owned(),
    };
    format!("postgres://{auth}@{host}:{port}/{dbname}")
}

/// The S3-compatible test server (`KILN_TEST_S3_ENDPOINT`, bucket `KILN_TEST_S3_BUCKET`) that
/// the test command starts, as an `s3://` URL under a fresh prefix plus the configuration that
/// reaches it (endpoint, plain HTTP, dummy credentials).
pub fn s3_location() -> (String, Vec<(String, String)>) {
    let endpoint = std::env::var("KILN_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "KILN_TEST_S3_ENDPOINT is not set: run the tests with scripts/test.sh, or start the \
             test services with `eval \"$(bash scripts/test-services.sh)\"`"
        )
    });
    let bucket = std::env::var("KILN_TEST_S3_BUCKET").unwrap_or_else(|_| "kiln-test".into());
    let prefix = ulid::Ulid::generate().to_string().to_lowercase();
    let options = [
        ("aws_endpoint_url", endpoint.as_str()),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "test"),
        ("aws_secret_access_key", "test"),
        ("aws_region", "us-east-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    (format!("s3://{bucket}/{prefix}"), options)
}

/// The test command's object store servers, each as a URL under a fresh prefix plus the
/// configuration that reaches it: moto's S3 ([`s3_location`]), s3rver's S3
/// (`KILN_TEST_S3RVER_ENDPOINT`, bucket `kiln-test`, its fixed `S3RVER` credentials) and
/// Azurite's blob service (`KILN_TEST_AZURITE_ENDPOINT`, container `kiln-test`, the emulator's
/// well-known account), the latter two through the endpoint options a user of another
/// S3-compatible server or an Azure-compatible endpoint sets.
pub fn store_locations() -> Vec<(&'static str, (String, Vec<(String, String)>))> {
    let need = |var: &str| {
        std::env::var(var).unwrap_or_else(|_| {
            panic!(
                "{var} is not set: run the tests with scripts/test.sh, or start the test \
                 services with `eval \"$(bash scripts/test-services.sh)\"`"
            )
        })
    };
    let prefix = || ulid::Ulid::generate().to_string().to_lowercase();
    let pairs = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let s3rver = need("KILN_TEST_S3RVER_ENDPOINT");
    let azurite = need("KILN_TEST_AZURITE_ENDPOINT");
    vec![
        ("moto", s3_location()),
        (
            "s3rver",
            (
                format!("s3://kiln-test/{}", prefix()),
                pairs(&[
                    ("aws_endpoint_url", &s3rver),
                    ("aws_allow_http", "true"),
                    ("aws_access_key_id", "S3RVER"),
                    ("aws_secret_access_key", "S3RVER"),
                    ("aws_region", "us-east-1"),
                ]),
            ),
        ),
        (
            "azurite",
            (
                format!("az://kiln-test/{}", prefix()),
                pairs(&[
                    (
                        "azure_storage_endpoint",
                        &format!("{azurite}/{AZURITE_ACCOUNT}"),
                    ),
                    ("azure_allow_http", "true"),
                    ("azure_storage_account_name", AZURITE_ACCOUNT),
                    ("azure_storage_account_key", AZURITE_KEY),
                ]),
            ),
        ),
    ]
}

/// Azurite's well-known development account and key (Microsoft documents them).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A storage on a PostgreSQL metastore and an S3 object store (scratch files under
/// `config.data_dir`), as one process of a scale-out deployment sees them.
pub async fn shared_storage(
    config: StorageConfig,
    postgres_url: &str,
    s3: &(String, Vec<(String, String)>),
) -> Storage {
    let store =
        ObjectStorage::from_url_with(&s3.0, Duration::from_secs(5), &s3.1).expect("an S3 store");
    let metastore = crate::metastore::postgres::Postgres::connect(
        &crate::metastore::postgres::PostgresConfig::new(postgres_url),
    )
    .await
    .expect("a PostgreSQL metastore");
    Storage::with_parts(config, store, Arc::new(metastore)).expect("a storage")
}

/// The system clock in Unix milliseconds, as compaction and the sweeper take it.
pub fn now_ms() -> u64 {
    crate::clock::now_ms()
}

/// Sample rows of every block `tenant` has, as the metastore lists them.
pub async fn tenant_rows(s: &Storage, tenant: &str) -> u64 {
    s.metastore()
        .query_blocks(crate::metastore::BlockQuery::all(tenant))
        .await
        .unwrap()
        .iter()
        .map(|b| b.rows)
        .sum()
}

/// A metastore that counts the calls made to the one it wraps: tests assert what a path does
/// not do (a `/metrics` scrape reads nothing of it). It also loses answers on request: with
/// `lose_job_answers` set, a compaction job's commit goes through and is answered with an error,
/// as a connection that drops after the commit is.
#[derive(Debug)]
pub struct CountingMetastore {
    inner: Arc<dyn crate::metastore::Metastore>,
    calls: std::sync::atomic::AtomicU64,
    pub lose_job_answers: std::sync::atomic::AtomicBool,
}

impl CountingMetastore {
    pub fn new(inner: Arc<dyn crate::metastore::Metastore>) -> Self {
        Self {
            inner,
            calls: std::sync::atomic::AtomicU64::new(0),
            lose_job_answers: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn count(&self) -> &dyn crate::metastore::Metastore {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.as_ref()
    }
}

#[async_trait::async_trait]
impl crate::metastore::Metastore for CountingMetastore {
    async fn add_blocks(&self, blocks: Vec<crate::format::meta::BlockMeta>) -> crate::Result<()> {
        self.count().add_blocks(blocks).await
    }
    async fn add_blocks_checkpointed(
        &self,
        blocks: Vec<crate::format::meta::BlockMeta>,
        checkpoint: &crate::metastore::LogCheckpoint,
    ) -> crate::Result<()> {
        self.count()
            .add_blocks_checkpointed(blocks, checkpoint)
            .await
    }
    async fn log_checkpoint(&self, log: &str) -> crate::Result<u64> {
        self.count().log_checkpoint(log).await
    }
    async fn query_blocks(
        &self,
        query: crate::metastore::BlockQuery<'_>,
    ) -> crate::Result<Vec<Arc<crate::format::meta::BlockMeta>>> {
        self.count().query_blocks(query).await
    }
    async fn get_blocks(
        &self,
        tenant: &str,
        ids: &[String],
    ) -> crate::Result<Vec<Arc<crate::format::meta::BlockMeta>>> {
        self.count().get_blocks(tenant, ids).await
    }
    async fn tenants(&self) -> crate::Result<Vec<String>> {
        self.count().tenants().await
    }
    async fn partitions(
        &self,
        tenant: &str,
    ) -> crate::Result<Vec<crate::metastore::PartitionStats>> {
        self.count().partitions(tenant).await
    }
    async fn queued_blocks(&self) -> crate::Result<Vec<crate::metastore::QueuedBlock>> {
        self.count().queued_blocks().await
    }
    async fn add_jobs(&self, jobs: Vec<crate::metastore::Job>) -> crate::Result<usize> {
        self.count().add_jobs(jobs).await
    }
    async fn lease_job(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        levels: std::ops::Range<u32>,
    ) -> crate::Result<Option<crate::metastore::Job>> {
        self.count()
            .lease_job(owner, now_ms, lease_ms, levels)
            .await
    }
    async fn complete_job(
        &self,
        job: &crate::metastore::Job,
        owner: &str,
        outputs: Vec<crate::format::meta::BlockMeta>,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> crate::Result<()> {
        self.count()
            .complete_job(job, owner, outputs, now_ms, delete_after_ms)
            .await
    }
    async fn renew_job(
        &self,
        job: &crate::metastore::Job,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> crate::Result<bool> {
        self.count().renew_job(job, owner, now_ms, lease_ms).await
    }
    async fn cancel_job(&self, job: &crate::metastore::Job) -> crate::Result<()> {
        self.count().cancel_job(job).await
    }
    async fn jobs(&self) -> crate::Result<Vec<crate::metastore::Job>> {
        self.count().jobs().await
    }
    async fn drop_partitions(
        &self,
        tenant: &str,
        before_partition: i64,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> crate::Result<crate::metastore::Removed> {
        self.count()
            .drop_partitions(tenant, before_partition, now_ms, delete_after_ms)
            .await
    }
    async fn delete_tenant(
        &self,
        tenant: &str,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> crate::Result<crate::metastore::Removed> {
        self.count()
            .delete_tenant(tenant, now_ms, delete_after_ms)
            .await
    }
    async fn due_tombstones(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> crate::Result<Vec<crate::metastore::Tombstone>> {
        self.count().due_tombstones(now_ms, limit).await
    }
    async fn forget_tombstones(&self, ids: &[String]) -> crate::Result<()> {
        self.count().forget_tombstones(ids).await
    }
    async fn known_objects(&self) -> crate::Result<std::collections::HashSet<String>> {
        self.count().known_objects().await
    }
    async fn known_among(
        &self,
        ids: &[String],
    ) -> crate::Result<std::collections::HashSet<String>> {
        self.count().known_among(ids).await
    }
    async fn quarantine(
        &self,
        tenant: &str,
        id: &str,
        reason: &str,
        now_ms: u64,
    ) -> crate::Result<bool> {
        self.count().quarantine(tenant, id, reason, now_ms).await
    }
    async fn quarantined(
        &self,
        tenant: Option<&str>,
    ) -> crate::Result<Vec<crate::metastore::Quarantined>> {
        self.count().quarantined(tenant).await
    }
    async fn shrink(&self) -> crate::Result<()> {
        self.count().shrink().await
    }
    async fn heartbeat(
        &self,
        me: &crate::metastore::Member,
        timeout: std::time::Duration,
    ) -> crate::Result<Vec<crate::metastore::Member>> {
        self.count().heartbeat(me, timeout).await
    }
    async fn leave(&self, id: &str) -> crate::Result<()> {
        self.count().leave(id).await
    }
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> crate::Result<Option<u64>> {
        self.count().hold_lease(name, holder, ttl).await
    }
    async fn ping(&self) -> crate::Result<()> {
        self.count().ping().await
    }
    async fn release_lease(&self, name: &str, holder: &str) -> crate::Result<()> {
        self.count().release_lease(name, holder).await
    }
    async fn add_usage(&self, counts: &[crate::metastore::UsageCount]) -> crate::Result<()> {
        self.count().add_usage(counts).await
    }
    async fn usage(
        &self,
        tenant: &str,
    ) -> crate::Result<Option<std::collections::BTreeMap<String, u64>>> {
        self.count().usage(tenant).await
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn complete_job_recorded(
        &self,
        job: &crate::metastore::Job,
        owner: &str,
        outputs: Vec<crate::format::meta::BlockMeta>,
        sums: &[crate::metastore::RecordedSum],
        now_ms: u64,
        delete_after_ms: u64,
    ) -> crate::Result<()> {
        self.count()
            .complete_job_recorded(job, owner, outputs, sums, now_ms, delete_after_ms)
            .await?;
        if self
            .lose_job_answers
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(crate::Error::MetastoreUnavailable(
                "the connection closed before the commit's answer".into(),
            ));
        }
        Ok(())
    }
    async fn recording_tenants(&self) -> crate::Result<Vec<String>> {
        self.count().recording_tenants().await
    }
    async fn recording_sums(
        &self,
        tenant: &str,
        before_ms: i64,
    ) -> crate::Result<Vec<crate::metastore::RecordedSum>> {
        self.count().recording_sums(tenant, before_ms).await
    }
    async fn recording_state(&self, tenant: &str) -> crate::Result<Option<Vec<u8>>> {
        self.count().recording_state(tenant).await
    }
    async fn commit_recording_seal(
        &self,
        fence: &crate::metastore::LeaseFence,
        tenant: &str,
        state: &[u8],
        consumed: &[crate::metastore::RecordedSum],
        points: &[crate::metastore::OutboxPoint],
    ) -> crate::Result<bool> {
        self.count()
            .commit_recording_seal(fence, tenant, state, consumed, points)
            .await
    }
    async fn recording_outbox(
        &self,
        limit: usize,
    ) -> crate::Result<Vec<crate::metastore::OutboxPoint>> {
        self.count().recording_outbox(limit).await
    }
    async fn remove_recording_outbox(&self, seqs: &[i64]) -> crate::Result<()> {
        self.count().remove_recording_outbox(seqs).await
    }
    async fn admit_series(
        &self,
        tenant: &str,
        hashes: &[u64],
        max: usize,
        window: std::time::Duration,
    ) -> crate::Result<bool> {
        self.count().admit_series(tenant, hashes, max, window).await
    }
    async fn touch_series(&self, tenant: &str, hashes: &[u64]) -> crate::Result<()> {
        self.count().touch_series(tenant, hashes).await
    }
    async fn put_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: std::time::Duration,
    ) -> crate::Result<()> {
        self.count().put_session(tenant, key, value, ttl).await
    }
    async fn claim_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: std::time::Duration,
    ) -> crate::Result<bool> {
        self.count().claim_session(tenant, key, value, ttl).await
    }
    async fn get_session(&self, tenant: &str, key: &str) -> crate::Result<Option<Vec<u8>>> {
        self.count().get_session(tenant, key).await
    }
    async fn take_session(&self, tenant: &str, key: &str) -> crate::Result<Option<Vec<u8>>> {
        self.count().take_session(tenant, key).await
    }
    async fn sessions(&self, tenant: &str, prefix: &str) -> crate::Result<Vec<(String, Vec<u8>)>> {
        self.count().sessions(tenant, prefix).await
    }
}

/// The metastore entry of a block that exists only there (no object): the `n`th of `tenant`,
/// one series of service `api`, at `time_nanos`. For tests of what reads the index.
pub fn synthetic_block(tenant: &str, n: u64, time_nanos: i64) -> crate::format::meta::BlockMeta {
    use crate::format::meta::{BLOCK_FORMAT_VERSION, BlockMeta, Section, SeriesMeta};
    let ms = u64::try_from(time_nanos / 1_000_000).unwrap_or(0);
    BlockMeta {
        format_version: BLOCK_FORMAT_VERSION,
        id: ulid::Ulid::from_parts(ms, u128::from(n)).to_string(),
        tenant: tenant.into(),
        shard: 0,
        level: 0,
        min_time_nanos: time_nanos,
        max_time_nanos: time_nanos,
        object_size: 1000,
        samples: Section {
            offset: 0,
            size: 500,
        },
        symbols: Section {
            offset: 500,
            size: 500,
        },
        series: vec![SeriesMeta {
            labels: crate::format::series_labels::SeriesLabels::new([("service_name", "api")]),
            profile_type: CPU.into(),
            min_time_nanos: time_nanos,
            max_time_nanos: time_nanos,
            first_row: 0,
            rows: 1,
        }],
        rows: 1,
        profiles: 1,
        stack_nodes: 1,
        compacted_from: vec![],
        rollups: vec![],
        index: Default::default(),
        logs: Vec::new(),
        received_ms: 0,
    }
}

/// A write-ahead log record for [`RecordsOfText`]: a CPU profile of one stack, as text
/// (`tenant`, `service`, folded stack, value, time in nanoseconds, one per line).
pub fn text_record(
    tenant: &str,
    service: &str,
    stack: &str,
    value: i64,
    time_nanos: i64,
) -> Vec<u8> {
    format!("{tenant}\n{service}\n{stack}\n{value}\n{time_nanos}").into_bytes()
}

/// Decodes [`text_record`]s back into their writes, as the gateway decodes its requests.
#[derive(Debug, Default)]
pub struct RecordsOfText;

impl crate::writer::RecordDecoder for RecordsOfText {
    fn decode(&self, record: &[u8]) -> Result<(String, Vec<NormalizedProfile>), String> {
        let text = std::str::from_utf8(record).map_err(|e| e.to_string())?;
        let f: Vec<&str> = text.split('\n').collect();
        let [tenant, service, stack, value, time] = f[..] else {
            return Err(format!("{} fields, not 5", f.len()));
        };
        let value = value.parse::<i64>().map_err(|e| e.to_string())?;
        let time = time.parse::<i64>().map_err(|e| e.to_string())?;
        Ok((
            tenant.to_owned(),
            vec![profile(service, &[(frames(stack), value)], time)],
        ))
    }
}

/// [`config`] with writes acknowledged from a write-ahead log of [`text_record`]s (in
/// `dir/wal`), a segment cut every `segment_interval`.
pub fn logged_config(dir: &std::path::Path, segment_interval: Duration) -> StorageConfig {
    let mut c = config(dir);
    let mut log = crate::writer::LogConfig::new(dir.join("wal"), Arc::new(RecordsOfText));
    log.segment_interval = segment_interval;
    c.writer.log = Some(log);
    c
}
