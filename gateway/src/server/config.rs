//! `kiln serve`'s flags, in blocks by concern (network, authentication, storage, compaction,
//! limits, telemetry), checked and turned into the storage's and the app's settings; the server
//! runs them (`super::lifecycle`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};
use kiln_storage::StorageConfig;
use kiln_storage::compaction::LevelPolicy;
use tracing::info;

use crate::app::Roles;
use crate::auth::{AuthMode, Authenticator, KeyStore};
use crate::time::parse_duration_secs;
use crate::units;

/// `kiln serve` flags, in blocks by concern. Every flag also reads a `KILN_…` environment
/// variable; `docs/configuration.md` lists them all (a test checks it).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// What this process does: `ingest`, `query`, `compact`, comma-separated (default all).
    /// Processes of any roles can share one `--metastore` (PostgreSQL) and `--object-store`.
    #[arg(long, env = "KILN_ROLES", default_value = "ingest,query,compact")]
    pub roles: String,

    /// This process's name in its cluster (membership, the `instance` label of its own
    /// profiles). Unique per process; default `<hostname>:<port of --listen>`.
    #[arg(long, env = "KILN_INSTANCE_ID")]
    pub instance_id: Option<String>,

    #[command(flatten)]
    pub network: NetworkArgs,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub storage: StorageArgs,

    #[command(flatten)]
    pub compaction: CompactionArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub symbolize: SymbolizeArgs,

    #[command(flatten)]
    pub recording: RecordingArgs,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// A duration flag: `15s`, `1m`, `2h`, `7d` or plain seconds.
fn duration_flag(s: &str) -> Result<std::time::Duration, String> {
    crate::time::parse_duration_secs(s)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("invalid duration {s:?} (like 15s, 1m, 2h, 7d)"))
}

/// `kiln serve` flags: recording rules, metrics from profiles (ADR 0015).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Recording rules")]
pub struct RecordingArgs {
    /// The interval of the rules' series: each series gets one point per interval, the counter
    /// of what was acknowledged before the interval's end.
    #[arg(long, env = "KILN_RECORDING_INTERVAL", default_value = "15s", value_parser = duration_flag)]
    pub recording_interval: std::time::Duration,

    /// How long after its end an interval is sealed: profiles acknowledged later for its
    /// time count in the next interval sealed.
    #[arg(long, env = "KILN_RECORDING_DELAY", default_value = "30s", value_parser = duration_flag)]
    pub recording_delay: std::time::Duration,

    /// How far back a new rule is evaluated from the stored profiles (0s: not at all; at
    /// most 7d). The receiver must accept samples that old.
    #[arg(long, env = "KILN_RECORDING_BACKFILL", default_value = "1h", value_parser = duration_flag)]
    pub recording_backfill: std::time::Duration,

    /// Where the rules' samples go (Prometheus remote write 1.0, the tenant as
    /// `X-Scope-OrgID`) for tenants without a `remote_write_url` in the tenant file.
    #[arg(long, env = "KILN_REMOTE_WRITE_URL")]
    pub remote_write_url: Option<String>,

    /// Bytes of samples kept on disk while the receiver does not take them; past it the
    /// oldest are dropped (and counted).
    #[arg(
        long = "remote-write-queue-size",
        alias = "remote-write-queue-bytes",
        env = "KILN_REMOTE_WRITE_QUEUE_SIZE",
        value_parser = units::bytes,
        default_value = "256MiB"
    )]
    pub remote_write_queue_bytes: u64,
}

impl RecordingArgs {
    /// The evaluation settings.
    pub fn config(&self) -> crate::recording::RecordingConfig {
        crate::recording::RecordingConfig {
            interval: self.recording_interval,
            delay: self.recording_delay,
            remote_write_url: self.remote_write_url.clone().filter(|u| !u.is_empty()),
            backfill: self.recording_backfill,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.recording_interval.is_zero(),
            "--recording-interval must be at least 1s"
        );
        anyhow::ensure!(
            self.recording_backfill <= crate::recording::MAX_BACKFILL,
            "--recording-backfill is at most 7d"
        );
        if let Some(u) = &self.remote_write_url {
            anyhow::ensure!(
                u.is_empty() || u.starts_with("http://") || u.starts_with("https://"),
                "--remote-write-url must be an http:// or https:// URL"
            );
        }
        Ok(())
    }
}

