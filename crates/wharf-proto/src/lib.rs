//! Wharf's protobuf API (`proto/wharf/v1`), generated at build time.
//!
//! `v1` is the public API every client speaks; `raft` is the peer transport
//! that only nodes speak. Neither holds logic: conversions to domain types live
//! next to the code that owns those types.

#![allow(clippy::all)]

/// The encoded `FileDescriptorSet` of `wharf.v1` and `wharf.v1.raft`, for
/// gRPC server reflection (`tonic-reflection`).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("wharf_descriptor");

pub mod v1 {
    tonic::include_proto!("wharf.v1");

    /// Response header of a `Consume` call: the address, as the cluster
    /// knows it, of the node leading the consumer, so a client that has it
    /// among its seeds can attach there and skip the relay hop.
    pub const CONSUMER_LEADER_HEADER: &str = "x-wharf-consumer-leader";

    pub mod raft {
        tonic::include_proto!("wharf.v1.raft");
    }
}
