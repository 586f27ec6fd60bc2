//! Conversions between the protobuf API and the domain types.
//!
//! Wire defaults (0 = "the default") are resolved here by `with_defaults`, so
//! everything past this module sees complete configurations.

use wharf_core::consumer::{AckPolicy, ConsumerConfig, DeliverPolicy, PriorityPolicy};
use wharf_core::stream::{DiscardPolicy, RetentionPolicy, StreamConfig};
use wharf_proto::v1 as pb;

use crate::error::{Result, ServerError};

pub fn stream_config_from_pb(c: Option<pb::StreamConfig>) -> Result<StreamConfig> {
    let c = c.ok_or_else(|| ServerError::Invalid("stream config is required".into()))?;
    let replicas = u8::try_from(c.replicas)
        .map_err(|_| ServerError::Invalid("replicas must be 1 or 3".into()))?;
    let config = StreamConfig {
        name: c.name,
        subjects: c.subjects,
        replicas,
        max_msgs: c.max_msgs,
        max_bytes: c.max_bytes,
        max_age_ms: c.max_age_ms,
        max_msg_size: c.max_msg_size,
        max_msgs_per_subject: c.max_msgs_per_subject,
        discard: match pb::DiscardPolicy::try_from(c.discard) {
            Ok(pb::DiscardPolicy::DiscardOld) => DiscardPolicy::Old,
            Ok(pb::DiscardPolicy::DiscardNew) => DiscardPolicy::New,
            Err(_) => {
                return Err(ServerError::Invalid(format!(
                    "unknown discard policy {}",
                    c.discard
                )))
            }
        },
        duplicate_window_ms: c.duplicate_window_ms,
        retention: match pb::RetentionPolicy::try_from(c.retention) {
            Ok(pb::RetentionPolicy::RetentionLimits) => RetentionPolicy::Limits,
            Ok(pb::RetentionPolicy::RetentionWorkqueue) => RetentionPolicy::WorkQueue,
            Ok(pb::RetentionPolicy::RetentionInterest) => RetentionPolicy::Interest,
            Err(_) => {
                return Err(ServerError::Invalid(format!(
                    "unknown retention policy {}",
                    c.retention
                )))
            }
        },
    }
    .with_defaults();
    config.validate()?;
    Ok(config)
}

pub fn stream_config_to_pb(c: &StreamConfig) -> pb::StreamConfig {
    pb::StreamConfig {
        name: c.name.clone(),
        subjects: c.subjects.clone(),
        replicas: c.replicas as u32,
        max_msgs: c.max_msgs,
        max_bytes: c.max_bytes,
        max_age_ms: c.max_age_ms,
        max_msg_size: c.max_msg_size,
        max_msgs_per_subject: c.max_msgs_per_subject,
        discard: match c.discard {
            DiscardPolicy::Old => pb::DiscardPolicy::DiscardOld,
            DiscardPolicy::New => pb::DiscardPolicy::DiscardNew,
        } as i32,
        duplicate_window_ms: c.duplicate_window_ms,
        retention: match c.retention {
            RetentionPolicy::Limits => pb::RetentionPolicy::RetentionLimits,
            RetentionPolicy::WorkQueue => pb::RetentionPolicy::RetentionWorkqueue,
            RetentionPolicy::Interest => pb::RetentionPolicy::RetentionInterest,
        } as i32,
    }
}

