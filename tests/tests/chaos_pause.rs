//! Chaos scenario for CI: SIGSTOP of a random node for a few seconds, then SIGCONT,
//! under publishers and three workers sharing one consumer; the history
//! checker must find nothing lost, everything delivered after healing, and
//! no stall beyond its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_pause_seed_13() -> anyhow::Result<()> {
    ci_scenario("pause", &[FaultKind::Pause], 13).await
}
