//! The checker: reads the recorded history plus what the cluster holds at the
//! end (every stored message, read back by a fresh consumer; each replica's
//! stream state) and counts, Jepsen style:
//!
//! - acked publishes lost: acknowledged, but their id is not in the stream;
//! - acked seq mismatch: the acknowledged sequence holds another id;
//! - never delivered: acknowledged, but no worker received the id by the end
//!   of the drain that follows the final heal;
//! - duplicate deliveries: deliveries beyond the first of an id (allowed:
//!   at-least-once), split into redeliveries of one stored message and ids
//!   stored twice (a publish retried after an unknown outcome);
//! - deliveries after an ack: a message delivered again after an ack of that
//!   same sequence had returned OK (reported, not fatal: the redelivery may
//!   have been planned before the ack committed);
//! - stalls: the longest stretch without a publish acknowledgement and
//!   without a delivery, overall and with fault windows cut out;
//! - leader changes per group.
//!
//! Fatal: any lost acked publish, seq mismatch, unexpected id, message never
//! delivered, replicas that disagree after healing, a consumer not drained,
//! or an overall stall above the bound; and, added by the run from the
//! nemesis, a membership change that did not complete within its bound.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use super::history::Event;

/// What the cluster holds once everything is healed and drained.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FinalState {
    /// Every stored message: stream seq -> id (payload).
    pub stream: BTreeMap<u64, String>,
    /// Each node's own replica: (messages, last_seq), None if unreadable.
    pub replicas: BTreeMap<u64, Option<(u64, u64)>>,
    pub replicas_agree: bool,
    pub consumer_num_pending: u64,
    pub consumer_num_ack_pending: u64,
    pub consumer_drained: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Stall {
    pub longest_s: f64,
    pub longest_at_s: f64,
    pub longest_outside_faults_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub publishes: u64,
    pub acked: u64,
    pub failed: u64,
    pub unknown: u64,
    pub unknown_stored: u64,
    pub stream_messages: u64,
    pub acked_lost: u64,
    pub acked_lost_sample: Vec<String>,
    pub acked_seq_mismatch: u64,
    pub unexpected_in_stream: u64,
    pub ids_stored_twice: u64,
    pub deliveries: u64,
    pub distinct_delivered: u64,
    pub never_delivered: u64,
    pub never_delivered_sample: Vec<String>,
    pub duplicate_deliveries: u64,
    pub redeliveries: u64,
    pub delivered_after_ack: u64,
    /// Deliveries whose count is not above an earlier delivery's count of
    /// the same sequence (count 1 twice, or 2 then 1): the consumer's state
    /// went back, or a stale delivery was sent.
    pub count_regressions: u64,
    pub delivery_seq_mismatch: u64,
    pub acks_ok: u64,
    pub acks_failed: u64,
    pub publish_stall: Stall,
    pub delivery_stall: Stall,
    pub leader_changes: BTreeMap<String, u64>,
    pub faults: BTreeMap<String, u64>,
    pub final_state: FinalState,
    pub failures: Vec<String>,
}

/// Stretches of [from, to] not covered by any window.
fn longest_gap(points: &[u64], from: u64, to: u64, windows: &[(u64, u64)]) -> Stall {
    let mut ts: Vec<u64> = points
        .iter()
        .copied()
        .filter(|t| *t >= from && *t <= to)
        .collect();
    ts.sort_unstable();
    let mut edges = vec![from];
    edges.extend(ts);
    edges.push(to);
    let mut s = Stall::default();
    for w in edges.windows(2) {
        let (a, b) = (w[0], w[1]);
        let len = (b - a) as f64 / 1000.0;
        if len > s.longest_s {
            s.longest_s = len;
            s.longest_at_s = a as f64 / 1000.0;
        }
        // Cut the fault windows out of [a, b]; keep the longest remainder.
        let mut cur = a;
        for &(fs, fe) in windows {
            if fe <= cur || fs >= b {
                continue;
            }
            if fs > cur {
                s.longest_outside_faults_s =
                    s.longest_outside_faults_s.max((fs - cur) as f64 / 1000.0);
            }
            cur = cur.max(fe);
        }
        if b > cur {
            s.longest_outside_faults_s = s.longest_outside_faults_s.max((b - cur) as f64 / 1000.0);
        }
    }
    s
}

/// Fault windows [start, end] in ms, in order.
pub fn fault_windows(events: &[Event]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut open: Option<u64> = None;
    for e in events {
        if let Event::Fault { t_ms, phase, .. } = e {
            match (phase.as_str(), open) {
                ("start", _) => open = Some(*t_ms),
                ("end", Some(s)) => {
                    out.push((s, *t_ms));
                    open = None;
                }
                _ => {}
            }
        }
    }
    if let Some(s) = open {
        out.push((s, u64::MAX));
    }
    out
}

