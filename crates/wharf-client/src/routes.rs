//! Where to send a subject's publishes: the seed that stored it last.
//!
//! Every node accepts a publish and forwards it to the stream's leader when
//! it is not the leader itself, which costs a gRPC round trip between nodes.
//! A publish ack names the node that stored the message (`stored_by`); when
//! that address is one of the client's own seeds, the client remembers
//! subject -> seed and sends the next publish of that subject there first.
//!
//! Invariants: only seeds the user configured are ever contacted (an
//! address from the server is matched against them, never dialled by
//! itself); the table holds at most `MAX_ROUTES` subjects and is emptied
//! when full, so a client publishing to endless distinct subjects stays
//! bounded. A stale route costs one failed or forwarded attempt: the caller
//! forgets it on failure, and a forwarded ack names the new leader.
//!
//! A routed publish goes on that seed's publish lane (`lanes`), one
//! `PublishStream` shared by the client's publishes there.
//!
//! Left out: routing `PublishStream`s a caller opens itself (it can ask
//! `Client::stream_leader_seed` where) and admin calls (consumer sessions move to the consumer leader by the
//! `Consume` response header instead), and learning leaders from
//! `ClusterInfo` before the first publish.

use std::collections::HashMap;
use std::sync::Mutex;

/// Most subjects remembered at once.
pub(crate) const MAX_ROUTES: usize = 4096;

#[derive(Default)]
pub(crate) struct Routes {
    seed_of: Mutex<HashMap<String, usize>>,
}

impl Routes {
    /// The seed index to try first for `subject`, if one is known.
    pub(crate) fn seed_for(&self, subject: &str) -> Option<usize> {
        self.seed_of.lock().ok()?.get(subject).copied()
    }

    pub(crate) fn learn(&self, subject: &str, seed: usize) {
        let Ok(mut map) = self.seed_of.lock() else {
            return;
        };
        if map.get(subject) == Some(&seed) {
            return;
        }
        if map.len() >= MAX_ROUTES {
            map.clear();
        }
        map.insert(subject.to_string(), seed);
    }

    pub(crate) fn forget(&self, subject: &str) {
        if let Ok(mut map) = self.seed_of.lock() {
            map.remove(subject);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seed_of.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// Whether a seed (`host:port`, perhaps with a scheme) and an address the
/// cluster uses name the same endpoint. Empty never matches.
pub(crate) fn same_addr(seed: &str, stored_by: &str) -> bool {
    fn bare(a: &str) -> &str {
        let a = a.trim();
        let a = a
            .strip_prefix("https://")
            .or_else(|| a.strip_prefix("http://"))
            .unwrap_or(a);
        a.trim_end_matches('/')
    }
    let (seed, stored_by) = (bare(seed), bare(stored_by));
    !stored_by.is_empty() && seed.eq_ignore_ascii_case(stored_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learned_subject_goes_to_its_seed_until_forgotten() {
        let routes = Routes::default();
        assert_eq!(routes.seed_for("orders.created"), None);
        routes.learn("orders.created", 2);
        assert_eq!(routes.seed_for("orders.created"), Some(2));
        assert_eq!(routes.seed_for("orders.shipped"), None);
        routes.learn("orders.created", 0);
        assert_eq!(routes.seed_for("orders.created"), Some(0));
        routes.forget("orders.created");
        assert_eq!(routes.seed_for("orders.created"), None);
    }

    #[test]
    fn the_table_is_bounded() {
        let routes = Routes::default();
        for i in 0..MAX_ROUTES + 10 {
            routes.learn(&format!("s.{i}"), 1);
            assert!(routes.len() <= MAX_ROUTES);
        }
        // Emptied when full, then filled again from there.
        assert_eq!(routes.len(), 10);
        assert_eq!(routes.seed_for(&format!("s.{}", MAX_ROUTES + 9)), Some(1));
    }

    #[test]
    fn addresses_match_without_scheme_or_case_and_never_when_empty() {
        assert!(same_addr("127.0.0.1:7001", "127.0.0.1:7001"));
        assert!(same_addr(
            "https://wharf-0.wharf:7001",
            "wharf-0.wharf:7001"
        ));
        assert!(same_addr("http://Node-1:7001/", "node-1:7001"));
        assert!(!same_addr("127.0.0.1:7001", "127.0.0.1:7002"));
        assert!(!same_addr("127.0.0.1:7001", ""));
        assert!(!same_addr("", ""));
    }
}
