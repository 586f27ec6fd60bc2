//! Generates the gRPC code with a vendored protoc, so a build needs only cargo,
//! and the encoded file descriptor set that server reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time: a build script binary may be reused from a checkout
    // at another path (same target dir), so a compile-time path could be stale.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let proto_dir = std::path::Path::new(&manifest_dir).join("../../proto");
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
    // The encoded descriptors of both files, for gRPC server reflection.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("wharf_descriptor.bin"))
        .compile_with_config(config, &files, &[proto_dir])?;
    Ok(())
}
