//! gRPC on the same port as HTTP (h2c): push a pprof with `push.v1.PusherService/Push`, query it
//! back with `querier.v1.QuerierService`, gzip-compressed messages, tenant walls in metadata.

use anyhow::{Context, Result, ensure};
use kiln_e2e::Kiln;
use kiln_e2e::with_tenant;
use kiln_proto::google::v1 as pprof;
use kiln_proto::push::v1::pusher_service_client::PusherServiceClient;
use kiln_proto::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_proto::querier::v1 as q;
use kiln_proto::querier::v1::querier_service_client::QuerierServiceClient;
use kiln_proto::types::v1::LabelPair;
use tonic::codec::CompressionEncoding;

fn profile() -> Vec<u8> {
    let p = pprof::Profile {
        string_table: [
            "",
            "cpu",
            "nanoseconds",
            "main",
            "grpc_work",
            "span_id",
            "00000000000000aa",
        ]
        .map(String::from)
        .to_vec(),
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        function: vec![
            pprof::Function {
                id: 1,
                name: 3,
                ..Default::default()
            },
            pprof::Function {
                id: 2,
                name: 4,
                ..Default::default()
            },
        ],
        location: vec![
            pprof::Location {
                id: 1,
                line: vec![pprof::Line {
                    function_id: 1,
                    line: 1,
                }],
                ..Default::default()
            },
            pprof::Location {
                id: 2,
                line: vec![pprof::Line {
                    function_id: 2,
                    line: 2,
                }],
                ..Default::default()
            },
        ],
        sample: vec![
            pprof::Sample {
                location_id: vec![2, 1],
                value: vec![30_000_000],
                label: vec![],
            },
            pprof::Sample {
                location_id: vec![1],
                value: vec![10_000_000],
                label: vec![pprof::Label {
                    key: 5,
                    str: 6,
                    ..Default::default()
                }],
            },
        ],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    prost::Message::encode_to_vec(&p)
}

#[test]
fn grpc_push_and_query_on_the_http_port() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let url = kiln.url("");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(url)?
            .connect()
            .await?;
        let mut pusher =
            PusherServiceClient::new(channel.clone()).send_compressed(CompressionEncoding::Gzip);
        let mut querier =
            QuerierServiceClient::new(channel).accept_compressed(CompressionEncoding::Gzip);
        let push = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![
                    LabelPair {
                        name: "__name__".into(),
                        value: "process_cpu".into(),
                    },
                    LabelPair {
                        name: "service_name".into(),
                        value: "grpc-svc".into(),
                    },
                ],
                samples: vec![RawSample {
                    raw_profile: profile().into(),
                    id: "1".into(),
                }],
                annotations: vec![],
            }],
        };
        pusher
            .push(with_tenant(push, "grpc-team"))
            .await
            .context("push")?;

        let req = q::SelectMergeStacktracesRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: r#"{service_name="grpc-svc"}"#.into(),
            start: 1_699_999_000_000,
            end: 1_700_001_000_000,
            ..Default::default()
        };
        let fg = querier
            .select_merge_stacktraces(with_tenant(req.clone(), "grpc-team"))
            .await?
            .into_inner()
            .flamegraph
            .context("flame graph")?;
        ensure!(fg.total == 40_000_000, "total {}", fg.total);
        ensure!(fg.names.iter().any(|n| n == "grpc_work"));

        let span = q::SelectMergeSpanProfileRequest {
            profile_type_id: req.profile_type_id.clone(),
            label_selector: "{}".into(),
            span_selector: vec!["00000000000000aa".into()],
            start: req.start,
            end: req.end,
            ..Default::default()
        };
        let fg = querier
            .select_merge_span_profile(with_tenant(span, "grpc-team"))
            .await?
            .into_inner()
            .flamegraph
            .context("span flame graph")?;
        ensure!(fg.total == 10_000_000, "span total {}", fg.total);

        // Tenant wall over gRPC.
        let other = querier
            .select_merge_stacktraces(with_tenant(req.clone(), "other-team"))
            .await?
            .into_inner()
            .flamegraph
            .context("flame graph")?;
        ensure!(other.total == 0);

        // Errors carry gRPC codes and messages.
        let mut bad = req;
        bad.label_selector = "{oops".into();
        let status = querier
            .select_merge_stacktraces(with_tenant(bad, "grpc-team"))
            .await
            .unwrap_err();
        ensure!(status.code() == tonic::Code::InvalidArgument, "{status:?}");
        ensure!(status.message().contains("invalid label selector"));
        let status = pusher
            .push(tonic::Request::new(PushRequest::default()))
            .await
            .unwrap_err();
        ensure!(status.code() == tonic::Code::Unauthenticated, "{status:?}");
        Ok::<_, anyhow::Error>(())
    })?;
    ensure!(kiln.is_ready());
    Ok(())
}
