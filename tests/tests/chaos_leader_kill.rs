//! Chaos scenario for CI: kill -9 of the node leading the stream or the consumer group,
//! under publishers and three workers sharing one consumer; the history
//! checker must find nothing lost, everything delivered after healing, and
//! no stall beyond its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_leader_kill_seed_12() -> anyhow::Result<()> {
    ci_scenario("leader-kill", &[FaultKind::LeaderKill], 12).await
}
