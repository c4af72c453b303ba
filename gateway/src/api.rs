//! The APIs, one module per API family, and the one table that routes them all.
//!
//! | module | API |
//! |---|---|
//! | [`ingest`] | Pyroscope's `/ingest` and `/pyroscope/ingest`, every format it takes |
//! | [`push`] | `push.v1` (Grafana Alloy), Connect and gRPC |
//! | [`otlp`] | OTLP profiles, HTTP and gRPC |
//! | [`parca`] | the Parca agent's `ProfileStoreService`: `WriteRaw`, `WriteArrow`, `Write` |
//! | [`querier`] | `querier.v1`, Connect and gRPC, with the function projections and heatmaps |
//! | [`legacy`] | Pyroscope's legacy HTTP query API: `/pyroscope/render`, labels |
//! | [`adhoc`] | `adhocprofiles.v1`, the Drilldown app's upload tab |
//! | [`settings`] | `settings.v1`, `capabilities.v1`, and the services Kiln does not offer |
//! | [`debuginfo`] | debug files for native frames: `/api/v1/debuginfo`, Parca's and Pyroscope's `DebuginfoService` |
//! | [`admin`] | `/api/v1/tenants…`, `/api/v1/quarantine` |
//! | [`ops`] | `/ready`, `/metrics` |
//! | [`render`] | no API: the flamebearer and DOT formats the query APIs draw in |
//! | [`ui`] | `GET /`, `/ui/...`: the built-in web UI, which reads the query API from the browser |
//!
//! An API module owns its handlers and lists its own methods once: `querier.v1` in [`querier`]
//! (`querier_methods!`), the Drilldown app's other services in [`settings::SERVICES`] and
//! [`adhoc::SERVICE`], the legacy query API in [`legacy::ROUTES`]. It uses the app's state
//! (`crate::app`) and the transports (`crate::transport`); neither knows it. A new API is a
//! module here and its rows in the table.
//!
//! This file is the only one that knows every API. [`endpoints`] lists each endpoint: its path,
//! HTTP method, role, transport, the names the telemetry layer gives its calls, and its handler.
//! The router ([`router`]) is built from it (an endpoint of a role this process does not run
//! answers 404 naming the roles it runs), and so are the telemetry layer's method and transport
//! labels ([`api_method`], [`transport`], handed to the layer of `crate::transport::telemetry`).
//! gRPC services are tonic's (`grpc_routes`), on the same paths as their Connect twins; the
//! table lists the one that has no Connect twin (OTLP's `Export`) so it is named too.
//!
//! `tests/router.rs::every_endpoint_is_routed` requests every endpoint of the table, with every
//! role and with none, and checks none falls through to the router's fallback.

pub mod adhoc;
pub mod admin;
pub mod debuginfo;
pub mod ingest;
pub mod legacy;
pub mod mcp;
pub mod ops;
pub mod otlp;
pub mod parca;
pub mod push;
pub mod querier;
pub mod render;
pub mod settings;
pub mod ui;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use kiln_proto::debuginfo::v1alpha1::debuginfo_service_server::DebuginfoServiceServer as PyroscopeDebuginfoServer;
use kiln_proto::parca::debuginfo::v1alpha1::debuginfo_service_server::DebuginfoServiceServer as ParcaDebuginfoServer;
use kiln_proto::parca::profilestore::v1alpha1::profile_store_service_server::ProfileStoreServiceServer;
use kiln_proto::push::v1::pusher_service_server::PusherServiceServer;
use kiln_proto::querier::v1::querier_service_server::QuerierServiceServer;
use kiln_proto::settings::v1::recording_rules_service_server::RecordingRulesServiceServer;
use tonic::codec::CompressionEncoding;
use tower_http::compression::Predicate;

use crate::app::{AppRef, Roles};
use crate::auth::Scope;
pub use crate::transport::Transport;
use crate::transport::connect::Service;
use crate::transport::grpc::{Grpc, Steer, steer};
use crate::transport::telemetry::{Classify, track};

