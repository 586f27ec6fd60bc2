//! Human and JSON renderings of API objects. JSON field names follow NATS'
//! StreamInfo and ConsumerInfo so existing tooling habits carry over.

use serde_json::{json, Value};
use wharf_client::{proto as pb, Message};

/// `1000` -> `1,000`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn limit(n: i64) -> String {
    if n < 0 {
        "unlimited".into()
    } else {
        thousands(n as u64)
    }
}

fn rows(title: &str, rows: &[(&str, String)]) -> String {
    let mut out = format!("{title}:\n\n");
    for (label, value) in rows {
        out.push_str(&format!("{label:>24}: {value}\n"));
    }
    out.push('\n');
    out
}

fn time(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn replicas(ids: &[u64]) -> String {
    ids.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn stream_json(info: &pb::StreamInfo) -> Value {
    let c = info.config.clone().unwrap_or_default();
    let s = info.state.clone().unwrap_or_default();
    let cl = info.cluster.clone().unwrap_or_default();
    json!({
        "config": {
            "name": c.name,
            "subjects": c.subjects,
            "retention": retention_name(c.retention),
            "num_replicas": c.replicas,
            "max_msgs": c.max_msgs,
            "max_bytes": c.max_bytes,
            "max_age": c.max_age_ms.saturating_mul(1_000_000),
            "max_msg_size": c.max_msg_size,
            "max_msgs_per_subject": c.max_msgs_per_subject,
            "discard": discard_name(c.discard),
            "duplicate_window": c.duplicate_window_ms.saturating_mul(1_000_000),
        },
        "created": time(info.created_ms),
        "state": stream_state_json(&s),
        "cluster": { "leader": cl.leader, "replicas": cl.replicas, "term": cl.term },
    })
}

pub fn stream_text(info: &pb::StreamInfo) -> String {
    let c = info.config.clone().unwrap_or_default();
    let s = info.state.clone().unwrap_or_default();
    let cl = info.cluster.clone().unwrap_or_default();
    let mut out = format!(
        "Information for Stream {} created {}\n\n",
        c.name,
        time(info.created_ms)
    );
    out += &rows(
        "Configuration",
        &[
            ("Subjects", c.subjects.join(", ")),
            ("Replicas", c.replicas.to_string()),
            ("Retention", capitalized(retention_name(c.retention))),
            ("Discard Policy", capitalized(discard_name(c.discard))),
            ("Duplicate Window", duration_ms(c.duplicate_window_ms)),
            ("Maximum Messages", limit(c.max_msgs)),
            ("Maximum Per Subject", limit(c.max_msgs_per_subject)),
            ("Maximum Bytes", limit(c.max_bytes)),
            (
                "Maximum Age",
                if c.max_age_ms == 0 {
                    "unlimited".into()
                } else {
                    format!("{}ms", c.max_age_ms)
                },
            ),
            (
                "Maximum Message Size",
                thousands(c.max_msg_size.max(0) as u64),
            ),
        ],
    );
    out += &rows(
        "Cluster Information",
        &[
            ("Leader", cl.leader.to_string()),
            ("Replicas", replicas(&cl.replicas)),
        ],
    );
    out += &rows(
        "State",
        &[
            ("Messages", thousands(s.messages)),
            ("Bytes", thousands(s.bytes)),
            ("First Sequence", thousands(s.first_seq)),
            ("Last Sequence", thousands(s.last_seq)),
            ("Active Consumers", s.consumer_count.to_string()),
            ("Number of Subjects", thousands(s.num_subjects)),
        ],
    );
    if !s.subjects.is_empty() {
        out += &subjects_text(&s);
    }
    out
}

fn retention_name(policy: i32) -> &'static str {
    match pb::RetentionPolicy::try_from(policy) {
        Ok(pb::RetentionPolicy::RetentionWorkqueue) => "workqueue",
        Ok(pb::RetentionPolicy::RetentionInterest) => "interest",
        _ => "limits",
    }
}

/// Headers sorted by name, one `Name: value` per line.
fn headers_text<'a>(headers: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut sorted: Vec<_> = headers.into_iter().collect();
    sorted.sort();
    sorted.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

fn discard_name(policy: i32) -> &'static str {
    match pb::DiscardPolicy::try_from(policy) {
        Ok(pb::DiscardPolicy::DiscardNew) => "new",
        _ => "old",
    }
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn duration_ms(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// NATS' `state` object; `subjects` (subject -> count) only when listed.
fn stream_state_json(s: &pb::StreamState) -> Value {
    let mut v = json!({
        "messages": s.messages,
        "bytes": s.bytes,
        "first_seq": s.first_seq,
        "last_seq": s.last_seq,
        "num_subjects": s.num_subjects,
        "consumer_count": s.consumer_count,
    });
    if !s.subjects.is_empty() {
        let map: serde_json::Map<String, Value> = (s.subjects.iter())
            .map(|c| (c.subject.clone(), c.messages.into()))
            .collect();
        v["subjects"] = Value::Object(map);
        if s.subjects_truncated {
            v["subjects_truncated"] = true.into();
        }
    }
    v
}

fn subjects_text(s: &pb::StreamState) -> String {
    let width = (s.subjects.iter())
        .map(|c| c.subject.len())
        .max()
        .unwrap_or(0)
        .max("Subject".len());
    let mut out = format!(
        "Subjects:

  {:<width$}  {:>12}
",
        "Subject", "Messages"
    );
    for c in &s.subjects {
        out += &format!(
            "  {:<width$}  {:>12}
",
            c.subject,
            thousands(c.messages)
        );
    }
    if s.subjects_truncated {
        out += &format!(
            "  ... {} subjects in all, only the first {} listed\n",
            thousands(s.num_subjects),
            s.subjects.len()
        );
    }
    out.push('\n');
    out
}

/// A stored message as `nats stream get --json` shows it (payload as text).
pub fn stored_message_json(m: &pb::StreamMessage) -> Value {
    json!({
        "subject": m.subject,
        "seq": m.seq,
        "time": time(m.published_ms),
        "data": String::from_utf8_lossy(&m.payload),
        "headers": m.headers,
    })
}

pub fn stored_message_text(stream: &str, m: &pb::StreamMessage) -> String {
    format!(
        "Item: {stream}#{} received {} on Subject {}\n\n{}{}{}\n",
        m.seq,
        time(m.published_ms),
        m.subject,
        headers_text(&m.headers),
        if m.headers.is_empty() { "" } else { "\n" },
        String::from_utf8_lossy(&m.payload)
    )
}

pub fn stream_table(streams: &[pb::StreamInfo]) -> String {
    if streams.is_empty() {
        return "No streams defined\n".into();
    }
    let mut out = format!(
        "{:<20} {:>12} {:>14} {:>10} {:>8}\n",
        "Name", "Messages", "Bytes", "Last Seq", "Leader"
    );
    for s in streams {
        let c = s.config.clone().unwrap_or_default();
        let st = s.state.clone().unwrap_or_default();
        let leader = s.cluster.as_ref().map(|c| c.leader).unwrap_or(0);
        out += &format!(
            "{:<20} {:>12} {:>14} {:>10} {:>8}\n",
            c.name,
            thousands(st.messages),
            thousands(st.bytes),
            thousands(st.last_seq),
            leader
        );
    }
    out
}

fn ack_policy_name(policy: i32) -> &'static str {
    match pb::AckPolicy::try_from(policy) {
        Ok(pb::AckPolicy::AckAll) => "All",
        Ok(pb::AckPolicy::AckNone) => "None",
        _ => "Explicit",
    }
}

fn deliver_policy_text(c: &pb::ConsumerConfig) -> String {
    match pb::DeliverPolicy::try_from(c.deliver_policy) {
        Ok(pb::DeliverPolicy::DeliverNew) => "New".into(),
        Ok(pb::DeliverPolicy::DeliverLast) => "Last".into(),
        Ok(pb::DeliverPolicy::DeliverLastPerSubject) => "Last Per Subject".into(),
        Ok(pb::DeliverPolicy::DeliverByStartSequence) => {
            format!("From Sequence {}", c.opt_start_seq)
        }
        Ok(pb::DeliverPolicy::DeliverByStartTime) => {
            format!("From Time {}", time(c.opt_start_time_ms))
        }
        _ => "All".into(),
    }
}

fn deliver_policy_json(c: &pb::ConsumerConfig) -> &'static str {
    match pb::DeliverPolicy::try_from(c.deliver_policy) {
        Ok(pb::DeliverPolicy::DeliverNew) => "new",
        Ok(pb::DeliverPolicy::DeliverLast) => "last",
        Ok(pb::DeliverPolicy::DeliverLastPerSubject) => "last_per_subject",
        Ok(pb::DeliverPolicy::DeliverByStartSequence) => "by_start_sequence",
        Ok(pb::DeliverPolicy::DeliverByStartTime) => "by_start_time",
        _ => "all",
    }
}