/// `kiln serve` flags: naming native frames from debug files (ADR 0013).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Symbolization")]
pub struct SymbolizeArgs {
    /// A debuginfod server for build ids no upload covers (repeatable; asked in order). Kiln
    /// also reads `DEBUGINFOD_URLS` (space-separated), as elfutils' tools do.
    #[arg(
        long = "debuginfod-url",
        env = "KILN_DEBUGINFOD_URL",
        value_delimiter = ','
    )]
    pub debuginfod_urls: Vec<String>,

    /// One fetch from debuginfod, retries included; past it the fetch fails and is tried again
    /// after `--debuginfod-retry-after`.
    #[arg(
        long = "debuginfod-timeout",
        alias = "debuginfod-timeout-secs",
        env = "KILN_DEBUGINFOD_TIMEOUT",
        value_parser = units::secs,
        default_value = "2m"
    )]
    pub debuginfod_timeout_secs: u64,

    /// Fetches from debuginfod at once.
    #[arg(long, env = "KILN_DEBUGINFOD_CONCURRENCY", default_value_t = 4)]
    pub debuginfod_concurrency: usize,

    /// Fetches from debuginfod at once for one tenant's queries; more of that tenant's wait
    /// without holding a fetch of the process.
    #[arg(long, env = "KILN_DEBUGINFOD_TENANT_CONCURRENCY", default_value_t = 2)]
    pub debuginfod_tenant_concurrency: usize,

    /// How long a build id no server has is remembered as missing.
    #[arg(
        long = "debuginfod-missing-ttl",
        alias = "debuginfod-missing-ttl-secs",
        env = "KILN_DEBUGINFOD_MISSING_TTL",
        value_parser = units::secs,
        default_value = "1h"
    )]
    pub debuginfod_missing_ttl_secs: u64,

    /// How long after a failed fetch (no answer, 5xx) the servers are asked again.
    #[arg(
        long = "debuginfod-retry-after",
        alias = "debuginfod-retry-after-secs",
        env = "KILN_DEBUGINFOD_RETRY_AFTER",
        value_parser = units::secs,
        default_value = "30s"
    )]
    pub debuginfod_retry_after_secs: u64,

    /// Largest file fetched from debuginfod.
    #[arg(
        long = "debuginfod-max-file-size",
        alias = "debuginfod-max-file-bytes",
        env = "KILN_DEBUGINFOD_MAX_FILE_SIZE",
        value_parser = units::bytes,
        default_value = "4GiB"
    )]
    pub debuginfod_max_file_bytes: u64,

    /// Bytes of debuginfod's files the object store keeps for the cluster. Past it, one
    /// compacting process removes the least recently used at each retention round; a file
    /// removed is fetched again when a query asks for it. 0: no bound.
    #[arg(
        long = "debuginfod-stored-size",
        env = "KILN_DEBUGINFOD_STORED_SIZE",
        value_parser = units::bytes,
        default_value = "20GiB"
    )]
    pub debuginfod_max_stored_bytes: u64,

    /// How long a query waits for debug files (debuginfod) before it answers with the frames it
    /// could name and a `kiln-warning`.
    #[arg(
        long = "symbolize-deadline",
        alias = "symbolize-deadline-ms",
        env = "KILN_SYMBOLIZE_DEADLINE",
        value_parser = units::millis,
        default_value = "2s"
    )]
    pub symbolize_deadline_ms: u64,

    /// Local copies of debug files from a remote object store, to map (default: under the
    /// data directory). Emptied at start-up.
    #[arg(long, env = "KILN_SYMBOLIZER_CACHE_DIR")]
    pub symbolizer_cache_dir: Option<PathBuf>,

    /// Bytes of local copies kept; the least recently used go past it.
    #[arg(
        long = "symbolizer-cache-size",
        alias = "symbolizer-cache-bytes",
        env = "KILN_SYMBOLIZER_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "8GiB"
    )]
    pub symbolizer_cache_bytes: u64,

    /// Bytes of debug files kept open (mapped), by their size.
    #[arg(
        long = "symbolizer-open-size",
        alias = "symbolizer-open-bytes",
        env = "KILN_SYMBOLIZER_OPEN_SIZE",
        value_parser = units::bytes,
        default_value = "8GiB"
    )]
    pub symbolizer_open_bytes: u64,

    /// Bytes of named addresses remembered, so a frame is looked up once.
    #[arg(
        long = "symbolizer-resolved-size",
        alias = "symbolizer-resolved-bytes",
        env = "KILN_SYMBOLIZER_RESOLVED_SIZE",
        value_parser = units::bytes,
        default_value = "256MiB"
    )]
    pub symbolizer_resolved_bytes: u64,

    /// Bytes one debug file's compressed sections may inflate to when a query or a debuginfod
    /// fetch opens it (within 32 times its size); a larger one names nothing.
    #[arg(
        long = "symbolizer-max-inflated-size",
        alias = "symbolizer-max-inflated-bytes",
        env = "KILN_SYMBOLIZER_MAX_INFLATED_SIZE",
        value_parser = units::bytes,
        default_value = "512MiB"
    )]
    pub symbolizer_max_inflated_bytes: u64,
}

impl SymbolizeArgs {
    /// The symbolizer's settings, `data_dir` the storage's.
    pub fn config(&self, data_dir: &std::path::Path) -> kiln_symbolize::SymbolizerConfig {
        let mut urls = self.debuginfod_urls.clone();
        // elfutils' variable, space-separated, after Kiln's own flags.
        if let Ok(env) = std::env::var("DEBUGINFOD_URLS") {
            urls.extend(env.split_whitespace().map(str::to_owned));
        }
        urls.retain(|u| !u.trim().is_empty());
        urls.dedup();
        let cache_dir = self
            .symbolizer_cache_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("debuginfo-cache"));
        kiln_symbolize::SymbolizerConfig {
            debuginfod: kiln_symbolize::debuginfod::DebuginfodConfig {
                urls,
                timeout: std::time::Duration::from_secs(self.debuginfod_timeout_secs.max(1)),
                concurrency: self.debuginfod_concurrency.max(1),
                tenant_concurrency: self.debuginfod_tenant_concurrency.max(1),
                missing_ttl: std::time::Duration::from_secs(self.debuginfod_missing_ttl_secs),
                retry_after: std::time::Duration::from_secs(self.debuginfod_retry_after_secs),
                max_file_bytes: self.debuginfod_max_file_bytes,
                max_stored_bytes: self.debuginfod_max_stored_bytes,
                attempts: 3,
                scratch_dir: cache_dir.join("incoming"),
            },
            cache_dir: cache_dir.join("copies"),
            cache_bytes: self.symbolizer_cache_bytes,
            open_bytes: self.symbolizer_open_bytes,
            resolved_bytes: self.symbolizer_resolved_bytes,
            max_inflated_bytes: self.symbolizer_max_inflated_bytes,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        for u in &self.debuginfod_urls {
            anyhow::ensure!(
                u.starts_with("http://") || u.starts_with("https://"),
                "--debuginfod-url {u:?}: give a URL, e.g. https://debuginfod.elfutils.org"
            );
        }
        Ok(())
    }

    /// How long a query waits for debug files.
    pub fn deadline(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.symbolize_deadline_ms)
    }
}

/// Whether `--tls-client-ca` requires a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientAuth {
    Required,
    Optional,
}

