//! A Wharf server node.
//!
//! - `node`: startup, the local group registry, the reconciler that follows the catalog.
//! - `meta`, `stream_sm`, `consumer_sm`: the three kinds of replicated state machine.
//! - `stream_writer`, `stream_runtime`, `consumer_runtime`: what a group's
//!   leader runs (publish batching; config and expiry; sessions, dispatch and acks).
//! - `stream_admin`: stream edit, purge, get and delete of one message.
//! - `service`, `routing`, `forward`, `status`: the gRPC front end, and forwarding
//!   to whichever node leads the group a call needs.
//! - `error`: the crate's one error enum and its one conversion to gRPC status.

pub mod auth;
mod consumer_runtime;
mod consumer_sm;
mod convert;
pub mod error;
mod forward;
mod health;
pub mod meta;
mod node;
mod routing;
pub mod security;
mod service;
mod status;
mod stream_admin;
mod stream_runtime;
mod stream_sm;
mod stream_writer;
mod util;

pub use error::ServerError;
pub use node::{Node, NodeConfig};
pub use security::SecurityConfig;
pub use wharf_raft::RaftSettings;