fn backoff_text(backoff_ms: &[u64]) -> String {
    if backoff_ms.is_empty() {
        return "none (Ack Wait applies)".into();
    }
    let steps: Vec<String> = backoff_ms
        .iter()
        .map(|ms| humantime::format_duration(std::time::Duration::from_millis(*ms)).to_string())
        .collect();
    steps.join(", ")
}

pub fn consumer_json(info: &pb::ConsumerInfo) -> Value {
    let c = info.config.clone().unwrap_or_default();
    let d = info.delivered.unwrap_or_default();
    let f = info.ack_floor.unwrap_or_default();
    let cl = info.cluster.clone().unwrap_or_default();
    json!({
        "stream_name": info.stream_name,
        "name": info.name,
        "created": time(info.created_ms),
        "config": {
            "durable_name": c.name,
            "filter_subject": c.filter_subject,
            "deliver_policy": deliver_policy_json(&c),
            "opt_start_seq": c.opt_start_seq,
            "opt_start_time": (c.opt_start_time_ms != 0).then(|| time(c.opt_start_time_ms)),
            "pause_until": (c.pause_until_ms != 0).then(|| time(c.pause_until_ms)),
            "metadata": c.metadata,
            "filter_subjects": c.filter_subjects,
            "inactive_threshold": c.inactive_threshold_ms.saturating_mul(1_000_000),
            "priority_policy": match pb::PriorityPolicy::try_from(c.priority_policy) {
                Ok(pb::PriorityPolicy::PriorityPinned) => "pinned_client",
                Ok(pb::PriorityPolicy::PriorityOverflow) => "overflow",
                _ => "none",
            },
            "ack_policy": ack_policy_name(c.ack_policy).to_lowercase(),
            "max_deliver": c.max_deliver,
            "backoff": c.backoff_ms.iter().map(|ms| ms.saturating_mul(1_000_000)).collect::<Vec<_>>(),
            "redeliver_on_disconnect": c.redeliver_on_disconnect,
            "ack_wait": c.ack_wait_ms.saturating_mul(1_000_000),
            "max_ack_pending": c.max_ack_pending,
            "max_waiting": c.max_waiting,
            "dead_letter_subject": (!c.dead_letter_subject.is_empty()).then_some(&c.dead_letter_subject),
        },
        "delivered": { "consumer_seq": d.consumer_seq, "stream_seq": d.stream_seq },
        "ack_floor": { "consumer_seq": f.consumer_seq, "stream_seq": f.stream_seq },
        "num_ack_pending": info.num_ack_pending,
        "num_redelivered": info.num_redelivered,
        "num_waiting": info.num_waiting,
        "num_pending": info.num_pending,
        "num_terminated": info.num_terminated,
        "paused": info.paused,
        "pause_remaining": info.pause_remaining_ms.saturating_mul(1_000_000),
        "num_max_delivered": info.num_exhausted,
        "num_dead_lettered": info.num_dead_lettered,
        "dead_letter_backlog": info.dead_letter_backlog,
        "cluster": { "leader": cl.leader, "replicas": cl.replicas, "term": cl.term },
    })
}