/// `kiln serve` flags: where Kiln listens and how long it waits for clients.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Network")]
pub struct NetworkArgs {
    /// Address to listen on, HTTP/1.1 and h2c (gRPC) on one port.
    #[arg(long, env = "KILN_LISTEN", default_value = "127.0.0.1:4040")]
    pub listen: SocketAddr,

    /// Browser origins (`https://parca.example.com`, or `*`) that may call Kiln's APIs from
    /// another site, as the Parca UI does over gRPC-Web: CORS answers for them. Unset: none.
    #[arg(long, env = "KILN_CORS_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub cors_allowed_origins: Vec<String>,

    /// A second address serving only `/metrics` and `/ready`, without credentials, for a
    /// network only operators reach. With `--auth jwt`, `/metrics` on `--listen` needs an admin
    /// token of `--admin-tenant`, as its label values name every tenant.
    #[arg(long, env = "KILN_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,

    /// Seconds a client has to send a request's headers (HTTP/1.1); a kept-alive connection
    /// with no next request is closed after as long.
    #[arg(
        long = "header-read-timeout",
        alias = "header-read-timeout-secs",
        env = "KILN_HEADER_READ_TIMEOUT",
        value_parser = units::secs,
        default_value = "30s"
    )]
    pub header_read_timeout_secs: u64,

    /// Longest pause, in seconds, while a request body arrives; then 408.
    #[arg(
        long = "body-read-timeout",
        alias = "body-read-timeout-secs",
        env = "KILN_BODY_READ_TIMEOUT",
        value_parser = units::secs,
        default_value = "30s"
    )]
    pub body_read_timeout_secs: u64,

    /// Seconds after which a connection that moves no byte either way is closed.
    #[arg(
        long = "idle-timeout",
        alias = "idle-timeout-secs",
        env = "KILN_IDLE_TIMEOUT",
        value_parser = units::secs,
        default_value = "90s"
    )]
    pub idle_timeout_secs: u64,

    /// Connections open at once; further ones are closed as soon as they are accepted.
    #[arg(long, env = "KILN_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// How long, after SIGTERM, `/ready` answers 503 while requests are still served, so a
    /// load balancer stops sending before the port closes (5s behind one).
    #[arg(
        long,
        env = "KILN_SHUTDOWN_DELAY",
        value_parser = units::millis,
        default_value = "0s"
    )]
    pub shutdown_delay: u64,

    /// A PEM certificate chain: `--listen` then serves TLS only (HTTP/1.1 and h2 by ALPN, gRPC
    /// included), with `--tls-key`. Both files are read again when they change (each second)
    /// and on SIGHUP; connections open keep their certificate.
    #[arg(long, env = "KILN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "KILN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates that clients' certificates must chain to (mutual TLS, as the Parca
    /// agent offers it). Tokens and tenants are checked as without it.
    #[arg(long, env = "KILN_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// With `--tls-client-ca`: `required` (a connection without a valid client certificate is
    /// refused) or `optional` (one that presents a certificate must present a valid one).
    #[arg(
        long,
        env = "KILN_TLS_CLIENT_AUTH",
        value_enum,
        default_value = "required"
    )]
    pub tls_client_auth: ClientAuth,
}

/// `kiln serve` flags: who may call Kiln, and as which tenant.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthArgs {
    /// Authentication: `none` (one tenant, `anonymous`; loopback only), `jwt` (Bearer or Basic
    /// tokens, keys from --jwt-keys), or `trusted-header` (`X-Scope-OrgID` from a proxy).
    #[arg(long = "auth", env = "KILN_AUTH", value_enum, default_value = "none")]
    pub mode: AuthMode,

    /// Allow `--auth none` on a non-loopback address (anyone who can connect is `anonymous`).
    #[arg(long, env = "KILN_INSECURE_ALLOW_ANONYMOUS")]
    pub insecure_allow_anonymous: bool,

    /// JWT verification keys: a key file, a directory of key files, or a JWKS file. Reloaded on
    /// change and on SIGHUP.
    #[arg(long, env = "KILN_JWT_KEYS")]
    pub jwt_keys: Option<PathBuf>,

    /// Required `iss` claim, when set.
    #[arg(long, env = "KILN_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// Required `aud` claim, when set.
    #[arg(long, env = "KILN_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// The operator tenant: its admin tokens administer every tenant (others only their own).
    #[arg(long, env = "KILN_ADMIN_TENANT")]
    pub admin_tenant: Option<String>,
}

/// `kiln serve` flags: where data lives and how writes reach it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Storage")]
pub struct StorageArgs {
    /// Directory for the local object store and the embedded metastore (when they are not
    /// elsewhere) and for compaction's scratch files.
    #[arg(long, env = "KILN_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// The metastore: `postgres://user:password@host:port/database` (shared by several
    /// processes; the schema is migrated at start-up), or a path for the embedded one.
    /// Default: embedded, under the data directory.
    #[arg(long, env = "KILN_METASTORE")]
    pub metastore: Option<String>,

    /// Connections to a PostgreSQL metastore this process opens at most. PostgreSQL's default
    /// `max_connections` (100) covers six processes at the default.
    #[arg(long, env = "KILN_METASTORE_MAX_CONNECTIONS", default_value_t = 16)]
    pub metastore_max_connections: usize,

    /// The object store: `s3://bucket/prefix` (any S3-compatible endpoint), `gs://bucket/prefix`,
    /// `az://container/prefix`, or a path. Credentials and endpoints come from `object_store`'s
    /// environment variables (`AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `AWS_ACCESS_KEY_ID`, …),
    /// each also settable as `KILN_…`. Default: the data directory.
    #[arg(long, env = "KILN_OBJECT_STORE")]
    pub object_store: Option<String>,

