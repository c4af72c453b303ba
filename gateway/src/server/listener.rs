//! The listener of the API port: accepts connections, HTTP/1.1 and h2c alike (or, with TLS,
//! HTTP/1.1 and h2 by ALPN: `super::tls`), each within its
//! limits (header, body and idle timeouts, a connection cap), serves them the router
//! (`crate::api::router`), and on shutdown drains in-flight requests and flushes storage.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tracing::{debug, info, warn};

use crate::api::router;
use crate::app::AppRef;

/// Serves until `shutdown` resolves, then drains in-flight requests and flushes storage. With
/// `tls`, every connection is TLS (its handshake within the header read timeout).
pub async fn serve(
    app: AppRef,
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    tls: Option<Arc<super::tls::Tls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    info!(%addr, tls = tls.is_some(), "kiln is listening");
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
        let (router, http, watcher) = (router.clone(), http.clone(), graceful.watcher());
        let header_read_timeout = limits.header_read_timeout;
        let idle_timeout = limits.idle_timeout;
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            // hyper's header timeout starts once a first byte has told HTTP/1.1 from HTTP/2: a
            // client that connects and sends nothing (or no whole TLS handshake) is closed here
            // after the same time.
            let service = TowerToHyperService::new(router);
            let stream: Box<dyn Io> = if let Some(acceptor) = acceptor {
                match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "connection closed: no TLS handshake within the header read timeout");
                        return;
                    }
                }
            } else {
                let mut first = [0u8; 1];
                match tokio::time::timeout(header_read_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => Box::new(stream),
                    Ok(Ok(_)) | Ok(Err(_)) => return,
                    Err(_) => {
                        debug!(%peer, "connection closed: nothing sent within the header read timeout");
                        return;
                    }
                }
            };
            let io = TokioIo::new(IdleTimeout::new(stream, idle_timeout));
            let conn = watcher.watch(
                http.serve_connection_with_upgrades(io, service)
                    .into_owned(),
            );
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

/// A connection's byte stream: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

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
