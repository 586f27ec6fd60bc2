//! gRPC health (grpc.health.v1) for probes.
//!
//! - `live`: SERVING while the process runs; needs no quorum, so a liveness
//!   probe never restarts a node just because its peers are down.
//! - `ready`, `wharf.v1.Wharf` and the overall `""`: SERVING only when the meta
//!   group has a leader and this node has applied everything it knows to be
//!   committed, i.e. it has joined and caught up. A node shutting down reports
//!   NOT_SERVING so load balancers stop sending it clients.
//!
//! The status is looked at again on every change of the meta group's status
//! (a probe right after the node caught up sees SERVING, not the status of
//! the last tick) and on a tick, which also catches the start of draining.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::node::NodeInner;

const CHECK_EVERY: Duration = Duration::from_millis(250);
const READY_SERVICES: [&str; 3] = ["", "ready", "wharf.v1.Wharf"];

pub(crate) fn ready(node: &NodeInner) -> bool {
    let meta = node.meta.status();
    meta.leader.is_some() && meta.last_applied >= meta.committed
}

pub async fn report(
    node: Arc<NodeInner>,
    reporter: HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) {
    reporter
        .set_service_status("live", ServingStatus::Serving)
        .await;
    let mut meta = node.meta.watch();
    let mut last = None;
    loop {
        let draining = node.draining.load(std::sync::atomic::Ordering::SeqCst);
        let status = if *shutdown.borrow() || draining {
            ServingStatus::NotServing
        } else if ready(&node) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            for service in READY_SERVICES {
                reporter.set_service_status(service, status).await;
            }
            last = Some(status);
        }
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            Ok(()) = meta.changed() => {}
            r = shutdown.changed() => if r.is_err() { return },
        }
    }
}
