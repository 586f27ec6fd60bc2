//! A Wharf server node.
//!
//! - `node`: startup, the local group registry, the reconciler that follows the catalog.
//! - `meta`, `stream_sm`, `consumer_sm`: the three kinds of replicated state machine.
//! - `stream_writer`, `stream_runtime`, `consumer_runtime`: what a group's
//!   leader runs (publish batching; config and expiry; sessions, dispatch and acks).
//! - `bootstrap`, `membership`, `meta_nodes`, `replica_mover`, `removal`: the
//!   cluster's node set (`peer add`, `peer remove`, joining), moving replicas
//!   off a removed node, and a removed node stopping itself.
//! - `stream_admin`: stream edit, purge, get and delete of one message.
//! - `service`, `routing`, `forward`, `status`: the gRPC front end, and forwarding
//!   to whichever node leads the group a call needs.
//! - `error`: the crate's one error enum and its one conversion to gRPC status.
//! - `metrics`, `metrics_text`, `metrics_http`, `grpc_metrics`: Prometheus
//!   `/metrics` on its own port, and the gRPC call metrics layer.
//! - `health`, `reflection`: the standard gRPC health and reflection services.
//! - `limits`, `conn_limit`, `request_check`: server-wide limits, per-client
//!   connection and pull-session counts, stateless request validation
//!   (`fuzzing` runs it on arbitrary bytes; see `fuzz/`).

mod ack_window;
pub mod auth;
mod bootstrap;
mod conn_limit;
mod consumer_runtime;
mod consumer_sm;
mod convert;
mod dead_letter;
pub mod error;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod grpc_metrics;
mod headers;
mod health;
pub mod limits;
mod membership;
pub mod meta;
mod meta_nodes;
pub mod metrics;
mod metrics_http;
pub mod metrics_text;
mod node;
mod payload_blocks;
mod publish_pipe;
mod publish_session;
mod reflection;
mod removal;
mod replica_mover;
pub mod request_check;
mod routing;
pub mod security;
mod service;
mod sessions;
mod status;
mod stream_admin;
mod stream_end;
mod stream_retention;
mod stream_runtime;
mod stream_sm;
mod stream_writer;
mod util;

pub use error::ServerError;
pub use limits::Limits;
pub use node::{Node, NodeConfig};
pub use security::SecurityConfig;
pub use wharf_raft::{RaftSettings, DEFAULT_CACHE_BYTES};