pub fn consumer_text(info: &pb::ConsumerInfo) -> String {
    let c = info.config.clone().unwrap_or_default();
    let d = info.delivered.unwrap_or_default();
    let f = info.ack_floor.unwrap_or_default();
    let cl = info.cluster.clone().unwrap_or_default();
    let mut out = format!(
        "Information for Consumer {} > {} created {}\n\n",
        info.stream_name,
        info.name,
        time(info.created_ms)
    );
    let filters: Vec<String> = std::iter::once(c.filter_subject.clone())
        .filter(|f| !f.is_empty())
        .chain(c.filter_subjects.iter().cloned())
        .collect();
    let filter = if filters.is_empty() {
        "(all subjects)".to_string()
    } else {
        filters.join(", ")
    };
    out += &rows(
        "Configuration",
        &[
            ("Name", c.name.clone()),
            ("Pull Mode", "true".into()),
            ("Filter Subject", filter),
            ("Ack Policy", ack_policy_name(c.ack_policy).into()),
            ("Ack Wait", format!("{:.2}s", c.ack_wait_ms as f64 / 1000.0)),
            ("Max Ack Pending", limit(c.max_ack_pending)),
            ("Max Waiting Pulls", thousands(c.max_waiting.max(0) as u64)),
            ("Max Deliver", limit(c.max_deliver)),
            ("Backoff", backoff_text(&c.backoff_ms)),
            (
                "Dead-Letter Subject",
                if c.dead_letter_subject.is_empty() {
                    "none".into()
                } else {
                    c.dead_letter_subject.clone()
                },
            ),
            (
                "Redeliver On Disconnect",
                c.redeliver_on_disconnect.to_string(),
            ),
            ("Deliver Policy", deliver_policy_text(&c)),
            (
                "Priority Policy",
                match pb::PriorityPolicy::try_from(c.priority_policy) {
                    Ok(pb::PriorityPolicy::PriorityPinned) => "Pinned",
                    Ok(pb::PriorityPolicy::PriorityOverflow) => "Overflow",
                    _ => "None",
                }
                .into(),
            ),
        ],
    );
    if !c.metadata.is_empty() {
        let mut meta: Vec<(&String, &String)> = c.metadata.iter().collect();
        meta.sort();
        let rows_meta: Vec<(&str, String)> = meta
            .iter()
            .map(|(k, v)| (k.as_str(), (*v).clone()))
            .collect();
        out += &rows("Metadata", &rows_meta);
    }
    out += &rows(
        "Cluster Information",
        &[
            ("Leader", cl.leader.to_string()),
            ("Replicas", replicas(&cl.replicas)),
        ],
    );
    let outstanding = if c.max_ack_pending < 0 {
        thousands(info.num_ack_pending)
    } else {
        format!(
            "{} out of maximum {}",
            thousands(info.num_ack_pending),
            thousands(c.max_ack_pending as u64)
        )
    };
    out += &rows(
        "State",
        &[
            (
                "Last Delivered Message",
                format!(
                    "Consumer sequence: {} Stream sequence: {}",
                    d.consumer_seq, d.stream_seq
                ),
            ),
            (
                "Acknowledgment Floor",
                format!(
                    "Consumer sequence: {} Stream sequence: {}",
                    f.consumer_seq, f.stream_seq
                ),
            ),
            ("Outstanding Acks", outstanding),
            ("Redelivered Messages", thousands(info.num_redelivered)),
            ("Terminated Messages", thousands(info.num_terminated)),
            ("Max Delivered Messages", thousands(info.num_exhausted)),
            ("Dead-Lettered Messages", thousands(info.num_dead_lettered)),
            ("Unprocessed Messages", thousands(info.num_pending)),
            (
                "Waiting Pulls",
                format!(
                    "{} of maximum {}",
                    thousands(info.num_waiting),
                    thousands(c.max_waiting.max(0) as u64)
                ),
            ),
        ],
    );
    out
}