    /// Seconds a failing request to a remote object store is retried (with backoff) before the
    /// write or query fails with 503.
    #[arg(
        long,
        env = "KILN_OBJECT_STORE_RETRY_TIMEOUT_SECS",
        default_value_t = 10
    )]
    pub object_store_retry_timeout_secs: u64,

    /// Bytes of acknowledged segments the spool (`<data-dir>/spool`) may hold while the object
    /// store is unreachable; they go to the store when it answers again. Past it, writes are
    /// refused with 503. 0: no spool.
    #[arg(
        long = "spool-max-size",
        alias = "spool-max-bytes",
        env = "KILN_SPOOL_MAX_SIZE",
        value_parser = units::bytes,
        default_value = "1GiB"
    )]
    pub spool_max_bytes: u64,

    /// Number of write shards. Each shard adds its writes and flushes its segments one at a
    /// time. Default: 1, where fuller segments cost less to write and compact than two
    /// half-full ones; 2 on a remote object store with `--ack-from store`, where each
    /// acknowledgement waits a PUT's round trip and two shards keep two flushes in flight; never
    /// fewer than the write-ahead log holds records of.
    #[arg(long, env = "KILN_SHARDS")]
    pub shards: Option<u32>,

    /// Where a write is acknowledged from (ADR 0018). `log`: once its request is in the
    /// write-ahead log (`<data-dir>/wal`, one fdatasync per group of writes), its profiles cut
    /// into a segment every `--segment-interval` and the log's records replayed at start
    /// after a crash; `store`: once the segment holding it is in the object store and the
    /// metastore. Default: `log` on the local file system (the log shares the objects' disk),
    /// `store` on a remote object store (where the spool takes over while the store is down).
    /// JFR, speedscope, folded text, Parca's writes and bodies past 4 MiB are acknowledged from
    /// the store either way.
    #[arg(long, env = "KILN_ACK_FROM", value_enum)]
    pub ack_from: Option<AckFrom>,

    /// With `--ack-from log`: how often, in milliseconds, a shard cuts a segment of the writes
    /// it acknowledged from the log (sooner at `--flush-size`, or when a query in this process
    /// needs them). With N live ingest processes each cuts every N intervals, at most 5 s, so
    /// the cluster cuts as often as one process.
    #[arg(
        long = "segment-interval",
        alias = "segment-interval-ms",
        env = "KILN_SEGMENT_INTERVAL",
        value_parser = units::millis,
        default_value = "1s"
    )]
    pub segment_interval_ms: u64,

    /// With `--ack-from log`: how long, in milliseconds, a group of log records waits for the
    /// writes being decoded meanwhile before one fdatasync appends them; a lone write is
    /// appended at once. 0: a group is appended as soon as no write waits in the shard's queue.
    #[arg(
        long = "log-group-linger",
        alias = "log-group-linger-ms",
        env = "KILN_LOG_GROUP_LINGER",
        value_parser = units::millis,
        default_value = "2ms"
    )]
    pub log_group_linger_ms: u64,

    /// Longest time, in milliseconds, a write waits for others to share its segment; writes
    /// that arrive during a flush are flushed together right after it (group commit). With
    /// `--ack-from log`, for writes of the formats not logged.
    #[arg(
        long = "flush-interval",
        alias = "flush-interval-ms",
        env = "KILN_FLUSH_INTERVAL",
        value_parser = units::millis,
        default_value = "50ms"
    )]
    pub flush_interval_ms: u64,

    /// A shard flushes as soon as its buffer passes this many bytes.
    #[arg(
        long = "flush-size",
        alias = "flush-bytes",
        env = "KILN_FLUSH_SIZE",
        value_parser = units::size,
        default_value = "32MiB"
    )]
    pub flush_bytes: usize,

    /// After a flush, how long, in milliseconds, a shard waits for another write before it
    /// flushes the writes gathered meanwhile (at most the flush interval): the senders a flush
    /// answered share the next segment instead of waiting out a new interval. 0 flushes what
    /// queued during the flush at once. Also the shortest pause in the writes that flushes a
    /// batch early, where writes come fast (six of their mean gaps below the flush interval).
    #[arg(
        long = "flush-linger",
        alias = "flush-linger-ms",
        env = "KILN_FLUSH_LINGER",
        value_parser = units::millis,
        default_value = "3ms"
    )]
    pub flush_linger_ms: u64,

    /// Memory for cached symbol tables, in bytes.
    #[arg(
        long = "symbols-cache-size",
        alias = "symbols-cache-bytes",
        env = "KILN_SYMBOLS_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "256MiB"
    )]
    pub symbols_cache_bytes: u64,

    /// Memory for cached partial results (the stack totals of blocks a query's range covers
    /// whole), in bytes; 0 keeps none.
    #[arg(
        long = "results-cache-size",
        alias = "results-cache-bytes",
        env = "KILN_RESULTS_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "64MiB"
    )]
    pub results_cache_bytes: u64,

    /// Memory for the byte ranges queries read from a remote object store (S3, GCS, Azure),
    /// in bytes; 0 keeps none. The local file system's are the OS page cache's.
    #[arg(
        long = "pages-cache-size",
        alias = "pages-cache-bytes",
        env = "KILN_PAGES_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "128MiB"
    )]
    pub pages_cache_bytes: u64,

    /// Memory for the objects of fresh segments, kept as they were written so that queries of
    /// the last minutes read their pages from memory, in bytes; 0 keeps none. Only where the
    /// process has the query role.
    #[arg(
        long = "fresh-cache-size",
        alias = "fresh-cache-bytes",
        env = "KILN_FRESH_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "64MiB"
    )]
    pub fresh_cache_bytes: u64,

    /// Freed memory the allocator may hold for reuse, in bytes: past it, Kiln returns all of it
    /// to the system at once rather than over jemalloc's 10 s decay (checked every 100 ms); 0
    /// leaves it to jemalloc.
    #[arg(
        long = "allocator-dirty-size",
        alias = "allocator-dirty-bytes",
        env = "KILN_ALLOCATOR_DIRTY_SIZE",
        value_parser = units::bytes,
        default_value = "128MiB"
    )]
    pub allocator_dirty_bytes: u64,
}