pub fn consumer_config_from_pb(c: Option<pb::ConsumerConfig>) -> Result<ConsumerConfig> {
    let c = c.ok_or_else(|| ServerError::Invalid("consumer config is required".into()))?;
    let filter = if c.filter_subject.is_empty() {
        None
    } else {
        Some(c.filter_subject)
    };
    let ack_policy = match pb::AckPolicy::try_from(c.ack_policy) {
        Ok(pb::AckPolicy::AckExplicit) => AckPolicy::Explicit,
        Ok(pb::AckPolicy::AckAll) => AckPolicy::All,
        Ok(pb::AckPolicy::AckNone) => AckPolicy::None,
        Err(_) => {
            return Err(ServerError::Invalid(format!(
                "unknown ack policy {}",
                c.ack_policy
            )))
        }
    };
    let deliver_policy = match pb::DeliverPolicy::try_from(c.deliver_policy) {
        Ok(pb::DeliverPolicy::DeliverAll) => DeliverPolicy::All,
        Ok(pb::DeliverPolicy::DeliverNew) => DeliverPolicy::New,
        Ok(pb::DeliverPolicy::DeliverLast) => DeliverPolicy::Last,
        Ok(pb::DeliverPolicy::DeliverLastPerSubject) => DeliverPolicy::LastPerSubject,
        Ok(pb::DeliverPolicy::DeliverByStartSequence) => DeliverPolicy::ByStartSeq(c.opt_start_seq),
        Ok(pb::DeliverPolicy::DeliverByStartTime) => {
            DeliverPolicy::ByStartTime(c.opt_start_time_ms)
        }
        Err(_) => {
            return Err(ServerError::Invalid(format!(
                "unknown deliver policy {}",
                c.deliver_policy
            )))
        }
    };
    let config = ConsumerConfig {
        name: c.name,
        filter_subject: filter,
        ack_wait_ms: c.ack_wait_ms,
        max_ack_pending: c.max_ack_pending,
        max_waiting: c.max_waiting,
        ack_policy,
        max_deliver: c.max_deliver,
        backoff_ms: c.backoff_ms,
        redeliver_on_disconnect: c.redeliver_on_disconnect,
        deliver_policy,
        pause_until_ms: c.pause_until_ms.max(0),
        metadata: c.metadata.into_iter().collect(),
        filter_subjects: c.filter_subjects,
        inactive_threshold_ms: c.inactive_threshold_ms,
        dead_letter_subject: (!c.dead_letter_subject.is_empty()).then_some(c.dead_letter_subject),
        priority_policy: match pb::PriorityPolicy::try_from(c.priority_policy) {
            Ok(pb::PriorityPolicy::PriorityNone) => PriorityPolicy::None,
            Ok(pb::PriorityPolicy::PriorityPinned) => PriorityPolicy::Pinned,
            Ok(pb::PriorityPolicy::PriorityOverflow) => PriorityPolicy::Overflow,
            Err(_) => {
                return Err(ServerError::Invalid(format!(
                    "unknown priority policy {}",
                    c.priority_policy
                )))
            }
        },
    }
    .with_defaults();
    config.validate()?;
    Ok(config)
}

pub fn consumer_config_to_pb(c: &ConsumerConfig) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        name: c.name.clone(),
        filter_subject: c.filter_subject.clone().unwrap_or_default(),
        ack_wait_ms: c.ack_wait_ms,
        max_ack_pending: c.max_ack_pending,
        max_waiting: c.max_waiting,
        ack_policy: match c.ack_policy {
            AckPolicy::Explicit => pb::AckPolicy::AckExplicit,
            AckPolicy::All => pb::AckPolicy::AckAll,
            AckPolicy::None => pb::AckPolicy::AckNone,
        } as i32,
        max_deliver: c.max_deliver,
        backoff_ms: c.backoff_ms.clone(),
        redeliver_on_disconnect: c.redeliver_on_disconnect,
        deliver_policy: match c.deliver_policy {
            DeliverPolicy::All => pb::DeliverPolicy::DeliverAll,
            DeliverPolicy::New => pb::DeliverPolicy::DeliverNew,
            DeliverPolicy::Last => pb::DeliverPolicy::DeliverLast,
            DeliverPolicy::LastPerSubject => pb::DeliverPolicy::DeliverLastPerSubject,
            DeliverPolicy::ByStartSeq(_) => pb::DeliverPolicy::DeliverByStartSequence,
            DeliverPolicy::ByStartTime(_) => pb::DeliverPolicy::DeliverByStartTime,
        } as i32,
        opt_start_seq: match c.deliver_policy {
            DeliverPolicy::ByStartSeq(s) => s,
            _ => 0,
        },
        opt_start_time_ms: match c.deliver_policy {
            DeliverPolicy::ByStartTime(t) => t,
            _ => 0,
        },
        pause_until_ms: c.pause_until_ms,
        metadata: c.metadata.clone().into_iter().collect(),
        filter_subjects: c.filter_subjects.clone(),
        inactive_threshold_ms: c.inactive_threshold_ms,
        dead_letter_subject: c.dead_letter_subject.clone().unwrap_or_default(),
        priority_policy: match c.priority_policy {
            PriorityPolicy::None => pb::PriorityPolicy::PriorityNone,
            PriorityPolicy::Pinned => pb::PriorityPolicy::PriorityPinned,
            PriorityPolicy::Overflow => pb::PriorityPolicy::PriorityOverflow,
        } as i32,
    }
}