/// The role that serves an endpoint (`--roles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Ingest,
    Query,
    /// Every process: the admin API, `/ready`, `/metrics`.
    Any,
}

impl Role {
    /// Whether a process running `roles` serves this role's endpoints.
    pub fn served_by(self, roles: Roles) -> bool {
        match self {
            Self::Ingest => roles.ingest,
            Self::Query => roles.query,
            Self::Any => true,
        }
    }
}

/// An HTTP method of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Delete,
}

/// The names the telemetry layer gives an endpoint's calls.
#[derive(Debug, Clone, Copy)]
pub enum Names {
    /// One name for every call.
    One(&'static str),
    /// The path's last segment (`{method}`) picks one of `methods` (`service/method`, matched by
    /// their last segment); any other is `unknown`.
    Methods {
        methods: &'static [&'static str],
        unknown: &'static str,
    },
}

impl Names {
    fn of(self, last_segment: &str) -> &'static str {
        match self {
            Self::One(name) => name,
            Self::Methods { methods, unknown } => methods
                .iter()
                .find(|m| m.rsplit('/').next() == Some(last_segment))
                .copied()
                .unwrap_or(unknown),
        }
    }

    fn all(self) -> Vec<&'static str> {
        match self {
            Self::One(name) => vec![name],
            Self::Methods { methods, unknown } => {
                methods.iter().copied().chain([unknown]).collect()
            }
        }
    }
}

/// One API endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The axum path (`{name}` matches one segment).
    pub path: String,
    pub verb: Verb,
    pub role: Role,
    pub transport: Transport,
    pub names: Names,
    /// Its handler; `None` for gRPC-only endpoints (tonic serves them).
    pub handler: Option<fn() -> MethodRouter<AppRef>>,
}

impl Endpoint {
    fn new(
        path: impl Into<String>,
        verb: Verb,
        role: Role,
        transport: Transport,
        names: Names,
        handler: Option<fn() -> MethodRouter<AppRef>>,
    ) -> Self {
        Self {
            path: path.into(),
            verb,
            role,
            transport,
            names,
            handler,
        }
    }

    /// The segments of `path` when it is one of this endpoint's paths.
    fn matches<'p>(&self, path: &'p str) -> Option<&'p str> {
        let mut want = self.path.trim_start_matches('/').split('/');
        let mut got = path.trim_start_matches('/').split('/');
        let mut last = "";
        loop {
            match (want.next(), got.next()) {
                (None, None) => return Some(last),
                (Some(w), Some(g)) => {
                    let wildcard = w.starts_with('{') && w.ends_with('}');
                    if !(wildcard && !g.is_empty() || w == g) {
                        return None;
                    }
                    last = g;
                }
                _ => return None,
            }
        }
    }
}

/// `push.v1.PusherService/Push`.
pub const PUSH: &str = "push.v1.PusherService/Push";
/// OTLP's profiles export, over HTTP and gRPC.
pub const OTLP_EXPORT: &str =
    "opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Every endpoint of the API port.