pub fn consumer_table(consumers: &[pb::ConsumerInfo]) -> String {
    if consumers.is_empty() {
        return "No consumers defined\n".into();
    }
    let mut out = format!(
        "{:<20} {:>12} {:>12} {:>12} {:>8}\n",
        "Name", "Ack Pending", "Unprocessed", "Redelivered", "Leader"
    );
    for c in consumers {
        let leader = c.cluster.as_ref().map(|c| c.leader).unwrap_or(0);
        out += &format!(
            "{:<20} {:>12} {:>12} {:>12} {:>8}\n",
            c.name,
            thousands(c.num_ack_pending),
            thousands(c.num_pending),
            thousands(c.num_redelivered),
            leader
        );
    }
    out
}

pub fn message_json(m: &Message) -> Value {
    json!({
        "subject": m.subject,
        "stream_seq": m.stream_seq,
        "consumer_seq": m.consumer_seq,
        "delivered": m.delivered,
        "headers": m.headers,
        "payload": String::from_utf8_lossy(&m.payload),
    })
}

pub fn message_text(m: &Message) -> String {
    format!(
        "[{}] subject: {} stream sequence: {} consumer sequence: {} delivered: {}\n\n{}{}{}\n\n",
        time(m.published_ms),
        m.subject,
        m.stream_seq,
        m.consumer_seq,
        m.delivered,
        headers_text(&m.headers),
        if m.headers.is_empty() { "" } else { "\n" },
        String::from_utf8_lossy(&m.payload)
    )
}