/// `kiln serve` flags: background upkeep of the stored blocks.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Compaction and retention")]
pub struct CompactionArgs {
    /// Compact blocks in the background (levels merged by count and age).
    #[arg(
        long = "compaction", env = "KILN_COMPACTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// When each level is merged into the next, as `blocks:age` per level from L0: merge as soon
    /// as `blocks` wait, or what waits once the oldest is `age` old (`s`, `m`, `h`, `d`).
    #[arg(
        long,
        env = "KILN_COMPACTION_LEVELS",
        default_value = "20:30s,10:12m,10:3h"
    )]
    pub compaction_levels: String,

    /// Size, in MiB, up to which top-level blocks of a tenant's partition and shard keep
    /// merging with each other (`--compaction-top-fanout` of a size tier at a time).
    #[arg(
        long = "compaction-target-size",
        alias = "compaction-target-mib",
        env = "KILN_COMPACTION_TARGET_SIZE",
        value_parser = units::mib,
        default_value = "256MiB"
    )]
    pub compaction_target_mib: u64,

    /// Top-level blocks of one size tier merged at once (each tier's bound this many times the
    /// one below): a row is rewritten about log_fanout(target ÷ 1 MiB) times at the top level,
    /// and an open partition holds up to fanout − 1 blocks per tier.
    #[arg(long, env = "KILN_COMPACTION_TOP_FANOUT", default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..=64))]
    pub compaction_top_fanout: u64,

    /// How long after a partition's newest block (of any level) came, its blocks below the
    /// target are packed together, a lone L1 or L2 block with them (until then top-level blocks
    /// merge by size tier).
    #[arg(long, env = "KILN_COMPACTION_TOP_AGE", default_value = "1h", value_parser = duration_flag)]
    pub compaction_top_age: std::time::Duration,

    /// How often compaction and the deletion of tombstoned objects run, in milliseconds.
    #[arg(
        long = "upkeep-interval",
        alias = "upkeep-interval-ms",
        env = "KILN_UPKEEP_INTERVAL",
        value_parser = units::millis,
        default_value = "1s"
    )]
    pub upkeep_interval_ms: u64,

    /// Seconds an object that lost its last index entry stays readable before deletion.
    #[arg(
        long = "delete-delay",
        alias = "delete-delay-secs",
        env = "KILN_DELETE_DELAY",
        value_parser = units::secs,
        default_value = "1m"
    )]
    pub delete_delay_secs: u64,

    /// Seconds before an object no index entry names (left by a crash) is deleted.
    #[arg(
        long = "orphan-grace",
        alias = "orphan-grace-secs",
        env = "KILN_ORPHAN_GRACE",
        value_parser = units::secs,
        default_value = "1h"
    )]
    pub orphan_grace_secs: u64,

    /// How often the orphan sweep runs, in seconds (also once at start-up).
    #[arg(
        long = "orphan-sweep-interval",
        alias = "orphan-sweep-interval-secs",
        env = "KILN_ORPHAN_SWEEP_INTERVAL",
        value_parser = units::secs,
        default_value = "10m"
    )]
    pub orphan_sweep_interval_secs: u64,

    /// How often retention runs, in seconds.
    #[arg(
        long = "retention-interval",
        alias = "retention-interval-secs",
        env = "KILN_RETENTION_INTERVAL",
        value_parser = units::secs,
        default_value = "5m"
    )]
    pub retention_interval_secs: u64,
}

/// `kiln serve` flags: defaults of the per-tenant limits, and process-wide bounds.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Per-tenant limits (TOML: [defaults] and [tenants.<id>]). Reloaded on change and on SIGHUP.
    #[arg(long, env = "KILN_TENANTS")]
    pub tenants: Option<PathBuf>,

    /// Default largest request body, as sent (413 above it); overrides the tenant file's [defaults].
    #[arg(
        long = "max-body-size",
        alias = "max-body-bytes",
        env = "KILN_MAX_BODY_SIZE",
        value_parser = units::size
    )]
    pub max_body_bytes: Option<usize>,

    /// Default largest profile once decompressed (413 above it); overrides [defaults].
    #[arg(
        long = "max-decompressed-size",
        alias = "max-decompressed-bytes",
        env = "KILN_MAX_DECOMPRESSED_SIZE",
        value_parser = units::size
    )]
    pub max_decompressed_bytes: Option<usize>,

    /// Default stack depth: deeper stacks are truncated, keeping the root side; overrides [defaults].
    #[arg(long, env = "KILN_MAX_STACK_DEPTH")]
    pub max_stack_depth: Option<usize>,

    /// Default ingest rate in decompressed bytes per second (0 = unlimited); overrides [defaults].
    #[arg(
        long = "ingest-rate",
        alias = "ingest-rate-bytes",
        env = "KILN_INGEST_RATE",
        value_parser = units::bytes
    )]
    pub ingest_rate_bytes: Option<u64>,

    /// Decoded bytes all ingest requests may hold at once (inflated and decoded profiles until
    /// they are stored); a request that finds it spent waits 2 s, then is answered 503 with
    /// `Retry-After`. 0 = unbounded.
    #[arg(
        long = "max-inflight-decode-size",
        alias = "max-inflight-decode-bytes",
        env = "KILN_MAX_INFLIGHT_DECODE_SIZE",
        value_parser = units::size,
        default_value = "256MiB"
    )]
    pub max_inflight_decode_bytes: usize,

    /// Default largest debug file one upload may be (413 above it); overrides [defaults].
    #[arg(
        long = "max-debuginfo-file-size",
        alias = "max-debuginfo-file-bytes",
        env = "KILN_MAX_DEBUGINFO_FILE_SIZE",
        value_parser = units::bytes
    )]
    pub max_debuginfo_file_bytes: Option<u64>,

    /// Default bytes one uploaded debug file's compressed sections may inflate to (413 above
    /// it, before anything is inflated); overrides [defaults].
    #[arg(
        long = "max-debuginfo-inflated-size",
        alias = "max-debuginfo-inflated-bytes",
        env = "KILN_MAX_DEBUGINFO_INFLATED_SIZE",
        value_parser = units::bytes
    )]
    pub max_debuginfo_inflated_bytes: Option<u64>,

    /// Debug-file uploads of all tenants this process runs at once; one more waits 10 s, then
    /// is answered 503 (a tenant's own bound is `max_debuginfo_uploads`).
    #[arg(long, env = "KILN_DEBUGINFO_UPLOAD_CONCURRENCY", default_value_t = crate::app::uploads::DEFAULT_UPLOAD_CONCURRENCY)]
    pub debuginfo_upload_concurrency: usize,

    /// Bytes a second this process reads of all its debug-file uploads together; a faster
    /// sender is held back (0 = unpaced).
    #[arg(
        long = "debuginfo-upload-rate",
        alias = "debuginfo-upload-rate-bytes",
        env = "KILN_DEBUGINFO_UPLOAD_RATE",
        value_parser = units::bytes,
        default_value = "16MiB"
    )]
    pub debuginfo_upload_rate_bytes: u64,

    /// Disk the debug-file uploads under way in this process may fill with their temporary
    /// files (`<data-dir>/debuginfo-incoming`), so uploads cannot fill the write-ahead log's
    /// disk; an upload past it is answered 503.
    #[arg(
        long = "debuginfo-scratch-size",
        env = "KILN_DEBUGINFO_SCRATCH_SIZE",
        value_parser = units::bytes,
        default_value = "4GiB"
    )]
    pub debuginfo_scratch_bytes: u64,

    /// Bytes of stacks the Parca `Write` stream remembers, over all tenants, so an agent sends
    /// each stack once; past it the least used are forgotten and asked for again. 0 = none.
    #[arg(
        long = "parca-stack-cache-size",
        alias = "parca-stack-cache-bytes",
        env = "KILN_PARCA_STACK_CACHE_SIZE",
        value_parser = units::bytes,
        default_value = "128MiB"
    )]
    pub parca_stack_cache_bytes: u64,
}

