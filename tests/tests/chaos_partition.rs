//! Chaos scenario for CI: one node cut from the other two with iptables (clients still reach it),
//! under publishers and three workers sharing one consumer; the history
//! checker must find nothing lost, everything delivered after healing, and
//! no stall beyond its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_partition_seed_15() -> anyhow::Result<()> {
    ci_scenario("partition", &[FaultKind::Partition], 15).await
}
