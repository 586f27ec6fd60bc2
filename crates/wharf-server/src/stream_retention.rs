//! What a work-queue or interest stream's leader does for retention: it
//! carries the consumers' progress into the stream group.
//!
//! Consumer groups are placed on the nodes of their stream, so the stream's
//! leader holds a replica of every consumer of the stream. Every [`TICK`]
//! (and when the catalog changes) it:
//! 1. proposes `SetConsumers` when the catalog's consumers of the stream
//!    (name, group id, filters) differ from the ones the stream group knows;
//! 2. otherwise reads each known consumer's progress from its local replica
//!    (committed state) and proposes one `Progress` entry with those that
//!    changed. The stream group then removes what every interested consumer
//!    has finished (see `wharf_core::stream::retention`).
//!
//! Why reading a replica is safe: a consumer's "finished" set only grows
//! along its log, so progress from a lagging replica names a subset of what
//! is finished; it can delay a removal, never cause a wrong one.
//!
//! Invariants: one proposal at a time; nothing runs for limits streams;
//! at most [`MAX_PROGRESS_ITEMS`] consumers per `Progress` entry.
//!
//! Left out: removal is not instantaneous: a message leaves the stream up to
//! one tick after its ack commits.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use wharf_core::stream::{ConsumerInterest, ConsumerProgress};
use wharf_raft::{Group, Role};

use crate::error::{Result, ServerError};
use crate::node::NodeInner;
use crate::stream_sm::{PublishResults, StreamCommand, StreamMachine};

/// How often the leader looks at its consumers' progress.
const TICK: Duration = Duration::from_millis(100);
/// Pause after a failed proposal.
const RETRY_PAUSE: Duration = Duration::from_millis(300);
/// Most consumers reported in one entry.
const MAX_PROGRESS_ITEMS: usize = 256;

/// Runs until the group stops or the node goes away.
pub fn spawn(node: Weak<NodeInner>, stream: String, group: Group, sm: Arc<Mutex<StreamMachine>>) {
    tokio::spawn(run(node, stream, group, sm));
}

async fn run(node: Weak<NodeInner>, stream: String, group: Group, sm: Arc<Mutex<StreamMachine>>) {
    let mut status = group.watch_role();
    loop {
        let mut pause = TICK;
        if *status.borrow_and_update() == Role::Leader {
            let Some(node) = node.upgrade() else { return };
            match next_command(&node, &stream, &sm) {
                Ok(Some(cmd)) => {
                    if let Err(e) = propose(&group, &cmd).await {
                        tracing::debug!(%stream, "retention proposal failed: {e}");
                        pause = RETRY_PAUSE;
                    }
                }
                Ok(None) => {}
                Err(_) => return,
            }
            // The stream is gone from this node: stop.
            if node
                .local_stream(&stream)
                .is_none_or(|l| l.group.id() != group.id())
            {
                return;
            }
        }
        tokio::select! {
            r = status.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// The command the stream group needs next, if any.
fn next_command(
    node: &NodeInner,
    stream: &str,
    sm: &Mutex<StreamMachine>,
) -> Result<Option<StreamCommand>> {
    let catalog = node.catalog();
    let mut wanted: Vec<ConsumerInterest> = (catalog.consumers_of(stream))
        .map(|c| {
            let filters = c.config.filters().iter().map(|f| f.to_string()).collect();
            (c.config.name.clone(), c.group_id, filters)
        })
        .collect();
    wanted.sort();
    let known: Vec<ConsumerInterest> = {
        let sm = sm.lock().map_err(|_| poisoned())?;
        (sm.state().interested().iter())
            .map(|(name, c)| (name.clone(), c.id, c.filters.clone()))
            .collect()
    };
    if wanted != known {
        return Ok(Some(StreamCommand::SetConsumers { consumers: wanted }));
    }
    let mut items = Vec::new();
    for (name, id, _) in known {
        let Some(local) = node.local_consumer(stream, &name) else {
            continue;
        };
        if local.group_id != id {
            continue;
        }
        let progress: ConsumerProgress = match local.sm.lock() {
            Ok(c) => c.state().progress(),
            Err(_) => return Err(poisoned()),
        };
        let recorded = sm.lock().map_err(|_| poisoned())?;
        let same =
            (recorded.state().interested().get(&name)).is_some_and(|c| c.progress == progress);
        drop(recorded);
        if !same {
            items.push((name, id, progress));
            if items.len() == MAX_PROGRESS_ITEMS {
                break;
            }
        }
    }
    Ok((!items.is_empty()).then_some(StreamCommand::Progress { items }))
}

async fn propose(group: &Group, cmd: &StreamCommand) -> Result<()> {
    let bytes = group.write(bincode::serialize(cmd)?).await?;
    bincode::deserialize::<std::result::Result<PublishResults, ServerError>>(&bytes)?.map(|_| ())
}

fn poisoned() -> ServerError {
    ServerError::Internal("state lock poisoned".into())
}