pub fn endpoints() -> Vec<Endpoint> {
    use Names::One;
    use Role::{Any, Ingest, Query};
    use Transport::{Connect, Grpc, Http};
    use Verb::{Delete, Get, Post};
    let mut all = vec![
        // Ingest: Pyroscope's HTTP API, push.v1, OTLP.
        Endpoint::new(
            "/ingest",
            Post,
            Ingest,
            Http,
            One("ingest"),
            Some(|| post(ingest::ingest_handler)),
        ),
        Endpoint::new(
            "/pyroscope/ingest",
            Post,
            Ingest,
            Http,
            One("ingest"),
            Some(|| post(ingest::ingest_handler)),
        ),
        Endpoint::new(
            format!("/{PUSH}"),
            Post,
            Ingest,
            Connect,
            One(PUSH),
            Some(|| post(push::connect_handler)),
        ),
        Endpoint::new(
            "/v1development/profiles",
            Post,
            Ingest,
            Http,
            One(OTLP_EXPORT),
            Some(|| post(otlp::http_handler)),
        ),
        Endpoint::new(
            format!("/{OTLP_EXPORT}"),
            Post,
            Ingest,
            Grpc,
            One(OTLP_EXPORT),
            None,
        ),
        // The Parca agent's write API: WriteRaw and WriteArrow over Connect and gRPC, the
        // bidirectional Write over gRPC (its Connect path answers so).
        Endpoint::new(
            format!("/{}", parca::WRITE_RAW),
            Post,
            Ingest,
            Connect,
            One(parca::WRITE_RAW),
            Some(|| post(parca::connect_write_raw)),
        ),
        Endpoint::new(
            format!("/{}", parca::WRITE_ARROW),
            Post,
            Ingest,
            Connect,
            One(parca::WRITE_ARROW),
            Some(|| post(parca::connect_write_arrow)),
        ),
        Endpoint::new(
            format!("/{}", parca::WRITE),
            Post,
            Ingest,
            Grpc,
            One(parca::WRITE),
            None,
        ),
        // Query: querier.v1, the app's other services, the legacy HTTP API.
        Endpoint::new(
            "/querier.v1.QuerierService/{method}",
            Post,
            Query,
            Connect,
            Names::Methods {
                methods: querier::QUERIER_METHODS,
                unknown: "querier.v1.QuerierService/unknown",
            },
            Some(|| post(querier::connect_handler)),
        ),
    ];
    for s in &settings::SERVICES {
        all.push(service_endpoint(s, Query, || post(settings::handler)));
    }
    all.push(service_endpoint(&adhoc::SERVICE, Query, || {
        post(adhoc::handler)
    }));
    // Debug files for native frames: Kiln's HTTP API, Parca's and Pyroscope's services.
    for s in [&debuginfo::PARCA_SERVICE, &debuginfo::PYROSCOPE_SERVICE] {
        all.push(service_endpoint(s, Ingest, || {
            post(debuginfo::connect_handler)
        }));
    }
    all.extend([
        Endpoint::new(
            format!("{}/{{gnu_build_id}}", debuginfo::PYROSCOPE_UPLOAD_PATH),
            Post,
            Ingest,
            Http,
            One("debuginfo.v1alpha1.DebuginfoService/Upload"),
            Some(|| post(debuginfo::pyroscope_http_upload)),
        ),
        // One path, two verbs: the telemetry layer names both by the path.
        Endpoint::new(
            "/api/v1/debuginfo",
            Post,
            Ingest,
            Http,
            One("debuginfo"),
            Some(|| post(debuginfo::http_upload)),
        ),
        Endpoint::new(
            "/api/v1/debuginfo",
            Get,
            Ingest,
            Http,
            One("debuginfo"),
            Some(|| get(debuginfo::http_list)),
        ),
        Endpoint::new(
            "/api/v1/debuginfo/{id}",
            Delete,
            Ingest,
            Http,
            One("debuginfo.delete"),
            Some(|| delete(debuginfo::http_delete)),
        ),
    ]);
    // The built-in UI: a page that reads the query API from the browser (ADR 0016).
    all.extend([
        Endpoint::new("/", Get, Query, Http, One("ui"), Some(|| get(ui::index))),
        // Pyroscope's UI's diff links.
        Endpoint::new(
            "/comparison-diff",
            Get,
            Query,
            Http,
            One("ui"),
            Some(|| get(ui::index)),
        ),
        Endpoint::new(
            "/ui/{*path}",
            Get,
            Query,
            Http,
            One("ui"),
            Some(|| get(ui::asset)),
        ),
    ]);
    // Recording rules' counters, where they are evaluated.
    all.push(Endpoint::new(
        "/api/v1/recording-rules/metrics",
        Get,
        Ingest,
        Http,
        One("recording_rules.metrics"),
        Some(|| get(settings::recording::metrics_handler)),
    ));
    // The Model Context Protocol (streamable HTTP, stateless: GET and DELETE are 405).
    all.push(Endpoint::new(
        "/mcp",
        Post,
        Query,
        Http,
        One("mcp"),
        Some(|| axum::routing::any(mcp::handler)),
    ));
    for r in &legacy::ROUTES {
        all.push(Endpoint::new(
            r.path,
            Get,
            Query,
            Http,
            One(r.method),
            Some(r.handler),
        ));
    }
    // Every process: the admin API, readiness, metrics.
    all.extend([
        Endpoint::new(
            "/api/v1/tenants",
            Get,
            Any,
            Http,
            One("admin.tenants"),
            Some(|| get(admin::list)),
        ),
        Endpoint::new(
            "/api/v1/tenants/{id}",
            Delete,
            Any,
            Http,
            One("admin.tenant"),
            Some(|| delete(admin::delete)),
        ),
        Endpoint::new(
            "/api/v1/tenants/{id}/usage",
            Get,
            Any,
            Http,
            One("admin.tenant.usage"),
            Some(|| get(admin::usage)),
        ),
        Endpoint::new(
            "/api/v1/tenants/{id}/blocks",
            Get,
            Any,
            Http,
            One("admin.tenant.blocks"),
            Some(|| get(admin::blocks)),
        ),
        Endpoint::new(
            "/api/v1/tenants/{id}/quarantine",
            Get,
            Any,
            Http,
            One("admin.tenant.quarantine"),
            Some(|| get(admin::quarantine_of)),
        ),
        Endpoint::new(
            "/api/v1/members",
            Get,
            Any,
            Http,
            One("admin.members"),
            Some(|| get(admin::members)),
        ),
        Endpoint::new(
            "/api/v1/quarantine",
            Get,
            Any,
            Http,
            One("admin.quarantine"),
            Some(|| get(admin::quarantine_all)),
        ),
        Endpoint::new(
            "/ready",
            Get,
            Any,
            Http,
            One("ready"),
            Some(|| get(ops::ready)),
        ),
        Endpoint::new(
            "/metrics",
            Get,
            Any,
            Http,
            One("metrics"),
            Some(|| get(ops::guarded_metrics)),
        ),
    ]);
    all
}

