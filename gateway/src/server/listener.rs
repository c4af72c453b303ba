//! The HTTP server: axum routes for Pyroscope's HTTP (ingest and the legacy query API) and Connect APIs and tonic's gRPC services on
//! one port, HTTP/1.1 and h2c alike. Requests with an `application/grpc*` content type go to tonic;
//! everything else to axum.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kiln_proto::parca::profilestore::v1alpha1::profile_store_service_server::ProfileStoreServiceServer;
use kiln_proto::push::v1::pusher_service_server::PusherServiceServer;
use kiln_proto::querier::v1::querier_service_server::QuerierServiceServer;
use std::time::Duration;
use tonic::codec::CompressionEncoding;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use crate::app::AppRef;
use crate::auth::Scope;
use crate::grpc::Grpc;

/// The whole HTTP + gRPC application: every endpoint of the API table (`crate::api`), those of
/// roles this process does not run answering 404 with the roles it runs.
pub fn router(app: AppRef) -> Router {
    let grpc = grpc_router(app.clone());
    let roles = app.roles;
    let mut routes = Router::new();
    for e in crate::api::endpoints() {
        let Some(handler) = e.handler else {
            continue;
        };
        routes = routes.route(
            &e.path,
            if e.role.served_by(roles) {
                handler()
            } else {
                match e.verb {
                    crate::api::Verb::Get => get(role_missing),
                    crate::api::Verb::Post => post(role_missing),
                    crate::api::Verb::Delete => axum::routing::delete(role_missing),
                }
            },
        );
    }
    routes
        .fallback(no_api)
        // Bodies are limited by each handler with a clear 413 of its own.
        .layer(DefaultBodyLimit::disable())
        .with_state(app.clone())
        .layer(middleware::from_fn_with_state(
            (grpc, app.clone()),
            steer_grpc,
        ))
        // A bug must cost one request a 500, never the connection or the process.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        // Outermost: every request is counted and timed, a panic's 500 too.
        .layer(middleware::from_fn_with_state(app, crate::telemetry::track))
}

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

fn grpc_router(app: AppRef) -> Router {
    let max = app.grpc_max_message_bytes;
    let svc = Grpc::new(app.clone());
    let querier = QuerierServiceServer::new(svc.clone())
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max)
        .max_encoding_message_size(usize::MAX);
    let pusher = PusherServiceServer::new(svc.clone())
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max);
    let parca = ProfileStoreServiceServer::new(svc)
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max);
    let mut routes = tonic::service::Routes::default();
    if app.roles.query {
        routes = routes.add_service(querier);
    }
    if app.roles.ingest {
        routes = routes
            .add_service(pusher)
            .add_service(parca)
            .add_service(crate::otlp::OtlpGrpc::new(app));
    }
    routes.prepare().into_axum_router()
}

/// A gRPC refusal (trailers-only response) for an error found before tonic runs.
fn grpc_refusal(e: crate::error::ApiError) -> Response {
    tonic::Status::from(e).into_http::<axum::body::Body>()
}

/// The tenant a gRPC request was authenticated as, before tonic decoded anything.
#[derive(Debug, Clone)]
pub struct Authenticated(pub crate::auth::TenantId);

/// Sends gRPC requests to tonic, the rest on through axum. gRPC requests are authenticated here,
/// before tonic reads and decompresses their message, so an unauthenticated caller costs nothing;
/// the tenant travels to the services as a request extension.
async fn steer_grpc(
    State((grpc, app)): State<(Router, AppRef)>,
    mut req: Request,
    next: Next,
) -> Response {
    let is_grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    if is_grpc {
        let scope = if req.uri().path().starts_with("/querier.v1.") {
            Scope::Read
        } else {
            Scope::Write
        };
        let tenant = match app.authenticate(req.headers(), scope) {
            Ok(t) => t,
            Err(e) => return grpc_refusal(e),
        };
        if scope == Scope::Write
            && let Err(e) = app.tenants.check_ingest(&tenant)
        {
            app.metrics.refused(&tenant, e.reason());
            return grpc_refusal(e);
        }
        req.extensions_mut().insert(Authenticated(tenant));
        let mut resp = match grpc.oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        oversize_is_resource_exhausted(&mut resp);
        return resp;
    }
    next.run(req).await
}

/// tonic answers a message over the size limit with `OutOfRange`; gRPC servers elsewhere (and
/// OTLP exporters' retry logic) expect `ResourceExhausted`.
fn oversize_is_resource_exhausted(resp: &mut Response) {
    let headers = resp.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| {
                m.contains("message%20length%20too%20large")
                    || m.contains("message length too large")
            });
    if too_large {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    crate::error::ApiError::internal(format!("handler panicked: {detail}")).into_response()
}

