//! Generates Rust code for Kiln's `.proto` files with prost and tonic, plus protobuf-JSON
//! (`serde`) implementations with pbjson for the Connect `application/json` codec.
//! `protoc` comes from `protoc-bin-vendored`, so no system protobuf compiler is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/google/v1/profile.proto",
        "proto/types/v1/types.proto",
        "proto/push/v1/push.proto",
        "proto/querier/v1/querier.proto",
        "proto/settings/v1/setting.proto",
        "proto/settings/v1/recording_rules.proto",
        "proto/capabilities/v1/feature_flags.proto",
        "proto/adhocprofiles/v1/adhocprofiles.proto",
        "proto/kiln/storage/v1/symbols.proto",
        "proto/kiln/storage/v1/block.proto",
        "proto/pluginv2/backend.proto",
        "proto/grpc/health/v1/health.proto",
        "proto/parca/profilestore/v1alpha1/profilestore.proto",
        "proto/parca/debuginfo/v1alpha1/debuginfo.proto",
        "proto/debuginfo/v1alpha1/debuginfo.proto",
        "proto/prometheus/remote.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out_dir.join("kiln_descriptors.bin");

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.file_descriptor_set_path(&descriptors);
    // google.protobuf.Timestamp (debuginfo.v1alpha1) from pbjson-types, with its JSON form.
    config.compile_well_known_types();
    config.extern_path(".google.protobuf", "::pbjson_types");
    config.bytes([
        ".push.v1.RawSample.raw_profile",
        ".parca.profilestore.v1alpha1.RawSample.raw_profile",
        ".parca.profilestore.v1alpha1.WriteRequest.record",
        ".parca.profilestore.v1alpha1.WriteResponse.record",
        ".parca.profilestore.v1alpha1.WriteArrowRequest.ipc_buffer",
        ".parca.debuginfo.v1alpha1.UploadRequest.chunk_data",
        ".debuginfo.v1alpha1.UploadChunk.chunk",
    ]);
    tonic_prost_build::configure()
        // Every service decodes through the depth check (src/wire.rs).
        .codec_path("crate::wire::CheckedCodec")
        .build_client(true)
        .build_server(true)
        .compile_with_config(
            config,
            &protos.map(PathBuf::from),
            &[PathBuf::from("proto"), protoc_bin_vendored::include_path()?],
        )?;

    let set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        // Clients send fields Kiln does not know (newer protocol versions, a frame filter put
        // "as an unknown field" on purpose by the datasource): ignored, as protobuf does.
        .ignore_unknown_fields()
        .extern_path(".google.protobuf", "::pbjson_types")
        .build(&[
            ".google.v1",
            ".types.v1",
            ".push.v1",
            ".querier.v1",
            ".settings.v1",
            ".capabilities.v1",
            ".adhocprofiles.v1",
            ".parca.profilestore.v1alpha1",
            ".parca.debuginfo.v1alpha1",
            ".debuginfo.v1alpha1",
        ])?;
    Ok(())
}
