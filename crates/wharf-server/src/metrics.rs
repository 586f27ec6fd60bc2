//! The node's Prometheus metrics: what `/metrics` shows.
//!
//! A scrape reads the state the node already keeps, nothing is counted on
//! the hot paths except gRPC calls (see `grpc_metrics`):
//! - per stream replica on this node: messages, bytes, first and last
//!   sequence; `wharf_stream_last_seq` only grows, so its `rate()` is the
//!   stored publish rate;
//! - per consumer replica: pending (unprocessed), ack pending (outstanding),
//!   redelivered, delivered and ack-floor sequences; waiting pulls only from
//!   the leader, which alone holds them;
//! - per Raft group (meta, every stream and consumer group here): role, term,
//!   leader, last log, commit and applied index, leader changes;
//! - the node: ready (as gRPC health reports it).
//!
//! Every replica reports its own copy, labeled `role="leader"` or
//! `"follower"`; sum or filter on `role="leader"` across nodes, never add
//! replicas. Label values are stream, consumer and group names, so series are
//! bounded by what the catalog holds.
//!
//! Invariant: rendering takes one state lock at a time (consumer before
//! stream, as `consumer_info` does) and never awaits while holding one.
//!
//! Left out: per-subject counts, histograms of message age, process metrics.

use std::sync::atomic::Ordering;

use wharf_raft::{Group, GroupStatus, Role};

use crate::meta::META_GROUP;
use crate::metrics_text::{Exposition, Kind};
use crate::node::NodeInner;

/// One stream replica.
#[derive(Clone, Debug, Default)]
pub struct StreamSample {
    pub stream: String,
    pub role: &'static str,
    pub messages: u64,
    pub bytes: u64,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// One consumer replica.
#[derive(Clone, Debug, Default)]
pub struct ConsumerSample {
    pub stream: String,
    pub consumer: String,
    pub role: &'static str,
    pub num_pending: u64,
    pub num_ack_pending: u64,
    pub num_redelivered: u64,
    /// Only the leader holds waiting pulls.
    pub num_waiting: Option<u64>,
    pub delivered_consumer_seq: u64,
    pub delivered_stream_seq: u64,
    pub ack_floor_consumer_seq: u64,
    pub ack_floor_stream_seq: u64,
}

/// One Raft group on this node.
#[derive(Clone, Debug)]
pub struct GroupSample {
    pub group_id: u64,
    pub kind: &'static str,
    pub name: String,
    pub status: GroupStatus,
}

/// Everything one scrape shows, apart from gRPC calls.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub node_id: u64,
    pub ready: bool,
    pub streams: Vec<StreamSample>,
    pub consumers: Vec<ConsumerSample>,
    pub groups: Vec<GroupSample>,
}

fn role_label(role: &Role) -> &'static str {
    crate::status::role_name(role)
}

/// Every value `role_label` can return, so a `wharf_raft_role` state set
/// always has exactly one series at 1 (a failed group included).
const ROLES: [&str; 6] = [
    "leader",
    "follower",
    "candidate",
    "learner",
    "shutdown",
    "failed",
];

