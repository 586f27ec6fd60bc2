//! The catalog's node set and the re-placement of replicas when a node
//! leaves (`peer remove`).
//!
//! `RemoveNode` is judged and applied in one deterministic step inside the
//! meta group's `apply`: the node leaves `nodes` (so nothing new is placed
//! on it), and every stream with a replica on it gets a replacement, chosen
//! like any placement (fewest hosted groups, then lowest id, among live nodes
//! that do not host the stream yet). The stream's consumers get the same
//! replacement in the same entry, so a consumer stays on exactly its
//! stream's replicas. The departing node is kept in each moved group's
//! `leaving` list until that group's leader reports the Raft membership
//! change done (`MoveDone`); only then may the node drop its replica.
//!
//! Invariants:
//! - After `RemoveNode`, at least [`MIN_NODES`] nodes remain.
//! - Node ids are never reused: a removed id cannot be added again (its old
//!   replicas' data must never meet the group again under the same name).
//! - At most one removal moves replicas at a time: a removal is refused
//!   while any group still has a `leaving` node, so a group's Raft change
//!   always goes from its current voters to a set that shares a majority of
//!   still-present members with it (one replica replaced).
//! - Load counts stream groups (a consumer always sits on its stream's
//!   nodes, so it adds the same to each of them).
//!
//! Left out: rebalancing existing replicas onto a new node (only new streams
//! and replacements land there), and removing a node below three.

use std::collections::BTreeMap;

use wharf_raft::{GroupId, NodeId};

use crate::error::ServerError;
use crate::meta::{Catalog, MetaResponse};

/// Fewest nodes a cluster keeps: `peer remove` below this is refused, since
/// replicated streams need three nodes and the meta group a majority to spare.
pub const MIN_NODES: usize = 3;

impl Catalog {
    /// Stream groups hosted per live node (0 for a node that hosts none).
    pub(crate) fn load(&self) -> BTreeMap<NodeId, usize> {
        let mut load: BTreeMap<NodeId, usize> = self.nodes.keys().map(|n| (*n, 0)).collect();
        for s in self.streams.values() {
            for n in &s.replicas {
                if let Some(l) = load.get_mut(n) {
                    *l += 1;
                }
            }
        }
        load
    }

    /// Groups whose replicas are still moving (a node in `leaving`).
    pub fn moving_groups(&self) -> Vec<(String, GroupId)> {
        let streams = self
            .streams
            .iter()
            .filter(|(_, s)| !s.leaving.is_empty())
            .map(|(name, s)| (name.clone(), s.group_id));
        let consumers = self
            .consumers
            .iter()
            .filter(|(_, c)| !c.leaving.is_empty())
            .map(|((s, c), e)| (format!("{s}/{c}"), e.group_id));
        streams.chain(consumers).collect()
    }

    /// Whether any stream or consumer group has a replica on `id` or is
    /// still moving away from it (`leaving`).
    pub(crate) fn has_replicas_on(&self, id: NodeId) -> bool {
        let on = |replicas: &[NodeId], leaving: &[NodeId]| {
            replicas.contains(&id) || leaving.contains(&id)
        };
        self.streams.values().any(|s| on(&s.replicas, &s.leaving))
            || self.consumers.values().any(|c| on(&c.replicas, &c.leaving))
    }

    pub(crate) fn add_node(&mut self, id: NodeId, addr: String) -> MetaResponse {
        if id == 0 {
            return Err(ServerError::Invalid("node id must be 1 or more".into()));
        }
        if let Some(existing) = self.nodes.get(&id) {
            return Err(ServerError::AlreadyExists(format!(
                "node {id} is already a member of the cluster (at {existing})"
            )));
        }
        if self.removed_nodes.contains_key(&id) {
            return Err(ServerError::AlreadyExists(format!(
                "node id {id} was removed from this cluster; ids are not reused: start the node with a new id and an empty data dir"
            )));
        }
        if let Some((other, _)) = self.nodes.iter().find(|(_, a)| **a == addr) {
            return Err(ServerError::AlreadyExists(format!(
                "address {addr} is already used by node {other}"
            )));
        }
        self.nodes.insert(id, addr);
        Ok(0)
    }