pub fn cluster_json(s: &pb::ClusterStatusResponse) -> Value {
    json!({
        "answered_by": s.node_id,
        "nodes": s.nodes.iter().map(|n| json!({"id": n.id, "addr": n.addr, "up": n.up})).collect::<Vec<_>>(),
        "groups": s.groups.iter().map(|g| json!({
            "group_id": g.group_id, "kind": g.kind, "name": g.name, "leader": g.leader,
            "term": g.term, "replicas": g.replicas, "last_applied": g.last_applied,
            "local_role": g.local_role, "local_error": g.local_error,
        })).collect::<Vec<_>>(),
    })
}

pub fn cluster_text(s: &pb::ClusterStatusResponse) -> String {
    let mut out = format!(
        "Cluster status (as seen by node {})\n\nNodes:\n\n",
        s.node_id
    );
    for n in &s.nodes {
        out += &format!(
            "  {:>3}  {:<24} {}\n",
            n.id,
            n.addr,
            if n.up { "up" } else { "DOWN" }
        );
    }
    out += &format!(
        "\nGroups:\n\n  {:>5}  {:<9} {:<32} {:>6} {:>6}  {:<10} {}\n",
        "Group", "Kind", "Name", "Leader", "Term", "Here", "Replicas"
    );
    for g in &s.groups {
        let leader = if g.leader == 0 {
            "-".to_string()
        } else {
            g.leader.to_string()
        };
        let here = if g.local_role.is_empty() {
            "-"
        } else {
            g.local_role.as_str()
        };
        out += &format!(
            "  {:>5}  {:<9} {:<32} {:>6} {:>6}  {:<10} {}\n",
            g.group_id,
            g.kind,
            g.name,
            leader,
            g.term,
            here,
            replicas(&g.replicas)
        );
        if !g.local_error.is_empty() {
            out += &format!("         failed here: {}\n", g.local_error);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::thousands;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
