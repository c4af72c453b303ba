//! `querier.v1`'s Connect front end: `POST /querier.v1.QuerierService/{method}`, each method
//! dispatched by its name to the [`Querier`] function of the method list
//! ([`querier_methods!`](super::querier_methods)).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use super::Querier;
use crate::app::AppRef;
use crate::auth::TenantSet;
use crate::error::{ApiError, ErrorKind};
use crate::transport::caller::ReadsAcross;
use crate::transport::connect::{Call, Codec, connect_error, connect_ok, prepare};
use crate::transport::http::{query_options, report_headers};

/// `POST /querier.v1.QuerierService/{method}`.
pub async fn connect_handler(
    State(app): State<AppRef>,
    ReadsAcross(tenants): ReadsAcross,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let querier = Querier::new(app.clone());
    let (result, report) = kiln_storage::query::with_options(query_options(&headers), async {
        let _slots = app.tenants.query_slots(&tenants).await?;
        // The request body is bounded by the first tenant's limits; each query by its own.
        let call = prepare(&app, &headers, body, tenants.first().clone()).await?;
        Ok::<_, ApiError>(dispatch(&querier, &method, &tenants, call).await)
    })
    .await;
    let (name, result) = match result {
        Ok((name, r)) => (name, r),
        Err(e) => ("prepare", Err(e)),
    };
    let mut resp = match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    };
    app.metrics.query_read(name, &report.stats);
    report_headers(resp.headers_mut(), &report);
    resp
}

macro_rules! unary {
    ($querier:expr, $tenants:expr, $call:expr, $method:ident) => {{
        let req = $call.codec.decode(&$call.body)?;
        let resp = $querier.$method($tenants, req).await?;
        Ok(($call.codec, $call.codec.encode(&resp)?))
    }};
}

/// Runs one querier method; returns its name (for metrics; `unknown` when there is no such
/// method) with the result.
async fn dispatch(
    querier: &Querier,
    method: &str,
    tenants: &TenantSet,
    call: Call,
) -> (&'static str, Result<(Codec, Bytes), ApiError>) {
    macro_rules! route {
        ($($name:literal => $fn:ident),* $(,)?) => {
            match method {
                $($name => ($name, async { unary!(querier, tenants, call, $fn) }.await),)*
                other => (
                    "unknown",
                    Err(ApiError::new(
                        ErrorKind::NotFound,
                        format!("querier.v1.QuerierService has no method {other:?} in Kiln"),
                    )),
                ),
            }
        };
    }
    super::querier_methods!(route)
}
