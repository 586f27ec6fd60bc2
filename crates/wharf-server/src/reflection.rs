//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), so tools such
//! as grpcurl can list and call the API without the `.proto` files.
//!
//! It describes the public `wharf.v1.Wharf` service and `grpc.health.v1.Health`.
//! The peer Raft transport shares the port but is left out of the listing:
//! only nodes speak it.

use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};
use tonic_reflection::server::v1alpha::{
    ServerReflection as AlphaReflection, ServerReflectionServer as AlphaServer,
};

/// Services listed by reflection.
pub const LISTED: [&str; 2] = ["wharf.v1.Wharf", "grpc.health.v1.Health"];

/// Both versions of the reflection service: v1, and v1alpha for older
/// clients. `None` (logged) if the compiled-in descriptors fail to decode, a
/// build defect that should cost reflection, not the node.
pub fn services() -> Option<(
    ServerReflectionServer<impl ServerReflection>,
    AlphaServer<impl AlphaReflection>,
)> {
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(wharf_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        for name in LISTED {
            b = b.with_service_name(name);
        }
        b
    };
    match (builder().build_v1(), builder().build_v1alpha()) {
        (Ok(v1), Ok(alpha)) => Some((v1, alpha)),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!("gRPC reflection disabled: {e}");
            None
        }
    }
}
