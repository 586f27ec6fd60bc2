//! Chaos scenario for CI: membership changes under load. Each fault starts
//! a new node with `--join`, adds it with `peer add`, removes a random node
//! with `peer remove` while publishers and three workers sharing one
//! consumer keep running, then stops the removed node; the history checker
//! must find nothing lost, everything delivered after healing, no stall
//! beyond its bound, and every membership change done within its bound.
//! Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_member_seed_23() -> anyhow::Result<()> {
    ci_scenario("member", &[FaultKind::Member], 23).await
}
