//! `wharf server` and `wharf dev`.

use std::collections::BTreeMap;

use anyhow::Result;
use wharf_server::{Node, NodeConfig, RaftSettings};

use crate::cli::{DevArgs, RaftArgs, ServerArgs};
use crate::server_config::LogFormat;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn,sled=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        // Fields at the top level, so log pipelines see `node`, `stream`,
        // `consumer` as keys; the current span list adds little here.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

fn settings(args: &RaftArgs) -> RaftSettings {
    RaftSettings {
        heartbeat_ms: args.heartbeat_ms,
        election_min_ms: args.election_min_ms,
        election_max_ms: args.election_max_ms,
        ..RaftSettings::default()
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

pub async fn server(args: ServerArgs) -> Result<()> {
    init_logging(crate::server_config::log_format(&args)?);
    let config = crate::server_config::resolve(args)?;
    let node = Node::start(config).await?;
    let id = node.node_id();
    tokio::select! {
        _ = shutdown_signal() => tracing::info!("shutting down"),
        // Exit code 0: a supervisor should not restart it (see
        // wharf_server's `removal` module).
        _ = node.removed() => tracing::warn!(
            node = id,
            "node {id} was removed from the cluster; its replicas have moved and it left the meta group: shutting down (exit code 0)"
        ),
    }
    node.shutdown().await;
    Ok(())
}

pub async fn dev(args: DevArgs) -> Result<()> {
    init_logging(LogFormat::Text);
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|i| (i, format!("127.0.0.1:{}", 7000 + i)))
        .collect();
    let mut nodes = Vec::new();
    for (id, addr) in &peers {
        let config = NodeConfig {
            node_id: *id,
            listen: addr.parse()?,
            data_dir: args.data.join(format!("node-{id}")),
            peers: peers.clone(),
            join: Vec::new(),
            raft: settings(&args.raft),
            metrics_listen: None,
            limits: Default::default(),
            security: Default::default(),
        };
        nodes.push(Node::start(config).await?);
    }
    println!(
        "Wharf dev cluster running on {} (data in {}). Press Ctrl-C to stop.",
        peers.values().cloned().collect::<Vec<_>>().join(","),
        args.data.display()
    );
    shutdown_signal().await;
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

/// Ask the first server of `servers` for the health of `service`.
pub async fn health(
    servers: &str,
    options: &wharf_client::ConnectOptions,
    service: &str,
) -> Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let addr = servers.split(',').next().unwrap_or_default().trim();
    let endpoint = options
        .endpoint(addr)?
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(3));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("{addr}: {e}"))?;
    let req = HealthCheckRequest {
        service: service.to_string(),
    };
    let status = HealthClient::new(channel)
        .check(req)
        .await?
        .into_inner()
        .status;
    if status == ServingStatus::Serving as i32 {
        println!("{addr}: {service} SERVING");
        Ok(())
    } else {
        anyhow::bail!("{addr}: {service} NOT_SERVING")
    }
}
