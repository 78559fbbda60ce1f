//! Generates the gRPC code from `proto/slogate/v1/*.proto` with a vendored
//! `protoc`, so a fresh machine builds offline. Set `PROTOC` to use another.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: the build script is single-threaded here, and the variable
        // only tells this process's protoc lookup (prost-build reads PROTOC)
        // where the vendored binary is.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("slogate_v1_descriptor.bin"))
        .codec_path("crate::codec::GatewayCodec")
        .compile_protos(&["proto/slogate/v1/gateway.proto", "proto/slogate/v1/node.proto"], &["proto"])?;
    // etcd's v3 API, client side only, with prost's own codec.
    tonic_prost_build::configure().build_server(false).compile_protos(&["proto/etcd/etcd.proto"], &["proto"])?;
    println!("cargo:rerun-if-env-changed=PROTOC");
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