/// `window`: the workload's [start, end] in ms, over which stalls count.
pub fn check(events: &[Event], fin: FinalState, window: (u64, u64), max_stall_s: f64) -> Summary {
    let mut s = Summary::default();
    let mut invoked: HashSet<&str> = HashSet::new();
    let mut acked: HashMap<&str, u64> = HashMap::new();
    let mut unknown: HashSet<&str> = HashSet::new();
    let mut ok_times = Vec::new();
    let mut deliver_times = Vec::new();
    let mut delivered_ids: HashMap<&str, u64> = HashMap::new();
    let mut acked_ok_at: HashMap<u64, u64> = HashMap::new();
    let mut max_count: HashMap<u64, u64> = HashMap::new();
    for e in events {
        match e {
            Event::PublishInvoke { id, .. } => {
                s.publishes += 1;
                invoked.insert(id);
            }
            Event::PublishOk { t_ms, id, seq } => {
                s.acked += 1;
                acked.insert(id, *seq);
                ok_times.push(*t_ms);
            }
            Event::PublishFail { .. } => s.failed += 1,
            Event::PublishUnknown { id, .. } => {
                s.unknown += 1;
                unknown.insert(id);
            }
            Event::Deliver {
                t_ms,
                id,
                seq,
                count,
                ..
            } => {
                s.deliveries += 1;
                *delivered_ids.entry(id).or_default() += 1;
                deliver_times.push(*t_ms);
                if *count > 1 {
                    s.redeliveries += 1;
                }
                let seen = max_count.entry(*seq).or_default();
                if *count <= *seen {
                    s.count_regressions += 1;
                }
                *seen = (*seen).max(*count);
                if acked_ok_at.get(seq).is_some_and(|at| at < t_ms) {
                    s.delivered_after_ack += 1;
                }
                if fin.stream.get(seq).is_some_and(|stored| stored != id) {
                    s.delivery_seq_mismatch += 1;
                }
            }
            Event::Ack { t_ms, seq, ok, .. } => {
                if *ok {
                    s.acks_ok += 1;
                    acked_ok_at.entry(*seq).or_insert(*t_ms);
                } else {
                    s.acks_failed += 1;
                }
            }
            Event::Leader { group, .. } => {
                *s.leader_changes.entry(group.clone()).or_insert(0) += 1;
            }
            Event::Fault { phase, kind, .. } if phase == "start" => {
                *s.faults.entry(kind.clone()).or_default() += 1;
            }
            _ => {}
        }
    }
    // The first sighting of a group's leader is not a change.
    for v in s.leader_changes.values_mut() {
        *v = v.saturating_sub(1);
    }

    let mut stored_ids: HashMap<&str, u64> = HashMap::new();
    for id in fin.stream.values() {
        *stored_ids.entry(id).or_default() += 1;
    }
    s.stream_messages = fin.stream.len() as u64;
    s.ids_stored_twice = stored_ids.values().filter(|n| **n > 1).count() as u64;
    s.unexpected_in_stream = stored_ids
        .keys()
        .filter(|id| !invoked.contains(*id))
        .count() as u64;
    s.unknown_stored = unknown
        .iter()
        .filter(|id| stored_ids.contains_key(*id) && !acked.contains_key(*id))
        .count() as u64;
    let mut lost: BTreeSet<&str> = BTreeSet::new();
    for (id, seq) in &acked {
        if !stored_ids.contains_key(id) {
            lost.insert(id);
        }
        if fin.stream.get(seq).is_some_and(|stored| stored != id) {
            s.acked_seq_mismatch += 1;
        }
    }
    s.acked_lost = lost.len() as u64;
    s.acked_lost_sample = lost.iter().take(20).map(|x| x.to_string()).collect();
    let never: BTreeSet<&str> = acked
        .keys()
        .filter(|id| !delivered_ids.contains_key(*id))
        .copied()
        .collect();
    s.never_delivered = never.len() as u64;
    s.never_delivered_sample = never.iter().take(20).map(|x| x.to_string()).collect();
    s.distinct_delivered = delivered_ids.len() as u64;
    s.duplicate_deliveries = s.deliveries - s.distinct_delivered;

    let windows = fault_windows(events);
    s.publish_stall = longest_gap(&ok_times, window.0, window.1, &windows);
    s.delivery_stall = longest_gap(&deliver_times, window.0, window.1, &windows);

    let f = &mut s.failures;
    if s.acked_lost > 0 {
        f.push(format!("{} acknowledged publishes lost", s.acked_lost));
    }
    if s.acked_seq_mismatch > 0 {
        f.push(format!(
            "{} acknowledged sequences hold another id",
            s.acked_seq_mismatch
        ));
    }
    if s.unexpected_in_stream > 0 {
        f.push(format!(
            "{} stored ids were never published",
            s.unexpected_in_stream
        ));
    }
    if s.delivery_seq_mismatch > 0 {
        f.push(format!(
            "{} deliveries carried another id than their sequence holds",
            s.delivery_seq_mismatch
        ));
    }
    if s.never_delivered > 0 {
        f.push(format!(
            "{} acknowledged publishes never delivered after healing",
            s.never_delivered
        ));
    }
    if !fin.replicas_agree {
        f.push(format!(
            "replicas disagree after healing: {:?}",
            fin.replicas
        ));
    }
    if !fin.consumer_drained {
        f.push(format!(
            "consumer not drained after healing: {} pending, {} awaiting ack",
            fin.consumer_num_pending, fin.consumer_num_ack_pending
        ));
    }
    if s.publish_stall.longest_s > max_stall_s {
        f.push(format!(
            "no publish acknowledged for {:.1} s from t={:.1} s (bound {max_stall_s} s)",
            s.publish_stall.longest_s, s.publish_stall.longest_at_s
        ));
    }
    if s.delivery_stall.longest_s > max_stall_s {
        f.push(format!(
            "no delivery for {:.1} s from t={:.1} s (bound {max_stall_s} s)",
            s.delivery_stall.longest_s, s.delivery_stall.longest_at_s
        ));
    }
    s.final_state = fin;
    s
}