/// `kiln serve` flags: how Kiln observes itself: logs, traces, its own profiles.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryArgs {
    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "KILN_LOG", default_value = "info")]
    pub log: String,

    /// Kiln samples its own CPU and writes it, every `--self-profile-interval`, as
    /// `service_name="kiln"` into `--self-profile-tenant` (`false` turns it off).
    #[arg(long, env = "KILN_SELF_PROFILE", default_value_t = true, action = clap::ArgAction::Set)]
    pub self_profile: bool,

    /// The tenant Kiln's own profiles go to (by default the one `--auth none` serves).
    #[arg(long, env = "KILN_SELF_PROFILE_TENANT", default_value = crate::auth::ANONYMOUS)]
    pub self_profile_tenant: String,

    /// Seconds of samples in each of Kiln's own profiles.
    #[arg(
        long = "self-profile-interval",
        alias = "self-profile-interval-secs",
        env = "KILN_SELF_PROFILE_INTERVAL",
        value_parser = units::secs,
        default_value = "10s"
    )]
    pub self_profile_interval_secs: u64,

    /// Kiln's own profiles also sample its heap (jemalloc's profiler: in-use bytes and objects
    /// of live allocations, one in every 512 KiB allocated on average).
    #[arg(long, env = "KILN_SELF_PROFILE_HEAP", default_value_t = true, action = clap::ArgAction::Set)]
    pub self_profile_heap: bool,

    /// Export Kiln's own tracing spans (requests, flushes, compactions, queries) over OTLP/gRPC
    /// to this collector, e.g. `http://127.0.0.1:4317`, as `service.name=kiln`.
    #[arg(long, env = "KILN_OTLP_TRACES_ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,
}

impl Default for ServeArgs {
    fn default() -> Self {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        Wrapper::parse_from(["kiln"]).args
    }
}

impl ServeArgs {
    /// Checks values clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.roles()?;
        self.compaction.levels()?;
        self.storage_config().validate()?;
        self.storage.validate()?;
        self.auth.validate(self.network.listen)?;
        self.symbolize.validate()?;
        self.recording.validate()?;
        self.telemetry.validate()
    }

    /// This process's instance id: `--instance-id`, or `<hostname>:<port>`.
    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok())
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into());
            format!("{host}:{}", self.network.listen.port())
        })
    }

    /// The roles of `--roles`.
    pub fn roles(&self) -> anyhow::Result<Roles> {
        Roles::parse(&self.roles).map_err(|e| anyhow::anyhow!("--roles: {e}"))
    }

    /// Storage settings from these flags.
    pub fn storage_config(&self) -> StorageConfig {
        let s = &self.storage;
        let mut c = StorageConfig::new(&s.data_dir);
        c.metastore = s.metastore.clone();
        c.metastore_max_connections = s.metastore_max_connections;
        c.object_store = s.object_store.clone();
        c.object_store_retry_timeout = Duration::from_secs(s.object_store_retry_timeout_secs);
        c.spool_max_bytes = s.spool_max_bytes;
        c.writer.shards = s.shards.unwrap_or_else(|| {
            let logged = s.ack_from() == AckFrom::Log;
            let held = kiln_storage::writer::log_shards(&s.data_dir.join("wal"));
            default_shards(s.object_store.as_deref(), logged).max(held)
        });
        c.writer.flush_interval = Duration::from_millis(s.flush_interval_ms);
        c.writer.flush_bytes = s.flush_bytes;
        c.writer.flush_linger = Duration::from_millis(s.flush_linger_ms);
        // Only where this process writes.
        if s.ack_from() == AckFrom::Log && self.roles().is_ok_and(|r| r.ingest) {
            let mut log = kiln_storage::writer::LogConfig::new(
                s.data_dir.join("wal"),
                crate::app::wal::Records::decoder(),
            );
            log.segment_interval = Duration::from_millis(s.segment_interval_ms.max(1));
            log.group_linger = Duration::from_millis(s.log_group_linger_ms);
            c.writer.log = Some(log);
        }
        c.symbols_cache_bytes = s.symbols_cache_bytes;
        c.results_cache_bytes = s.results_cache_bytes;
        c.pages_cache_bytes = s.pages_cache_bytes;
        c.fresh_cache_bytes = s.fresh_cache_bytes;
        c.warm_query_cache = self.roles().is_ok_and(|r| r.query);
        let compaction = &self.compaction;
        c.compaction.enabled = compaction.enabled && self.roles().is_ok_and(|r| r.compact);
        if let Ok(levels) = compaction.levels() {
            c.compaction.levels = levels;
        }
        c.compaction.top.target_bytes = compaction.compaction_target_mib.saturating_mul(1 << 20);
        c.compaction.top.age = compaction.compaction_top_age;
        c.compaction.top.fanout = compaction.compaction_top_fanout as usize;
        c.delete_delay = Duration::from_secs(compaction.delete_delay_secs);
        c.orphan_grace = Duration::from_secs(compaction.orphan_grace_secs);
        c
    }
}

