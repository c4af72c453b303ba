//! Kiln's built-in web UI (ADR 0016): `GET /` and `/ui/...`, one page of HTML, CSS and plain
//! JavaScript embedded in the binary (no build step besides cargo). The page holds no data: it
//! reads Kiln's own query API (`querier.v1` over Connect JSON) from the browser with the caller's
//! credentials — the proxy's header in `trusted-header` mode, a bearer token kept in the tab's
//! session storage in `jwt` mode — so it sees exactly what the API lets that caller see.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/kiln.js");
const STYLE: &str = include_str!("ui/kiln.css");

/// Same-origin everything: the page loads its own script and style and calls only Kiln.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn page(body: &'static str, content_type: &'static str, cache: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// `GET /`: the page. Its view is in the query string (Pyroscope's `query`, `from`, `until`).
pub async fn index() -> Response {
    page(INDEX, "text/html; charset=utf-8", "no-cache")
}

/// `GET /ui/{*path}`: the page's script and style; any other path is the page itself, so a
/// link into the UI opens it.
pub async fn asset(Path(path): Path<String>) -> Response {
    match path.as_str() {
        "kiln.js" => page(SCRIPT, "text/javascript; charset=utf-8", "no-cache"),
        "kiln.css" => page(STYLE, "text/css; charset=utf-8", "no-cache"),
        _ => index().await,
    }
}