/// Read the node's state into a [`Snapshot`].
pub(crate) fn collect(node: &NodeInner) -> Snapshot {
    let catalog = node.catalog();
    let mut snap = Snapshot {
        node_id: node.id(),
        ready: crate::health::ready(node),
        ..Snapshot::default()
    };
    let group = |g: &Group, kind, name: String| GroupSample {
        group_id: g.id(),
        kind,
        name,
        status: g.status(),
    };
    snap.groups
        .push(group(&node.meta, "meta", "meta".to_string()));
    debug_assert_eq!(node.meta.id(), META_GROUP);
    let (streams, consumers) = match node.local.lock() {
        Ok(l) => (
            l.streams
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>(),
            l.consumers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>(),
        ),
        Err(_) => return snap,
    };
    for (name, local) in &streams {
        // A replica the catalog no longer lists is being removed.
        if !catalog.streams.contains_key(name) {
            continue;
        }
        let g = group(&local.group, "stream", name.clone());
        let role = role_label(&g.status.role);
        if let Ok(sm) = local.sm.lock() {
            let stats = sm.state().stats();
            snap.streams.push(StreamSample {
                stream: name.clone(),
                role,
                messages: stats.messages,
                bytes: stats.bytes,
                first_seq: stats.first_seq,
                last_seq: stats.last_seq,
            });
        }
        snap.groups.push(g);
    }
    for ((stream, name), local) in &consumers {
        if !catalog
            .consumers
            .contains_key(&(stream.clone(), name.clone()))
        {
            continue;
        }
        let g = group(&local.group, "consumer", format!("{stream}/{name}"));
        let leader = g.status.role == Role::Leader;
        let stream_local = streams.iter().find(|(s, _)| s == stream).map(|(_, l)| l);
        let sample = local.sm.lock().ok().map(|c| {
            let state = c.state();
            let delivered = state.delivered();
            let floor = state.ack_floor();
            let num_pending = stream_local
                .and_then(|s| s.sm.lock().ok())
                .map(|s| state.num_pending(s.state()))
                .unwrap_or(0);
            ConsumerSample {
                stream: stream.clone(),
                consumer: name.clone(),
                role: role_label(&g.status.role),
                num_pending,
                num_ack_pending: state.num_ack_pending(),
                num_redelivered: state.num_redelivered(),
                num_waiting: leader.then(|| local.runtime.num_waiting.load(Ordering::Relaxed)),
                delivered_consumer_seq: delivered.consumer_seq,
                delivered_stream_seq: delivered.stream_seq,
                ack_floor_consumer_seq: floor.consumer_seq,
                ack_floor_stream_seq: floor.stream_seq,
            }
        });
        snap.consumers.extend(sample);
        snap.groups.push(g);
    }
    snap.streams.sort_by(|a, b| a.stream.cmp(&b.stream));
    snap.consumers
        .sort_by(|a, b| (&a.stream, &a.consumer).cmp(&(&b.stream, &b.consumer)));
    snap.groups.sort_by_key(|g| g.group_id);
    snap
}

/// Render a snapshot (and then the gRPC families) as Prometheus text.
pub fn render(snap: &Snapshot, grpc: Option<&crate::grpc_metrics::GrpcMetrics>) -> String {
    let mut e = Exposition::new();
    let node_id = snap.node_id.to_string();
    e.family(
        "wharf_node_ready",
        "1 when this node has joined the cluster and caught up (gRPC health `ready` SERVING).",
        Kind::Gauge,
    );
    e.sample(
        "wharf_node_ready",
        &[("node_id", node_id.as_str())],
        u64::from(snap.ready),
    );

    render_streams(&mut e, &snap.streams);
    render_consumers(&mut e, &snap.consumers);
    render_groups(&mut e, &snap.groups);
    if let Some(grpc) = grpc {
        grpc.render(&mut e);
    }
    e.finish()
}

type StreamField = fn(&StreamSample) -> u64;

fn render_streams(e: &mut Exposition, streams: &[StreamSample]) {
    let families: [(&str, &str, StreamField); 4] = [
        (
            "wharf_stream_messages",
            "Messages stored in the stream (this replica).",
            |s| s.messages,
        ),
        (
            "wharf_stream_bytes",
            "Bytes of the messages stored in the stream (this replica).",
            |s| s.bytes,
        ),
        (
            "wharf_stream_first_seq",
            "Sequence of the oldest stored message.",
            |s| s.first_seq,
        ),
        (
            "wharf_stream_last_seq",
            "Sequence of the newest message ever stored; only grows, so rate() is the publish rate.",
            |s| s.last_seq,
        ),
    ];
    for (name, help, field) in families {
        e.family(name, help, Kind::Gauge);
        for s in streams {
            e.sample(
                name,
                &[("stream", s.stream.as_str()), ("role", s.role)],
                field(s),
            );
        }
    }
}

type ConsumerField = fn(&ConsumerSample) -> Option<u64>;