/// The endpoint of a Connect service's calls: `/{service}/{method}`, named by its method list.
fn service_endpoint(s: &Service, role: Role, handler: fn() -> MethodRouter<AppRef>) -> Endpoint {
    Endpoint::new(
        format!("/{}/{{method}}", s.name),
        Verb::Post,
        role,
        Transport::Connect,
        match s.absent {
            // Every call of a service Kiln does not offer has the service's name.
            Some(_) => Names::Methods {
                methods: &[],
                unknown: s.methods[0],
            },
            None => Names::Methods {
                methods: s.methods,
                unknown: "other",
            },
        },
        Some(handler),
    )
}

/// The table, built once.
fn table() -> &'static [Endpoint] {
    static TABLE: std::sync::OnceLock<Vec<Endpoint>> = std::sync::OnceLock::new();
    TABLE.get_or_init(endpoints)
}

/// The endpoint serving `path`, and the path's last segment.
pub fn endpoint_of(path: &str) -> Option<(&'static Endpoint, &str)> {
    table()
        .iter()
        .find_map(|e| e.matches(path).map(|last| (e, last)))
}

/// The API method a request to `path` calls: a bounded name (`other` for paths of no API).
pub fn method_name(path: &str) -> &'static str {
    endpoint_of(path).map_or("other", |(e, last)| e.names.of(last))
}

/// Every name [`method_name`] gives.
pub fn method_names() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = table().iter().flat_map(|e| e.names.all()).collect();
    all.push("other");
    let mut seen = std::collections::HashSet::new();
    all.retain(|n| seen.insert(*n));
    all
}

/// The transport of a request to `path` without a gRPC content type.
pub fn transport_of(path: &str) -> Transport {
    endpoint_of(path).map_or(Transport::Http, |(e, _)| match e.transport {
        // A gRPC-only path reached without gRPC's content type is plain HTTP.
        Transport::Grpc => Transport::Http,
        t => t,
    })
}

