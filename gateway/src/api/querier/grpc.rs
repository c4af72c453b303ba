//! `querier.v1`'s gRPC front end: tonic's `QuerierService` on the shared [`Grpc`] service, each
//! method answered by the [`Querier`] function of the same name, as the Connect front end does.

use kiln_proto::google::v1::Profile;
use kiln_proto::querier::v1 as q;
use kiln_proto::querier::v1::querier_service_server::QuerierService;
use kiln_proto::types::v1 as t;
use tonic::{Request, Response, Status};

use super::Querier;
use crate::auth::Scope;
use crate::transport::grpc::{Grpc, report_metadata};

macro_rules! grpc_unary {
    ($self:ident, $req:ident, $method:ident, $name:literal) => {{
        let tenants = $self.tenants(&$req, Scope::Read)?;
        let options =
            crate::transport::http::query_options(&$req.metadata().clone().into_headers());
        let (result, report) = kiln_storage::query::with_options(options, async {
            let _slots = $self.app.tenants.query_slots(&tenants).await?;
            Querier::new($self.app.clone())
                .$method(&tenants, $req.into_inner())
                .await
        })
        .await;
        $self.app.metrics.query_read($name, &report.stats);
        let mut resp = Response::new(result?);
        report_metadata(&mut resp, &report);
        Ok(resp)
    }};
}

#[tonic::async_trait]
impl QuerierService for Grpc {
    async fn profile_types(
        &self,
        req: Request<q::ProfileTypesRequest>,
    ) -> Result<Response<q::ProfileTypesResponse>, Status> {
        grpc_unary!(self, req, profile_types, "ProfileTypes")
    }

    async fn label_values(
        &self,
        req: Request<t::LabelValuesRequest>,
    ) -> Result<Response<t::LabelValuesResponse>, Status> {
        grpc_unary!(self, req, label_values, "LabelValues")
    }

    async fn label_names(
        &self,
        req: Request<t::LabelNamesRequest>,
    ) -> Result<Response<t::LabelNamesResponse>, Status> {
        grpc_unary!(self, req, label_names, "LabelNames")
    }

    async fn series(
        &self,
        req: Request<q::SeriesRequest>,
    ) -> Result<Response<q::SeriesResponse>, Status> {
        grpc_unary!(self, req, series, "Series")
    }

    async fn select_merge_stacktraces(
        &self,
        req: Request<q::SelectMergeStacktracesRequest>,
    ) -> Result<Response<q::SelectMergeStacktracesResponse>, Status> {
        grpc_unary!(
            self,
            req,
            select_merge_stacktraces,
            "SelectMergeStacktraces"
        )
    }

    async fn select_merge_span_profile(
        &self,
        req: Request<q::SelectMergeSpanProfileRequest>,
    ) -> Result<Response<q::SelectMergeSpanProfileResponse>, Status> {
        grpc_unary!(
            self,
            req,
            select_merge_span_profile,
            "SelectMergeSpanProfile"
        )
    }

    async fn select_merge_profile(
        &self,
        req: Request<q::SelectMergeProfileRequest>,
    ) -> Result<Response<Profile>, Status> {
        grpc_unary!(self, req, select_merge_profile, "SelectMergeProfile")
    }

    async fn select_series(
        &self,
        req: Request<q::SelectSeriesRequest>,
    ) -> Result<Response<q::SelectSeriesResponse>, Status> {
        grpc_unary!(self, req, select_series, "SelectSeries")
    }

    async fn get_profile_stats(
        &self,
        req: Request<t::GetProfileStatsRequest>,
    ) -> Result<Response<t::GetProfileStatsResponse>, Status> {
        grpc_unary!(self, req, get_profile_stats, "GetProfileStats")
    }

    async fn analyze_query(
        &self,
        req: Request<q::AnalyzeQueryRequest>,
    ) -> Result<Response<q::AnalyzeQueryResponse>, Status> {
        grpc_unary!(self, req, analyze_query, "AnalyzeQuery")
    }

    async fn select_heatmap(
        &self,
        req: Request<q::SelectHeatmapRequest>,
    ) -> Result<Response<q::SelectHeatmapResponse>, Status> {
        grpc_unary!(self, req, select_heatmap, "SelectHeatmap")
    }

    async fn diff(
        &self,
        req: Request<q::DiffRequest>,
    ) -> Result<Response<q::DiffResponse>, Status> {
        grpc_unary!(self, req, diff, "Diff")
    }
}
