//! What a stream group's leader runs besides publish batching: it makes the
//! group's own configuration follow the catalog, and it proposes `Expire` as
//! time passes.
//!
//! The catalog (meta group) holds a stream's configuration and a revision
//! bumped by every edit; the stream group holds the configuration it
//! applies, which changes only through a replicated `UpdateConfig` entry so
//! every replica switches at the same point of the log. The reconciler hands
//! this task the catalog's (revision, config) (`desired`); when this node
//! leads the group and the catalog's revision is newer than the applied one,
//! it proposes `UpdateConfig`. The stream group ignores revisions it has
//! passed, so a leader whose catalog lags never brings an old config back.
//! Once a second it proposes `Expire`
//! if messages have aged out or message ids have left the duplicate window,
//! so both happen without publishes. Time is stamped by this leader into the
//! command; replicas never read a clock.
//!
//! Invariants: one proposal at a time; a config the stream group refused is
//! not proposed again until the catalog's revision changes (no busy loop).
//!
//! Left out: a timer per expiry (a 1 s tick is precise enough for limits).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use wharf_core::stream::StreamConfig;
use wharf_raft::{Group, Role};

use crate::error::ServerError;
use crate::stream_sm::{PublishResults, StreamCommand, StreamMachine};
use crate::util::now_ms;

/// How often the leader checks for aged-out messages and ids.
const EXPIRE_TICK: Duration = Duration::from_secs(1);
/// Pause after a failed proposal (leadership moving, peers down).
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Runs until the group stops or the reconciler drops `desired`.
pub fn spawn(
    group: Group,
    sm: Arc<Mutex<StreamMachine>>,
    desired: watch::Receiver<(u64, StreamConfig)>,
) {
    tokio::spawn(run(group, sm, desired));
}

async fn run(
    group: Group,
    sm: Arc<Mutex<StreamMachine>>,
    mut desired: watch::Receiver<(u64, StreamConfig)>,
) {
    let mut status = group.watch_role();
    let mut refused: Option<u64> = None;
    loop {
        let leader = *status.borrow_and_update() == Role::Leader;
        let mut pause = EXPIRE_TICK;
        if leader {
            let (revision, want) = desired.borrow_and_update().clone();
            let now = now_ms();
            let Ok((applied, expired)) = sm
                .lock()
                .map(|m| (m.config_revision(), m.state().has_expired(now)))
            else {
                return;
            };
            let cmd = if revision > applied && refused != Some(revision) {
                Some(StreamCommand::UpdateConfig {
                    config: want.clone(),
                    revision,
                    now_ms: now,
                })
            } else if expired {
                Some(StreamCommand::Expire { now_ms: now })
            } else {
                None
            };
            if let Some(cmd) = cmd {
                let is_update = matches!(cmd, StreamCommand::UpdateConfig { .. });
                match propose(&group, &cmd).await {
                    Ok(()) => continue,
                    Err(ServerError::Invalid(e) | ServerError::Conflict(e)) if is_update => {
                        tracing::warn!(stream = %want.name, "stream refused its new config: {e}");
                        refused = Some(revision);
                    }
                    Err(e) => {
                        tracing::debug!(group = group.id(), "stream proposal failed: {e}");
                        pause = RETRY_PAUSE;
                    }
                }
            }
        }
        tokio::select! {
            r = status.changed() => if r.is_err() { return },
            r = desired.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

async fn propose(group: &Group, cmd: &StreamCommand) -> crate::error::Result<()> {
    let bytes = group.write(bincode::serialize(cmd)?).await?;
    bincode::deserialize::<std::result::Result<PublishResults, ServerError>>(&bytes)?.map(|_| ())
}