/// Every API method name the telemetry layer gives (the `method` label's values).
pub fn api_methods() -> Vec<String> {
    method_names().into_iter().map(str::to_owned).collect()
}

/// The API method a request calls, as the telemetry layer names it: a bounded name, from the
/// path alone.
pub fn api_method(path: &str) -> &'static str {
    method_name(path)
}

/// The transport a request came by, as the telemetry layer names it: `grpc` or `grpc-web` (by
/// its content type), `connect` (Connect's protobuf or JSON over HTTP) or `http` (by its path).
pub fn transport(path: &str, headers: &HeaderMap) -> &'static str {
    if crate::transport::grpc::is_grpc(headers) {
        "grpc"
    } else if crate::transport::grpc::is_grpc_web(headers) {
        "grpc-web"
    } else {
        transport_of(path).label()
    }
}

/// The whole HTTP + gRPC application: every endpoint of the table, those of roles this process
/// does not run answering 404 with the roles it runs.
pub fn router(app: AppRef) -> Router {
    let grpc = grpc_routes(app.clone());
    let roles = app.roles;
    let mut routes = Router::new();
    for e in endpoints() {
        let Some(handler) = e.handler else {
            continue;
        };
        routes = routes.route(
            &e.path,
            if e.role.served_by(roles) {
                handler()
            } else {
                match e.verb {
                    Verb::Get => get(role_missing),
                    Verb::Post => post(role_missing),
                    Verb::Delete => axum::routing::delete(role_missing),
                }
            },
        );
    }
    routes
        .fallback(no_api)
        // Bodies are limited by each handler with a clear 413 of its own.
        .layer(DefaultBodyLimit::disable())
        .layer(answer_compression())
        .with_state(app.clone())
        .layer(middleware::from_fn_with_state(
            Steer {
                grpc,
                app: app.clone(),
                scope_of: grpc_scope,
            },
            steer,
        ))
        // Browsers of other origins (the Parca UI over gRPC-Web): preflights answered here.
        .layer(cors(&app.cors_origins))
        // A bug must cost one request a 500, never the connection or the process.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            crate::transport::http::panic_response,
        ))
        // Outermost: every request is counted and timed, a panic's 500 too.
        .layer(middleware::from_fn_with_state(
            (
                app,
                Classify {
                    method: api_method,
                    transport,
                },
            ),
            track,
        ))
}

/// The CORS layer for `origins`: none allowed when empty. Requests may carry credentials and
/// Kiln's tenant header; gRPC-Web's status headers are exposed to the page.
fn cors(origins: &[HeaderValue]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let layer = CorsLayer::new();
    if origins.is_empty() {
        return layer;
    }
    let any = origins.iter().any(|o| o == "*");
    layer
        .allow_origin(if any {
            AllowOrigin::mirror_request()
        } else {
            AllowOrigin::list(origins.iter().cloned())
        })
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers(tower_http::cors::AllowHeaders::mirror_request())
        .allow_credentials(true)
        .expose_headers([
            HeaderName::from_static("grpc-status"),
            HeaderName::from_static("grpc-message"),
            HeaderName::from_static("grpc-status-details-bin"),
        ])
        .max_age(std::time::Duration::from_secs(600))
}

/// `--cors-allowed-origins` checked: each a valid header value; `*` stands alone.
pub fn cors_origins(flags: &[String]) -> anyhow::Result<Vec<HeaderValue>> {
    let origins: Vec<&str> = flags
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
        .collect();
    anyhow::ensure!(
        !origins.contains(&"*") || origins.len() == 1,
        "--cors-allowed-origins: `*` allows every origin; give it alone"
    );
    origins
        .into_iter()
        .map(|o| {
            HeaderValue::from_str(o.trim_end_matches('/'))
                .map_err(|_| anyhow::anyhow!("--cors-allowed-origins: {o:?} is not an origin"))
        })
        .collect()
}

