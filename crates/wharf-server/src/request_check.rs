//! Validation of public requests, callable without a running node.
//!
//! The handlers in `service` call these before doing anything, and the fuzz
//! targets (`fuzz/`) and the corpus replay test call the same functions on
//! arbitrary decoded bytes. Each returns the `ServerError` the client sees.
//!
//! Invariants: pure (no I/O, no clock), never panics on any input, and its
//! cost is bounded by the request's size (subject and filter counts are
//! capped before any quadratic overlap check runs).
//!
//! Left out: checks that need state (does the stream exist, do subjects
//! overlap another stream's): those happen in the meta state machine.

use wharf_core::consumer::ConsumerConfig;
use wharf_core::stream::StreamConfig;
use wharf_core::subject::{validate_name, validate_subject};
use wharf_proto::v1 as pb;

use crate::convert::{consumer_config_from_pb, stream_config_from_pb};
use crate::error::{Result, ServerError};
use crate::limits::{Limits, MAX_MSG_ID_BYTES};

/// A publish: a valid subject, a payload within `max_message_bytes`, a
/// bounded deduplication id.
pub fn check_publish(limits: &Limits, msg: &pb::PublishRequest) -> Result<()> {
    validate_subject(&msg.subject)?;
    if msg.payload.len() > limits.max_message_bytes as usize {
        return Err(ServerError::Invalid(format!(
            "message size {} exceeds the server's maximum: max_message_bytes is {}",
            msg.payload.len(),
            limits.max_message_bytes
        )));
    }
    if msg.msg_id.len() > MAX_MSG_ID_BYTES {
        return Err(ServerError::Invalid(format!(
            "message id is {} bytes; the maximum is {MAX_MSG_ID_BYTES}",
            msg.msg_id.len()
        )));
    }
    crate::headers::validate(&msg.headers)
}

/// A stream add or update: a valid configuration whose `max_msg_size`, when
/// given, fits the server's `max_message_bytes`.
pub fn check_add_stream(limits: &Limits, msg: &pb::AddStreamRequest) -> Result<StreamConfig> {
    let asked = msg.config.as_ref().map_or(0, |c| c.max_msg_size);
    let config = stream_config_from_pb(msg.config.clone())?;
    if asked > 0 && asked as u32 > limits.max_message_bytes {
        return Err(ServerError::Invalid(format!(
            "max_msg_size {asked} exceeds the server's maximum: max_message_bytes is {}",
            limits.max_message_bytes
        )));
    }
    Ok(config)
}

/// A consumer add or update: a valid stream name and configuration.
pub fn check_add_consumer(msg: &pb::AddConsumerRequest) -> Result<ConsumerConfig> {
    validate_name("stream", &msg.stream)?;
    consumer_config_from_pb(msg.config.clone())
}

/// Acks one pull may carry ("ack next").
pub const MAX_ACKS_PER_PULL: usize = 4096;

/// A pull: a batch of 1 to `max_pull_batch`, `max_bytes` within
/// `max_pull_bytes`, at most `MAX_ACKS_PER_PULL` acks, each of a known kind.
pub fn check_pull(limits: &Limits, pull: &pb::PullRequest) -> Result<()> {
    if pull.acks.len() > MAX_ACKS_PER_PULL {
        return Err(ServerError::Invalid(format!(
            "a pull carries at most {MAX_ACKS_PER_PULL} acks, got {}",
            pull.acks.len()
        )));
    }
    for ack in &pull.acks {
        check_ack(ack)?;
    }
    if pull.batch == 0 || pull.batch > limits.max_pull_batch {
        return Err(ServerError::Invalid(format!(
            "pull batch must be 1 to {}, got {}: max_pull_batch is {}",
            limits.max_pull_batch, pull.batch, limits.max_pull_batch
        )));
    }
    if pull.max_bytes > limits.max_pull_bytes {
        return Err(ServerError::Invalid(format!(
            "pull max_bytes {} exceeds the server's maximum: max_pull_bytes is {}",
            pull.max_bytes, limits.max_pull_bytes
        )));
    }
    Ok(())
}

