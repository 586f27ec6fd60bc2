//! Generates the gRPC code with a vendored protoc, so a build needs only cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        proto_dir.join("wharf/v1/wharf.proto"),
        proto_dir.join("wharf/v1/raft.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.bytes(["."]);
    tonic_prost_build::configure().compile_with_config(config, &files, &[proto_dir])?;
    Ok(())
}
