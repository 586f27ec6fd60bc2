//! Chaos scenario for CI: kill -9 of a random node, started again from its data dir,
//! under publishers and three workers sharing one consumer; the history
//! checker must find nothing lost, everything delivered after healing, and
//! no stall beyond its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_kill_seed_11() -> anyhow::Result<()> {
    ci_scenario("kill", &[FaultKind::Kill], 11).await
}
