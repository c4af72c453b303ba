//! The state every handler reads ([`App`]: storage, tenants' limits, authentication, metrics,
//! roles, the Parca agents' stacks, `kiln upload`'s batch ids), and what the APIs share below
//! their transports: the decode budget ([`budget`]) and the write path every write API ends in
//! ([`write`](mod@write)).

pub mod budget;
pub mod cluster;
mod roles;
mod stacks;
mod upload_ids;
pub mod uploads;
pub mod wal;
pub mod write;

use std::sync::Arc;

use kiln_storage::Storage;
use kiln_symbolize::{Symbolizer, SymbolizerConfig};

use crate::auth::Authenticator;
use crate::metrics::Metrics;
use crate::tenants::{TenantLimits, Tenants};
use budget::DecodeBudget;

pub use roles::{Roles, RolesError};
pub use stacks::{DEFAULT_STACK_CACHE_BYTES, StackCache};
pub use upload_ids::UploadIds;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    pub storage: Storage,
    pub tenants: Tenants,
    pub auth: Authenticator,
    pub metrics: Metrics,
    /// Ceiling for one gRPC message (tenants' own limits are checked after decoding).
    pub grpc_max_message_bytes: usize,
    /// What this process does: its APIs and background work.
    pub roles: Roles,
    /// Decoded bytes ingest requests may hold at once.
    pub decode_budget: DecodeBudget,
    /// The stacks Parca agents sent, per tenant (`Write` asks only for the others).
    pub stacks: StackCache,
    /// `kiln upload` batches stored recently, so a resumed upload stores none twice.
    pub upload_ids: UploadIds,
    /// Names native frames from the tenants' debug files and debuginfod; the storage engine
    /// reads blocks through it (ADR 0013).
    pub symbolizer: Symbolizer,
    /// Debug-file uploads under way (Parca's and Pyroscope's upload protocols).
    pub debuginfo_uploads: uploads::Uploads,
    /// Recording rules: evaluated on every write, sealed and sent by `kiln serve`.
    pub recording: Arc<crate::recording::Recording>,
    /// This process in its cluster: instance id, live members, leaving.
    pub cluster: cluster::Cluster,
    /// Origins CORS answers for (`--cors-allowed-origins`); empty: none, `*` alone: any.
    pub cors_origins: Vec<axum::http::HeaderValue>,
}

impl App {
    /// An app with built-in tenant limits and a symbolizer without debuginfod.
    pub fn new(storage: Storage, auth: Authenticator, tenants: Tenants) -> Self {
        let config = SymbolizerConfig::without_debuginfod(storage.data_dir());
        let queue = crate::recording::remote_write::RemoteWriteQueue::open(
            crate::recording::queue_dir(storage.data_dir()),
            256 << 20,
        )
        .expect("the remote-write queue under the data directory");
        let recording = crate::recording::Recording::new(
            crate::recording::RecordingConfig::default(),
            Some(Arc::new(queue)),
        );
        Self::with_symbolizer(
            storage,
            auth,
            tenants,
            config,
            DEFAULT_SYMBOLIZE_DEADLINE,
            recording,
        )
        .expect("the symbolizer's cache directory under the data directory")
    }

    /// An app whose symbolizer runs with `config` (queries wait `deadline` for debug files)
    /// and whose recording rules are `recording`'s.
    pub fn with_symbolizer(
        storage: Storage,
        auth: Authenticator,
        tenants: Tenants,
        config: SymbolizerConfig,
        deadline: std::time::Duration,
        recording: crate::recording::Recording,
    ) -> std::io::Result<Self> {
        let metrics = Metrics::default();
        let recording = Arc::new(recording);
        metrics.register_collector(Box::new(crate::recording::StatsCollector(Arc::clone(
            &recording,
        ))));
        metrics.register_storage(storage.metrics());
        let symbol_metrics = Arc::new(kiln_symbolize::Metrics::default());
        metrics.register_symbolizer(&symbol_metrics);
        let symbolizer = Symbolizer::new(storage.store().clone(), config, symbol_metrics)?;
        storage.set_frame_namer(Arc::new(symbolizer.clone()), deadline);
        let decode_budget = DecodeBudget::new(256 << 20);
        symbolizer.set_inflate_budget(Arc::new(decode_budget.clone()));
        let debuginfo_uploads = uploads::Uploads::new(
            uploads::DEFAULT_UPLOAD_CONCURRENCY,
            uploads::DEFAULT_UPLOAD_RATE_BYTES,
            uploads::DEFAULT_SCRATCH_BYTES,
            storage.metastore(),
        );
        let upload_ids = UploadIds::new(storage.metastore());
        let app = Self {
            storage,
            tenants,
            auth,
            metrics,
            grpc_max_message_bytes: 64 << 20,
            roles: Roles::ALL,
            decode_budget,
            stacks: StackCache::new(DEFAULT_STACK_CACHE_BYTES),
            upload_ids,
            symbolizer,
            debuginfo_uploads,
            recording,
            cluster: cluster::Cluster::new("local", Roles::ALL),
            cors_origins: Vec::new(),
        };
        app.set_members(vec![app.cluster.me().clone()]);
        Ok(app)
    }

    /// Sets the decode budget, which ingest and the opening of debug files share.
    pub fn set_decode_budget(&mut self, budget: DecodeBudget) {
        self.symbolizer.set_inflate_budget(Arc::new(budget.clone()));
        self.decode_budget = budget;
    }

    /// Records the cluster's live members (membership's answer, or this process alone): the
    /// limits' shares, the segment interval's scale and the `kiln_cluster_members` gauges
    /// follow.
    pub fn set_members(&self, members: Vec<kiln_storage::metastore::Member>) {
        self.cluster.set_live(members);
        let (ingest, query, compact) = self.cluster.counts_by_role();
        self.tenants.set_peers(ingest, query);
        self.storage
            .scale_segment_interval(u32::try_from(ingest).unwrap_or(u32::MAX));
        for (role, n) in [("ingest", ingest), ("query", query), ("compact", compact)] {
            self.metrics
                .cluster_members
                .get_or_create(&crate::metrics::RoleLabels { role })
                .set(n as i64);
        }
    }

    /// The limits of a tenant.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        self.tenants.limits(tenant)
    }
}

/// How long a query waits for debug files by default (`--symbolize-deadline-ms`).
pub const DEFAULT_SYMBOLIZE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Shared handle.
pub type AppRef = Arc<App>;
