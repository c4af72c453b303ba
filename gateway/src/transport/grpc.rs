//! gRPC through tonic, as every gRPC API shares it: the [`Grpc`] service every API implements
//! its tonic trait on (`crate::api::querier`, `crate::api::push`, `crate::api::parca`), with the
//! tenant the request was authenticated as, and a query's report in response metadata.

use tonic::{Request, Response, Status};

use crate::app::AppRef;
use crate::auth::Scope;

/// gRPC services over the shared app.
#[derive(Debug, Clone)]
pub struct Grpc {
    pub(crate) app: AppRef,
}

impl Grpc {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }

    pub(crate) fn tenant<T>(
        &self,
        req: &Request<T>,
        scope: Scope,
    ) -> Result<crate::auth::TenantId, Status> {
        if let Some(crate::server::Authenticated(tenant)) = req.extensions().get() {
            return Ok(tenant.clone());
        }
        let headers = req.metadata().clone().into_headers();
        Ok(self.app.authenticate(&headers, scope)?)
    }
}

/// A query's report in response metadata, as the Connect front end puts it in headers.
pub(crate) fn report_metadata<T>(
    resp: &mut Response<T>,
    report: &kiln_storage::query::QueryReport,
) {
    use tonic::metadata::MetadataValue;
    if !report.warnings.is_empty()
        && let Ok(v) = MetadataValue::try_from(report.warnings.join("; "))
    {
        resp.metadata_mut()
            .insert(crate::transport::http::WARNING_HEADER, v);
    }
    if let Ok(v) = MetadataValue::try_from(report.stats.to_string()) {
        resp.metadata_mut()
            .insert(crate::transport::http::STATS_HEADER, v);
    }
}