fn render_consumers(e: &mut Exposition, consumers: &[ConsumerSample]) {
    let families: [(&str, &str, ConsumerField); 8] = [
        (
            "wharf_consumer_num_pending",
            "Messages matching the consumer not yet delivered (consumer info: Unprocessed Messages).",
            |c| Some(c.num_pending),
        ),
        (
            "wharf_consumer_num_ack_pending",
            "Messages delivered and not yet acknowledged (consumer info: Outstanding Acks).",
            |c| Some(c.num_ack_pending),
        ),
        (
            "wharf_consumer_num_redelivered",
            "Messages delivered more than once, each counted at its second delivery; only grows (Redelivered Messages).",
            |c| Some(c.num_redelivered),
        ),
        (
            "wharf_consumer_num_waiting",
            "Pull requests waiting for messages (Waiting Pulls); reported by the leader only.",
            |c| c.num_waiting,
        ),
        (
            "wharf_consumer_delivered_consumer_seq",
            "Consumer sequence of the last delivery; counts every delivery, redeliveries too.",
            |c| Some(c.delivered_consumer_seq),
        ),
        (
            "wharf_consumer_delivered_stream_seq",
            "Stream sequence of the last message delivered.",
            |c| Some(c.delivered_stream_seq),
        ),
        (
            "wharf_consumer_ack_floor_consumer_seq",
            "Consumer sequence below which every delivery is acknowledged.",
            |c| Some(c.ack_floor_consumer_seq),
        ),
        (
            "wharf_consumer_ack_floor_stream_seq",
            "Stream sequence below which every message is acknowledged.",
            |c| Some(c.ack_floor_stream_seq),
        ),
    ];
    for (name, help, field) in families {
        e.family(name, help, Kind::Gauge);
        for c in consumers {
            if let Some(v) = field(c) {
                let labels = [
                    ("stream", c.stream.as_str()),
                    ("consumer", c.consumer.as_str()),
                    ("role", c.role),
                ];
                e.sample(name, &labels, v);
            }
        }
    }
}

type GroupField = fn(&GroupStatus) -> u64;