/// Where writes are acknowledged from (`--ack-from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AckFrom {
    /// The write-ahead log.
    Log,
    /// The object store and the metastore (the segment).
    Store,
}

impl StorageArgs {
    /// `--ack-from`, or its default for the object store.
    pub fn ack_from(&self) -> AckFrom {
        self.ack_from.unwrap_or_else(|| {
            if self
                .object_store
                .as_deref()
                .is_some_and(kiln_storage::store::is_remote_url)
            {
                AckFrom::Store
            } else {
                AckFrom::Log
            }
        })
    }
}

/// Write shards when `--shards` is not given (and the log holds records of no more): one on
/// the local file system (or in memory), or wherever writes are acknowledged from the log; two
/// on a remote object store (any other URL scheme) with acknowledgements from the store. A
/// shard flushes one segment at a time. On the local file system a flush is CPU and an fsync,
/// and one shard's fuller segments cost less (`kiln bench --preset small`: 0.93× the server
/// CPU of two). Against a remote store a flush waits a PUT and a PostgreSQL commit: one shard
/// gave 0.76× the profiles a second of two at 32 requests in flight when acknowledgements wait
/// for the flush (`--scaled-out`; docs/performance.md, "Write shards"). Acknowledged from the
/// log, they do not wait, and one shard's segments cost less (three ingest processes: 0.88×
/// the embedded process's ingest a busy core with one, 0.74× with two).
fn default_shards(object_store: Option<&str>, logged: bool) -> u32 {
    if !logged && object_store.is_some_and(kiln_storage::store::is_remote_url) {
        2
    } else {
        1
    }
}

impl StorageArgs {
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.shards != Some(0), "--shards must be at least 1");
        anyhow::ensure!(
            self.flush_interval_ms > 0,
            "--flush-interval-ms must be positive"
        );
        Ok(())
    }
}

impl CompactionArgs {
    /// The compaction policies of `--compaction-levels`.
    pub fn levels(&self) -> anyhow::Result<Vec<LevelPolicy>> {
        self.compaction_levels
            .split(',')
            .map(|level| {
                let (blocks, age) = level.trim().split_once(':').ok_or_else(|| {
                    anyhow::anyhow!("--compaction-levels: {level:?} is not blocks:age")
                })?;
                let blocks: usize = blocks.parse().map_err(|_| {
                    anyhow::anyhow!("--compaction-levels: {blocks:?} is not a block count")
                })?;
                let age = parse_duration_secs(age).ok_or_else(|| {
                    anyhow::anyhow!("--compaction-levels: {age:?} is not a duration")
                })?;
                Ok(LevelPolicy {
                    blocks,
                    age: Duration::from_secs(age),
                })
            })
            .collect()
    }
}

impl AuthArgs {
    fn validate(&self, listen: SocketAddr) -> anyhow::Result<()> {
        if self.mode == AuthMode::None
            && !listen.ip().is_loopback()
            && !self.insecure_allow_anonymous
        {
            anyhow::bail!(
                "--auth none on {listen}: anyone who can reach it would read and write as \
                 `anonymous`; listen on a loopback address, use --auth jwt or trusted-header, or \
                 pass --insecure-allow-anonymous"
            );
        }
        if self.mode == AuthMode::Jwt {
            anyhow::ensure!(
                self.jwt_keys.is_some(),
                "--auth jwt needs --jwt-keys (a key file, a directory or a JWKS file)"
            );
        }
        Ok(())
    }

    /// The authenticator these flags describe (JWT keys are read now).
    pub fn authenticator(&self) -> anyhow::Result<Authenticator> {
        Ok(match self.mode {
            AuthMode::None => Authenticator::none(),
            // The operator's header value reads /metrics (`api::ops`).
            AuthMode::TrustedHeader => Authenticator {
                admin_tenant: self.admin_tenant.clone(),
                ..Authenticator::trusted_header()
            },
            AuthMode::Jwt => {
                let path = self
                    .jwt_keys
                    .as_ref()
                    .ok_or_else(|| anyhow::anyhow!("--auth jwt needs --jwt-keys"))?;
                let keys = KeyStore::open(path)?;
                info!(keys = keys.keys().len(), path = %path.display(), "JWT keys loaded");
                Authenticator {
                    mode: AuthMode::Jwt,
                    keys: Some(keys),
                    issuer: self.jwt_issuer.clone(),
                    audience: self.jwt_audience.clone(),
                    admin_tenant: self.admin_tenant.clone(),
                }
            }
        })
    }
}

