//! Chaos scenario for CI: SIGKILL of a random node whose files then lose
//! every write it had not fsynced (simulated power loss, see
//! `wharf_tests::powerloss`), started again at heal, under publishers and
//! three workers sharing one consumer; the history checker must find
//! nothing lost, everything delivered after healing, and no stall beyond
//! its bound. Fixed seed; see docs/RELIABILITY.md.

use wharf_tests::chaos::{ci_scenario, nemesis::FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_power_loss_seed_17() -> anyhow::Result<()> {
    ci_scenario("power-loss", &[FaultKind::PowerLoss], 17).await
}
