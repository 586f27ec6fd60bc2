//! Reflection, JSON logs and readiness, on real `wharf server` processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use wharf_tests::{eventually, free_port, wharf_bin, Cluster};

/// Kills its process when dropped, so a failing test leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_wharf_service() -> Result<()> {
    let cluster = Cluster::start(1).await?;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.node(1).addr))?
            .connect()
            .await?;
    let mut client = ServerReflectionClient::new(channel);
    let requests = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "wharf.v1.Wharf".into(),
            )),
        },
    ];
    let mut responses = client
        .server_reflection_info(futures::stream::iter(requests))
        .await?
        .into_inner();

    let first = responses.message().await?.context("no list answer")?;
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        bail!("unexpected answer {first:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"wharf.v1.Wharf"), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let second = responses.message().await?.context("no file answer")?;
    let Some(MessageResponse::FileDescriptorResponse(files)) = second.message_response else {
        bail!("unexpected answer {second:?}");
    };
    // The encoded FileDescriptorProto names the proto file and the service.
    let bytes: Vec<u8> = files.file_descriptor_proto.concat();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("wharf/v1/wharf.proto"), "{text}");
    assert!(text.contains("Wharf") && text.contains("Publish"), "{text}");
    Ok(())
}

#[test]
fn log_format_json_writes_json_lines() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Proc(
        Command::new(wharf_bin())
            .args(["server", "--node-id", "1", "--listen", &addr])
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(["--peers", &format!("1={addr}"), "--log-format", "json"])
            .env("WHARF_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let stderr = child.0.stderr.take().context("stderr")?;
    // Read on a thread: the deadline below holds even if no line ever comes.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            bail!("no `wharf node started` line within 30 s; saw {lines:#?}");
        };
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("log line is not JSON: {line:?}"))?;
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["level"].is_string(), "{line}");
        let started = v["message"] == "wharf node started";
        lines.push(v);
        if started {
            break;
        }
    }
    let started = lines.last().expect("a line");
    assert_eq!(started["level"], "INFO");
    assert_eq!(started["node"], 1, "fields are top-level keys: {started}");
    assert_eq!(started["addr"], addr.as_str());
    Ok(())
}

fn health(addr: &str, service: &str) -> bool {
    Command::new(wharf_bin())
        .args(["--server", addr, "health", "--service", service])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `health` without blocking the runtime.
async fn health_async(addr: &str, service: &'static str) -> bool {
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || health(&addr, service))
        .await
        .unwrap_or(false)
}

fn spawn_node(id: u64, addrs: &[String], dir: &std::path::Path) -> Result<Proc> {
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let log = std::fs::File::create(dir.join(format!("node-{id}.log")))?;
    let child = Command::new(wharf_bin())
        .args(["server", "--node-id", &id.to_string()])
        .args(["--listen", &addrs[id as usize - 1]])
        .arg("--data")
        .arg(dir.join(format!("node-{id}")))
        .args(["--peers", &peers])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok(Proc(child))
}

/// A node alone (no quorum, so it has not joined a cluster with a leader) is
/// live but not ready; it turns ready once enough peers start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_only_after_joining() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let _node1 = spawn_node(1, &addrs, dir.path())?;
    let a1 = addrs[0].as_str();
    eventually("node 1 live", Duration::from_secs(30), || async {
        health_async(a1, "live").await.then_some(())
    })
    .await?;
    // Several election timeouts (0.5-0.9 s by default) pass without a quorum: never ready.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(
            !health_async(a1, "ready").await,
            "a node without a quorum reported ready"
        );
        assert!(
            health_async(a1, "live").await,
            "live must not depend on the quorum"
        );
    }
    let _node2 = spawn_node(2, &addrs, dir.path())?;
    eventually(
        "node 1 ready after node 2 joins",
        Duration::from_secs(30),
        || async { health_async(a1, "ready").await.then_some(()) },
    )
    .await?;
    Ok(())
}