    /// Can `id` be removed now? The reason when not.
    pub fn check_remove_node(&self, id: NodeId) -> Result<(), ServerError> {
        if !self.nodes.contains_key(&id) {
            let members: Vec<String> = self.nodes.keys().map(|n| n.to_string()).collect();
            return Err(ServerError::NotFound(format!(
                "node {id} is not a member of the cluster (members: {})",
                members.join(", ")
            )));
        }
        let remaining = self.nodes.len() - 1;
        if remaining < MIN_NODES {
            return Err(ServerError::Conflict(format!(
                "removing node {id} would leave {remaining} nodes; a cluster keeps at least {MIN_NODES} (add a node first)"
            )));
        }
        if let Some((name, _)) = self.moving_groups().first() {
            return Err(ServerError::Unavailable(format!(
                "an earlier peer remove is still moving replicas (group {name}); retry when it has finished"
            )));
        }
        for (name, s) in &self.streams {
            if s.replicas.contains(&id) && remaining < s.replicas.len() {
                return Err(ServerError::Conflict(format!(
                    "stream {name:?} has {} replicas and only {remaining} other nodes would remain",
                    s.replicas.len()
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn remove_node(&mut self, id: NodeId) -> MetaResponse {
        self.check_remove_node(id)?;
        if let Some(addr) = self.nodes.remove(&id) {
            self.removed_nodes.insert(id, addr);
        }
        let mut load = self.load();
        let hosted: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| s.replicas.contains(&id))
            .map(|(name, _)| name.clone())
            .collect();
        for name in hosted {
            let stream = self.streams.get_mut(&name).expect("listed above");
            let to = load
                .iter()
                .filter(|(n, _)| !stream.replicas.contains(n))
                .min_by_key(|(n, l)| (**l, **n))
                .map(|(n, _)| *n)
                .ok_or_else(|| ServerError::Internal("no replacement node".into()))?;
            *load.entry(to).or_default() += 1;
            replace(&mut stream.replicas, id, to);
            stream.leaving = vec![id];
            stream.initialize_on.retain(|n| *n != id);
            for c in self.consumers.values_mut().filter(|c| c.stream == name) {
                replace(&mut c.replicas, id, to);
                c.leaving = vec![id];
                c.initialize_on.retain(|n| *n != id);
            }
        }
        Ok(0)
    }

    pub(crate) fn move_done(&mut self, group_id: GroupId) {
        for s in self.streams.values_mut().filter(|s| s.group_id == group_id) {
            s.leaving.clear();
        }
        for c in self
            .consumers
            .values_mut()
            .filter(|c| c.group_id == group_id)
        {
            c.leaving.clear();
        }
    }
}

fn replace(replicas: &mut Vec<NodeId>, from: NodeId, to: NodeId) {
    replicas.retain(|n| *n != from);
    replicas.push(to);
    replicas.sort_unstable();
}

#[cfg(test)]
mod tests {
    use wharf_core::consumer::ConsumerConfig;
    use wharf_core::stream::StreamConfig;

    use super::*;
    use crate::meta::MetaCommand;

    fn catalog(n: u64) -> Catalog {
        Catalog::new((1..=n).map(|i| (i, format!("n{i}:1"))).collect())
    }

    fn add_stream(c: &mut Catalog, name: &str) -> GroupId {
        let config = StreamConfig {
            name: name.into(),
            subjects: vec![format!("{}.>", name.to_lowercase())],
            ..Default::default()
        }
        .with_defaults();
        c.apply(MetaCommand::AddStream { config, now_ms: 0 })
            .unwrap()
    }

    fn add_consumer(c: &mut Catalog, stream: &str, name: &str) -> GroupId {
        let config = ConsumerConfig {
            name: name.into(),
            ..Default::default()
        }
        .with_defaults();
        let cmd = MetaCommand::AddConsumer {
            stream: stream.into(),
            config,
            now_ms: 0,
        };
        c.apply(cmd).unwrap()
    }

    #[test]
    fn new_nodes_take_new_streams_by_load() {
        let mut c = catalog(3);
        add_stream(&mut c, "A");
        c.apply(MetaCommand::AddNode {
            id: 4,
            addr: "n4:1".into(),
        })
        .unwrap();
        c.apply(MetaCommand::AddNode {
            id: 5,
            addr: "n5:1".into(),
        })
        .unwrap();
        add_stream(&mut c, "B");
        assert_eq!(c.streams["B"].replicas, vec![1, 4, 5]);
        add_stream(&mut c, "C");
        assert_eq!(c.streams["C"].replicas, vec![2, 3, 4]);
    }

    #[test]
    fn duplicate_ids_and_addresses_are_refused() {
        let mut c = catalog(3);
        let dup_id = c.apply(MetaCommand::AddNode {
            id: 2,
            addr: "n9:1".into(),
        });
        assert_eq!(
            dup_id.unwrap_err().to_string(),
            "node 2 is already a member of the cluster (at n2:1)"
        );
        let dup_addr = c.apply(MetaCommand::AddNode {
            id: 9,
            addr: "n2:1".into(),
        });
        assert_eq!(
            dup_addr.unwrap_err().to_string(),
            "address n2:1 is already used by node 2"
        );
    }

    #[test]
    fn remove_moves_a_stream_and_its_consumers_together() {
        let mut c = catalog(5);
        let a = add_stream(&mut c, "A");
        let ca = add_consumer(&mut c, "A", "w");
        assert_eq!(c.streams["A"].replicas, vec![1, 2, 3]);
        c.apply(MetaCommand::RemoveNode { id: 2 }).unwrap();
        assert!(!c.nodes.contains_key(&2));
        assert_eq!(c.removed_nodes.keys().copied().collect::<Vec<_>>(), vec![2]);
        let s = &c.streams["A"];
        assert_eq!((&s.replicas, &s.leaving), (&vec![1, 3, 4], &vec![2]));
        assert_eq!(s.initialize_on, vec![1, 3]);
        let w = &c.consumers[&("A".to_string(), "w".to_string())];
        assert_eq!((&w.replicas, &w.leaving), (&s.replicas, &s.leaving));
        // A second removal waits for the moves to finish.
        let busy = c.apply(MetaCommand::RemoveNode { id: 1 }).unwrap_err();
        assert!(busy.to_string().contains("still moving"), "{busy}");
        assert!(c.has_replicas_on(2), "still leaving A and A/w");
        c.apply(MetaCommand::MoveDone { group_id: a }).unwrap();
        assert!(c.has_replicas_on(2), "still leaving A/w");
        c.apply(MetaCommand::MoveDone { group_id: ca }).unwrap();
        assert!(c.moving_groups().is_empty());
        assert!(!c.has_replicas_on(2));
        c.apply(MetaCommand::RemoveNode { id: 1 }).unwrap();
        assert_eq!(c.streams["A"].replicas, vec![3, 4, 5]);
        c.apply(MetaCommand::MoveDone { group_id: a }).unwrap();
        c.apply(MetaCommand::MoveDone { group_id: ca }).unwrap();
        // Three nodes are left: no further removal.
        let few = c.apply(MetaCommand::RemoveNode { id: 3 }).unwrap_err();
        assert!(few.to_string().contains("would leave 2 nodes"), "{few}");
        let again = c.apply(MetaCommand::AddNode {
            id: 2,
            addr: "n2:1".into(),
        });
        assert!(again
            .unwrap_err()
            .to_string()
            .contains("ids are not reused"));
        let unknown = c.apply(MetaCommand::RemoveNode { id: 9 }).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "node 9 is not a member of the cluster (members: 3, 4, 5)"
        );
    }

    #[test]
    fn replacements_go_to_the_least_loaded_eligible_node() {
        let mut c = catalog(5);
        for name in ["A", "B", "C", "D"] {
            add_stream(&mut c, name);
        }
        let placed: Vec<Vec<NodeId>> = c.streams.values().map(|s| s.replicas.clone()).collect();
        assert_eq!(
            placed,
            vec![vec![1, 2, 3], vec![1, 4, 5], vec![2, 3, 4], vec![1, 2, 5]]
        );
        // Loads 2:3 3:2 4:2 5:2 without node 1. A takes 4 (tie with 5, lower
        // id), B takes 3 (2 has more), D then takes 3 or 4 (both at 3): 3.
        c.apply(MetaCommand::RemoveNode { id: 1 }).unwrap();
        let moved: Vec<Vec<NodeId>> = c.streams.values().map(|s| s.replicas.clone()).collect();
        assert_eq!(
            moved,
            vec![vec![2, 3, 4], vec![3, 4, 5], vec![2, 3, 4], vec![2, 3, 5]]
        );
        assert_eq!(c.streams["C"].leaving, Vec::<NodeId>::new());
    }
}