fn render_groups(e: &mut Exposition, groups: &[GroupSample]) {
    let families: [(&str, &str, Kind, GroupField); 9] = [
        (
            "wharf_raft_term",
            "Current Raft term of the group.",
            Kind::Gauge,
            |s| s.term,
        ),
        (
            "wharf_raft_leader_id",
            "Node id of the leader known here (0 when none).",
            Kind::Gauge,
            |s| s.leader.unwrap_or(0),
        ),
        (
            "wharf_raft_last_log_index",
            "Index of the last entry in this node's log of the group.",
            Kind::Gauge,
            |s| s.last_log_index,
        ),
        (
            "wharf_raft_commit_index",
            "Index of the last entry known committed here.",
            Kind::Gauge,
            |s| s.committed,
        ),
        (
            "wharf_raft_applied_index",
            "Index of the last entry applied to this node's state machine.",
            Kind::Gauge,
            |s| s.last_applied,
        ),
        (
            "wharf_raft_snapshot_index",
            "Index of the last entry in this node's latest snapshot of the group (0 when none).",
            Kind::Gauge,
            |s| s.snapshot_index,
        ),
        (
            "wharf_raft_log_entries",
            "Entries in this node's Raft log of the group (not yet purged after a snapshot).",
            Kind::Gauge,
            |s| s.last_log_index.saturating_sub(s.purged_index),
        ),
        (
            "wharf_raft_voters",
            "Voters in the group's membership.",
            Kind::Gauge,
            |s| s.voters.len() as u64,
        ),
        (
            "wharf_raft_leader_changes_total",
            "Times this node saw the group's leader change (a first leader counts) since the group started here.",
            Kind::Counter,
            |s| s.leader_changes,
        ),
    ];
    let labels_of = |g: &GroupSample| {
        (
            g.group_id.to_string(),
            g.kind,
            g.name.clone(),
            role_label(&g.status.role),
        )
    };
    let rows: Vec<_> = groups.iter().map(|g| (g, labels_of(g))).collect();
    e.family(
        "wharf_raft_role",
        "1 for this node's role in the group, 0 for the other roles.",
        Kind::Gauge,
    );
    for (_, (id, kind, name, role)) in &rows {
        for r in ROLES {
            let labels = [
                ("group_id", id.as_str()),
                ("kind", *kind),
                ("name", name.as_str()),
                ("role", r),
            ];
            e.sample("wharf_raft_role", &labels, u64::from(r == *role));
        }
    }
    for (metric, help, kind, field) in families {
        e.family(metric, help, kind);
        for (g, (id, kind, name, _)) in &rows {
            let labels = [
                ("group_id", id.as_str()),
                ("kind", *kind),
                ("name", name.as_str()),
            ];
            e.sample(metric, &labels, field(&g.status));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: Role, leader: Option<u64>) -> GroupStatus {
        GroupStatus {
            group_id: 7,
            role,
            leader,
            term: 3,
            last_log_index: 12,
            committed: 11,
            last_applied: 10,
            snapshot_index: 0,
            purged_index: 0,
            voters: vec![1, 2, 3],
            learners: vec![],
            leader_changes: 2,
            error: None,
        }
    }

    #[test]
    fn every_role_has_a_state_set_series() {
        for role in [
            Role::Leader,
            Role::Follower,
            Role::Candidate,
            Role::Learner,
            Role::Shutdown,
            Role::Failed,
        ] {
            assert!(ROLES.contains(&role_label(&role)), "{role:?}");
        }
    }

    #[test]
    fn renders_streams_consumers_groups_and_leader_only_waiting() {
        let snap = Snapshot {
            node_id: 2,
            ready: true,
            streams: vec![StreamSample {
                stream: "ORDERS".into(),
                role: "leader",
                messages: 6,
                bytes: 600,
                first_seq: 1,
                last_seq: 6,
            }],
            consumers: vec![
                ConsumerSample {
                    stream: "ORDERS".into(),
                    consumer: "shipping".into(),
                    role: "leader",
                    num_pending: 4,
                    num_ack_pending: 2,
                    num_redelivered: 1,
                    num_waiting: Some(3),
                    delivered_consumer_seq: 5,
                    delivered_stream_seq: 6,
                    ack_floor_consumer_seq: 3,
                    ack_floor_stream_seq: 4,
                },
                ConsumerSample {
                    stream: "ORDERS".into(),
                    consumer: "billing".into(),
                    role: "follower",
                    num_waiting: None,
                    ..ConsumerSample::default()
                },
            ],
            groups: vec![GroupSample {
                group_id: 7,
                kind: "consumer",
                name: "ORDERS/shipping".into(),
                status: status(Role::Leader, Some(2)),
            }],
        };
        let text = render(&snap, None);
        for line in [
            "wharf_node_ready{node_id=\"2\"} 1",
            "wharf_stream_messages{stream=\"ORDERS\",role=\"leader\"} 6",
            "wharf_stream_bytes{stream=\"ORDERS\",role=\"leader\"} 600",
            "wharf_stream_last_seq{stream=\"ORDERS\",role=\"leader\"} 6",
            "wharf_consumer_num_pending{stream=\"ORDERS\",consumer=\"shipping\",role=\"leader\"} 4",
            "wharf_consumer_num_ack_pending{stream=\"ORDERS\",consumer=\"shipping\",role=\"leader\"} 2",
            "wharf_consumer_num_redelivered{stream=\"ORDERS\",consumer=\"shipping\",role=\"leader\"} 1",
            "wharf_consumer_num_waiting{stream=\"ORDERS\",consumer=\"shipping\",role=\"leader\"} 3",
            "wharf_consumer_ack_floor_consumer_seq{stream=\"ORDERS\",consumer=\"shipping\",role=\"leader\"} 3",
            "wharf_consumer_num_pending{stream=\"ORDERS\",consumer=\"billing\",role=\"follower\"} 0",
            "wharf_raft_role{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\",role=\"leader\"} 1",
            "wharf_raft_role{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\",role=\"follower\"} 0",
            "wharf_raft_term{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\"} 3",
            "wharf_raft_leader_id{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\"} 2",
            "wharf_raft_commit_index{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\"} 11",
            "wharf_raft_applied_index{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\"} 10",
            "wharf_raft_leader_changes_total{group_id=\"7\",kind=\"consumer\",name=\"ORDERS/shipping\"} 2",
            "# TYPE wharf_raft_leader_changes_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("wharf_consumer_num_waiting{stream=\"ORDERS\",consumer=\"billing\""),
            "a follower reports no waiting pulls"
        );
        // Every family's samples follow its TYPE line, once.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps);
        let mut seen = std::collections::BTreeSet::new();
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(seen.insert(l.to_string()), "family declared twice: {l}");
        }
    }
}