impl LimitArgs {
    /// Command-line limits, which override the tenant file's [defaults].
    pub fn overrides(&self) -> toml::Table {
        let mut t = toml::Table::new();
        let mut set = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                t.insert(k.into(), toml::Value::Integer(v as i64));
            }
        };
        set("max_body_bytes", self.max_body_bytes.map(|v| v as u64));
        set(
            "max_decompressed_bytes",
            self.max_decompressed_bytes.map(|v| v as u64),
        );
        set("max_stack_depth", self.max_stack_depth.map(|v| v as u64));
        set("ingest_rate_bytes", self.ingest_rate_bytes);
        set("max_debuginfo_file_bytes", self.max_debuginfo_file_bytes);
        set(
            "max_debuginfo_inflated_bytes",
            self.max_debuginfo_inflated_bytes,
        );
        t
    }
}

impl TelemetryArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if let Some(endpoint) = &self.otlp_traces_endpoint {
            anyhow::ensure!(
                endpoint.starts_with("http://") || endpoint.starts_with("https://"),
                "--otlp-traces-endpoint {endpoint:?}: give a URL, e.g. http://127.0.0.1:4317"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn every_serve_flag_is_documented_with_its_environment_variable() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
        )
        .expect("docs/configuration.md");
        let command = Wrapper::command();
        let mut flags = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            flags += 1;
            assert!(
                doc.contains(&format!("| `--{long}")),
                "--{long} is missing from docs/configuration.md"
            );
            let env = arg
                .get_env()
                .expect("every flag reads an environment variable");
            assert!(
                doc.contains(&format!("`{}`", env.to_string_lossy())),
                "{env:?} (--{long}) is missing from docs/configuration.md"
            );
        }
        assert!(flags > 40, "only {flags} flags found");
    }

    #[test]
    fn flags_land_in_their_blocks() {
        let args = Wrapper::parse_from([
            "kiln",
            "--auth",
            "trusted-header",
            "--compaction",
            "false",
            "--shards",
            "3",
            "--otlp-traces-endpoint",
            "http://127.0.0.1:4317",
        ])
        .args;
        assert_eq!(args.auth.mode, AuthMode::TrustedHeader);
        assert!(!args.compaction.enabled);
        assert_eq!(args.storage_config().writer.shards, 3);
        let shards = |argv: &[&str]| {
            Wrapper::parse_from(argv)
                .args
                .storage_config()
                .writer
                .shards
        };
        assert_eq!(shards(&["kiln"]), 1);
        assert_eq!(shards(&["kiln", "--object-store", "/srv/kiln"]), 1);
        assert_eq!(shards(&["kiln", "--object-store", "file:///srv/kiln"]), 1);
        assert_eq!(shards(&["kiln", "--object-store", "s3://bucket/prefix"]), 2);
        assert_eq!(shards(&["kiln", "--object-store", "gs://bucket"]), 2);
        let logged = ["kiln", "--object-store", "s3://bucket", "--ack-from", "log"];
        assert_eq!(shards(&logged), 1);
        // A log written with more shards keeps them: its records would not be replayed.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wal/2")).unwrap();
        std::fs::write(dir.path().join("wal/2/00000000000000000001.kwal"), b"").unwrap();
        let data_dir = dir.path().to_str().unwrap();
        assert_eq!(shards(&["kiln", "--data-dir", data_dir]), 3);
        assert_eq!(
            shards(&["kiln", "--data-dir", data_dir, "--shards", "4"]),
            4
        );
        assert_eq!(
            shards(&["kiln", "--object-store", "s3://bucket", "--shards", "1"]),
            1
        );
        assert!(!args.storage_config().compaction.enabled);
        args.validate().expect("valid");
        let bad = Wrapper::parse_from(["kiln", "--otlp-traces-endpoint", "127.0.0.1:4317"]).args;
        assert!(bad.validate().is_err(), "an endpoint without a scheme");
    }

    #[test]
    fn durations_and_sizes_take_units_and_the_old_names_stay_aliases() {
        let command = Wrapper::command();
        for (old, new) in crate::units::RENAMED {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(new))
                .unwrap_or_else(|| panic!("--{new} is not a flag"));
            let aliases = arg.get_all_aliases().unwrap_or_default();
            assert!(aliases.contains(old), "--{old} is not an alias of --{new}");
            assert_eq!(
                arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                Some(crate::units::env_name(new))
            );
        }
        let args = Wrapper::parse_from([
            "kiln",
            "--flush-interval",
            "2s",
            "--spool-max-size",
            "512MiB",
            "--max-debuginfo-file-size",
            "1GiB",
            "--compaction-target-size",
            "1GiB",
            "--delete-delay-secs",
            "5",
        ])
        .args;
        let storage = args.storage_config();
        assert_eq!(storage.writer.flush_interval, Duration::from_secs(2));
        assert_eq!(storage.spool_max_bytes, 512 << 20);
        assert_eq!(storage.delete_delay, Duration::from_secs(5));
        assert_eq!(args.limits.max_debuginfo_file_bytes, Some(1 << 30));
        // A bare number is in the old name's unit.
        let bare = Wrapper::parse_from(["kiln", "--flush-interval-ms", "20"]).args;
        assert_eq!(
            bare.storage_config().writer.flush_interval,
            Duration::from_millis(20)
        );
        // The help shows defaults with their units, the same values as the constants.
        let help = Wrapper::command().render_help().to_string();
        for shown in ["[default: 50ms]", "[default: 1GiB]", "[default: 1h]"] {
            assert!(help.contains(shown), "{shown} is not in the help");
        }
        let defaults = Wrapper::parse_from(["kiln"]).args;
        assert_eq!(
            defaults.symbolize.symbolizer_max_inflated_bytes,
            kiln_symbolize::service::DEFAULT_MAX_INFLATED_BYTES
        );
        assert_eq!(
            defaults.limits.debuginfo_upload_rate_bytes,
            crate::app::uploads::DEFAULT_UPLOAD_RATE_BYTES
        );
        assert_eq!(
            defaults.limits.parca_stack_cache_bytes,
            crate::app::DEFAULT_STACK_CACHE_BYTES
        );
    }
}
