//! Chaos scenario for CI: graceful restart (SIGTERM, wait for the exit, start again),
//! under publishers and three workers sharing one consumer; the history
//! checker must find nothing lost, everything delivered after healing, and
//! no stall beyond its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_restart_seed_14() -> anyhow::Result<()> {
    ci_scenario("restart", &[FaultKind::Restart], 14).await
}