/// An ack: a kind this server knows.
pub fn check_ack(ack: &pb::AckRequest) -> Result<()> {
    pb::AckKind::try_from(ack.kind)
        .map(|_| ())
        .map_err(|_| ServerError::Invalid(format!("unknown ack kind {}", ack.kind)))
}

/// The opening message of a Consume session: names that could exist.
pub fn check_consume_open(open: &pb::ConsumeOpen) -> Result<()> {
    validate_name("stream", &open.stream)?;
    validate_name("consumer", &open.consumer)?;
    Ok(())
}

/// One message of a Consume session after the opening one.
pub fn check_consume_request(limits: &Limits, req: &pb::ConsumeRequest) -> Result<()> {
    match &req.kind {
        Some(pb::consume_request::Kind::Pull(pull)) => check_pull(limits, pull),
        Some(pb::consume_request::Kind::Ack(ack)) => check_ack(ack),
        Some(pb::consume_request::Kind::Open(open)) => check_consume_open(open),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_message_bytes: 100,
            max_pull_batch: 10,
            max_pull_bytes: 1000,
            ..Limits::default()
        }
    }

    #[test]
    fn publish_limits_name_the_setting() {
        let msg = |n: usize| pb::PublishRequest {
            subject: "a.b".into(),
            payload: vec![0; n].into(),
            msg_id: String::new(),
            headers: Default::default(),
        };
        assert_eq!(check_publish(&limits(), &msg(100)), Ok(()));
        let e = check_publish(&limits(), &msg(101)).unwrap_err().to_string();
        assert!(e.contains("max_message_bytes is 100"), "{e}");
        let long_id = pb::PublishRequest {
            msg_id: "x".repeat(MAX_MSG_ID_BYTES + 1),
            ..msg(1)
        };
        assert!(check_publish(&limits(), &long_id).is_err());
    }

    #[test]
    fn pull_limits_name_the_setting() {
        let pull = |batch, max_bytes| pb::PullRequest {
            batch,
            max_bytes,
            ..Default::default()
        };
        assert_eq!(check_pull(&limits(), &pull(10, 1000)), Ok(()));
        let e = check_pull(&limits(), &pull(11, 0)).unwrap_err().to_string();
        assert!(e.contains("max_pull_batch is 10"), "{e}");
        let e = check_pull(&limits(), &pull(1, 1001))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_pull_bytes is 1000"), "{e}");
        assert!(check_pull(&limits(), &pull(0, 0)).is_err());
    }

    #[test]
    fn acks_riding_in_a_pull_are_bounded_and_of_known_kinds() {
        let pull = |acks: Vec<pb::AckRequest>| pb::PullRequest {
            batch: 1,
            acks,
            ..Default::default()
        };
        let ack = pb::AckRequest::default();
        assert_eq!(
            check_pull(&limits(), &pull(vec![ack.clone(); MAX_ACKS_PER_PULL])),
            Ok(())
        );
        let e = check_pull(&limits(), &pull(vec![ack.clone(); MAX_ACKS_PER_PULL + 1]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 4096 acks"), "{e}");
        let odd = pb::AckRequest { kind: 9, ..ack };
        let e = check_pull(&limits(), &pull(vec![odd]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown ack kind 9"), "{e}");
    }

    #[test]
    fn stream_max_msg_size_fits_the_server() {
        let req = |max_msg_size| pb::AddStreamRequest {
            config: Some(pb::StreamConfig {
                name: "S".into(),
                subjects: vec!["s.>".into()],
                max_msg_size,
                ..Default::default()
            }),
        };
        assert!(check_add_stream(&limits(), &req(0)).is_ok());
        assert!(check_add_stream(&limits(), &req(100)).is_ok());
        let e = check_add_stream(&limits(), &req(101))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_message_bytes is 100"), "{e}");
    }
}
