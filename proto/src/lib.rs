//! Protobuf types and gRPC services Kiln speaks: pprof (`google.v1`), Pyroscope's `types.v1`,
//! `push.v1`, `querier.v1`, `settings.v1`, `capabilities.v1`, `adhocprofiles.v1` and
//! `debuginfo.v1alpha1`, Parca's write API (`parca.profilestore.v1alpha1`) and debug information
//! uploads (`parca.debuginfo.v1alpha1`), Prometheus remote write (`prometheus`), Grafana's plugin
//! protocol (`pluginv2`), gRPC health, and Kiln's
//! own storage formats (`kiln.storage.v1`); the one decoder of Pyroscope's flame graph
//! levels ([`flamegraph`]); and the depth check every untrusted protobuf passes before prost
//! decodes it ([`wire`]: [`wire::decode`] for bodies, [`wire::CheckedCodec`] for gRPC).
//!
//! The `.proto` files under `proto/` are Kiln's own declarations with the packages, message names
//! and field numbers of the originals; code is generated at build time and never committed.
//! Every wire message also has protobuf-JSON `serde` implementations (lowerCamel names, int64 as
//! strings) for the Connect `application/json` codec.

pub mod flamegraph;
pub mod wire;

#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod google {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/google.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/google.v1.serde.rs"));
    }
}

#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod types {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/types.v1.serde.rs"));
    }
}

#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod push {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/push.v1.serde.rs"));
    }
}

#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod querier {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/querier.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/querier.v1.serde.rs"));
    }
}

/// Pyroscope's per-tenant settings (the Drilldown app's plugin settings).
#[allow(clippy::all, missing_docs, unreachable_pub)]
/// The descriptors of every `.proto` file Kiln serves, imports included (a `FileDescriptorSet`):
/// what a client reading messages at run time needs (the e2e gRPC-Web test's connect-es).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kiln_descriptors.bin"));

pub mod settings {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/settings.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/settings.v1.serde.rs"));
    }
}

/// Pyroscope's capability probe.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod capabilities {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/capabilities.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/capabilities.v1.serde.rs"));
    }
}

/// Pyroscope's ad-hoc profile uploads (the Drilldown app's upload tab).
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod adhocprofiles {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/adhocprofiles.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/adhocprofiles.v1.serde.rs"));
    }
}

/// Parca's write API (what the Parca agent sends) and its debug information uploads.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod parca {
    pub mod debuginfo {
        pub mod v1alpha1 {
            include!(concat!(env!("OUT_DIR"), "/parca.debuginfo.v1alpha1.rs"));
            include!(concat!(
                env!("OUT_DIR"),
                "/parca.debuginfo.v1alpha1.serde.rs"
            ));
        }
    }
    pub mod profilestore {
        pub mod v1alpha1 {
            include!(concat!(env!("OUT_DIR"), "/parca.profilestore.v1alpha1.rs"));
            include!(concat!(
                env!("OUT_DIR"),
                "/parca.profilestore.v1alpha1.serde.rs"
            ));
        }
    }
}

/// Grafana Pyroscope's debug information uploads.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod debuginfo {
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/debuginfo.v1alpha1.rs"));
        include!(concat!(env!("OUT_DIR"), "/debuginfo.v1alpha1.serde.rs"));
    }
}

/// Prometheus remote write 1.0 (`WriteRequest` and what it holds): what Kiln sends for
/// recording rules.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod prometheus {
    include!(concat!(env!("OUT_DIR"), "/prometheus.rs"));
}

/// Grafana's backend plugin protocol.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pluginv2 {
    include!(concat!(env!("OUT_DIR"), "/pluginv2.rs"));
}

/// The standard gRPC health service.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod grpc {
    pub mod health {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
        }
    }
}

#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod kiln {
    pub mod storage {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/kiln.storage.v1.rs"));
        }
    }
}