/// The fault timeline, one line per fault start and heal.
pub fn timeline(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        match e {
            Event::Fault {
                t_ms,
                phase,
                kind,
                node,
                detail,
            } => out.push_str(&format!(
                "  {:>8.1}s  {phase:<5} {kind:<11} node {node}  {detail}\n",
                *t_ms as f64 / 1000.0
            )),
            Event::Note { t_ms, text } if text.starts_with("==") => {
                out.push_str(&format!("  {:>8.1}s  {text}\n", *t_ms as f64 / 1000.0))
            }
            _ => {}
        }
    }
    out
}

/// The Jepsen-style report printed at the end of a run.
pub fn report(s: &Summary) -> String {
    let mut r = String::new();
    let mut line = |k: &str, v: String| r.push_str(&format!("  {k:<34} {v}\n"));
    line("publishes attempted", s.publishes.to_string());
    line("  acknowledged", s.acked.to_string());
    line("  failed (rejected)", s.failed.to_string());
    line(
        "  unknown outcome",
        format!("{} ({} of them stored)", s.unknown, s.unknown_stored),
    );
    line("messages in stream at end", s.stream_messages.to_string());
    line("acked publishes lost", s.acked_lost.to_string());
    line(
        "acked seq holding another id",
        s.acked_seq_mismatch.to_string(),
    );
    line(
        "stored ids never published",
        s.unexpected_in_stream.to_string(),
    );
    line(
        "ids stored twice (publish retry)",
        s.ids_stored_twice.to_string(),
    );
    line(
        "deliveries",
        format!("{} ({} distinct ids)", s.deliveries, s.distinct_delivered),
    );
    line(
        "acked publishes never delivered",
        s.never_delivered.to_string(),
    );
    line("duplicate deliveries", s.duplicate_deliveries.to_string());
    line("  redeliveries (count > 1)", s.redeliveries.to_string());
    line(
        "deliveries after an ack OK",
        s.delivered_after_ack.to_string(),
    );
    line(
        "delivery id != stored id",
        s.delivery_seq_mismatch.to_string(),
    );
    line(
        "acks",
        format!("{} ok, {} failed", s.acks_ok, s.acks_failed),
    );
    line(
        "publish stall (longest)",
        format!(
            "{:.1} s at t={:.1} s; outside faults {:.1} s",
            s.publish_stall.longest_s,
            s.publish_stall.longest_at_s,
            s.publish_stall.longest_outside_faults_s
        ),
    );
    line(
        "delivery stall (longest)",
        format!(
            "{:.1} s at t={:.1} s; outside faults {:.1} s",
            s.delivery_stall.longest_s,
            s.delivery_stall.longest_at_s,
            s.delivery_stall.longest_outside_faults_s
        ),
    );
    line("leader changes", format!("{:?}", s.leader_changes));
    line("faults injected", format!("{:?}", s.faults));
    line(
        "replicas at end (messages,last_seq)",
        format!(
            "{:?} agree={}",
            s.final_state.replicas, s.final_state.replicas_agree
        ),
    );
    line(
        "consumer at end",
        format!(
            "{} pending, {} awaiting ack",
            s.final_state.consumer_num_pending, s.final_state.consumer_num_ack_pending
        ),
    );
    if s.failures.is_empty() {
        r.push_str("  VERDICT: valid\n");
    } else {
        r.push_str("  VERDICT: INVALID\n");
        for f in &s.failures {
            r.push_str(&format!("    - {f}\n"));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_cut_fault_windows_out() {
        let s = longest_gap(&[1000, 2000, 9000], 0, 10_000, &[(2500, 7000)]);
        assert_eq!(s.longest_s, 7.0);
        assert_eq!(s.longest_at_s, 2.0);
        assert_eq!(s.longest_outside_faults_s, 2.0);
    }
}