/// Large answers compressed as the client's `Accept-Encoding` asks (zstd or gzip), at the
/// fastest level: a flame graph's JSON shrinks about tenfold for little CPU. gRPC and Connect
/// streams compress per message instead; event streams and images are left alone.
fn answer_compression() -> tower_http::compression::CompressionLayer<impl Predicate> {
    use tower_http::compression::predicate::{NotForContentType, SizeAbove};
    tower_http::compression::CompressionLayer::new()
        .no_br()
        .no_deflate()
        .quality(tower_http::CompressionLevel::Fastest)
        .compress_when(
            SizeAbove::new(ANSWER_COMPRESSION_MIN_BYTES)
                .and(NotForContentType::GRPC)
                .and(NotForContentType::const_new("application/connect+"))
                .and(NotForContentType::SSE)
                .and(NotForContentType::IMAGES),
        )
}

/// Answers smaller than this are sent as they are: compressing them saves less than it costs.
const ANSWER_COMPRESSION_MIN_BYTES: u16 = 1024;

/// A path of no API (the API table's fallback): 404 saying so.
async fn no_api(uri: axum::http::Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("{} is not an API of Kiln\n", uri.path()),
    )
        .into_response()
}

/// An API of a role this process does not run (`--roles`): 404, naming the roles it runs, so a
/// misrouted request is plain to see.
async fn role_missing(State(app): State<AppRef>, uri: axum::http::Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "{} is not served here: this kiln runs the roles {}\n",
            uri.path(),
            app.roles
        ),
    )
        .into_response()
}

/// The gRPC services of this process's roles (tonic's), served when a request has a gRPC
/// content type.
fn grpc_routes(app: AppRef) -> Router {
    let max = app.grpc_max_message_bytes;
    let svc = Grpc::new(app.clone());
    // Every service takes and answers gzip and zstd (`grpc-encoding`), as the client asks
    // (`grpc-accept-encoding`). tonic bounds an inflated message by the decoding limit.
    macro_rules! compressed {
        ($server:expr) => {
            $server
                .accept_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Zstd)
                .send_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Zstd)
                .max_decoding_message_size(max)
                .max_encoding_message_size(usize::MAX)
        };
    }
    let querier = compressed!(QuerierServiceServer::new(svc.clone()));
    let pusher = compressed!(PusherServiceServer::new(svc.clone()));
    let parca = compressed!(ProfileStoreServiceServer::new(svc.clone()));
    let parca_debuginfo = compressed!(ParcaDebuginfoServer::new(svc.clone()));
    let recording_rules = compressed!(RecordingRulesServiceServer::new(svc.clone()));
    let pyroscope_debuginfo = compressed!(PyroscopeDebuginfoServer::new(svc));
    let mut routes = tonic::service::Routes::default();
    if app.roles.query {
        routes = routes.add_service(querier).add_service(recording_rules);
    }
    if app.roles.ingest {
        routes = routes
            .add_service(pusher)
            .add_service(parca)
            .add_service(parca_debuginfo)
            .add_service(pyroscope_debuginfo)
            .add_service(otlp::OtlpGrpc::new(app));
    }
    routes.prepare().into_axum_router()
}

/// The scope a gRPC call needs, from its path: `querier.v1`, `settings.v1` (as over Connect)
/// and the debug files' list read;
/// push, Parca, OTLP and debug-file uploads write.
fn grpc_scope(path: &str) -> Scope {
    if path.starts_with("/querier.v1.")
        || path.starts_with("/settings.v1.")
        || path == "/debuginfo.v1alpha1.DebuginfoService/ListDebuginfo"
    {
        Scope::Read
    } else {
        Scope::Write
    }
}

/// The admin listener (`--admin-listen`): `/metrics` and `/ready` without credentials, for a
/// network only operators and their Prometheus reach.
pub fn admin_router(app: AppRef) -> Router {
    Router::new()
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .with_state(app)
}

#[cfg(test)]
mod tests;