pub(crate) async fn ready() -> impl IntoResponse {
    (StatusCode::OK, "ready\n")
}

/// The admin listener (`--admin-listen`): `/metrics` and `/ready` without credentials, for a
/// network only operators and their Prometheus reach.
pub fn admin_router(app: AppRef) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(app)
}

/// `/metrics` on the API port. Its label values name every tenant, so with `--auth jwt` it needs
/// an admin token of the operator tenant (`--admin-tenant`); Prometheus scrapes it with that
/// token, or scrapes the admin listener instead. The other modes serve it as they serve all else
/// (loopback, or behind the proxy that authenticates).
pub(crate) async fn guarded_metrics(
    State(app): State<AppRef>,
    headers: axum::http::HeaderMap,
) -> Response {
    if app.auth.mode == crate::auth::AuthMode::Jwt
        && let Err(e) = app.auth.authorize_admin(&headers, None)
    {
        return e.into_response();
    }
    metrics(State(app)).await.into_response()
}

async fn metrics(State(app): State<AppRef>) -> impl IntoResponse {
    let counters = app.storage.query().counters();
    let get = |c: &std::sync::atomic::AtomicU64| {
        i64::try_from(c.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(i64::MAX)
    };
    app.metrics
        .storage_quarantined_blocks
        .set(get(&counters.quarantined));
    app.metrics
        .storage_query_read_bytes
        .set(get(&counters.bytes_read));
    app.metrics
        .storage_query_rollup_reads
        .set(get(&counters.rollup_reads));
    for (cache, lookups, misses) in [
        (
            "symbols",
            &counters.symbols_lookups,
            &counters.symbols_misses,
        ),
        (
            "parquet_metadata",
            &counters.parquet_lookups,
            &counters.parquet_misses,
        ),
        (
            "partial_results",
            &counters.results_lookups,
            &counters.results_misses,
        ),
    ] {
        let labels = crate::metrics::CacheLabels {
            cache: cache.into(),
        };
        app.metrics
            .storage_cache_lookups
            .get_or_create(&labels)
            .set(get(lookups));
        app.metrics
            .storage_cache_misses
            .get_or_create(&labels)
            .set(get(misses));
    }
    if tikv_jemalloc_ctl::epoch::advance().is_ok() {
        let read = |r: tikv_jemalloc_ctl::Result<usize>| r.map_or(0, |b| b as i64);
        app.metrics
            .memory_allocated
            .set(read(tikv_jemalloc_ctl::stats::allocated::read()));
        app.metrics
            .memory_resident
            .set(read(tikv_jemalloc_ctl::stats::resident::read()));
    }
    app.metrics
        .ingest_decode_budget_used
        .set(app.decode_budget.in_use() as i64);
    app.metrics
        .parca_stack_cache_bytes
        .set(app.stacks.weighted_size() as i64);
    // Stored bytes per tenant come from the background refresh
    // (`admin::refresh_stored_bytes`): a scrape reads gauges, never the metastore.
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}

/// Serves until `shutdown` resolves, then drains in-flight requests and flushes storage.
pub async fn serve(
    app: AppRef,
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    info!(%addr, "kiln is listening");
    let router = router(Arc::clone(&app)).layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_read_timeout,
    ));
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    http.http2().timer(TokioTimer::new());
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            app.metrics.connection_refused();
            debug!(%peer, "connection refused: --max-connections are open");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        let service = TowerToHyperService::new(router.clone());
        let conn = graceful.watch(
            http.serve_connection_with_upgrades(io, service)
                .into_owned(),
        );
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(%peer, error = %e, "connection closed");
            }
            drop(permit);
        });
    }
    drop(listener);
    info!("draining connections");
    graceful.shutdown().await;
    info!("draining done, flushing storage");
    app.storage.close().await;
    info!("storage flushed, bye");
    Ok(())
}

/// What one client connection may cost (`kiln serve` flags).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Time to send a request's headers (HTTP/1.1).
    pub header_read_timeout: Duration,
    /// Longest pause while a request body is arriving; then 408.
    pub body_read_timeout: Duration,
    /// A connection that sends nothing and is sent nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_connections: 4096,
        }
    }
}

/// A connection that fails once neither side has moved a byte for the idle timeout: a kept-alive
/// connection nobody uses, or a client that stalls mid-request.
struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn moved(&mut self) {
        let at = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(at);
    }

    fn expired(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "connection idle")
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            std::task::Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending if self.expired(cx) => {
                std::task::Poll::Ready(Err(idle_error()))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => info!("interrupt received, shutting down"),
        _ = term => info!("SIGTERM received, shutting down"),
    }
}
