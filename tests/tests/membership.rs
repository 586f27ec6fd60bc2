//! Cluster membership with real `wharf server` processes: nodes started with
//! `--join` and added by `wharf cluster peer add`, placement of new streams
//! on them by load, `peer remove` of a node that leads a group while a
//! publisher and workers keep running, and the errors of bad requests.

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf_client::{proto as pb, Client};
use wharf_tests::{eventually, json, stderr, wharf_bin, Cluster};

fn stream(name: &str) -> pb::StreamConfig {
    pb::StreamConfig {
        name: name.into(),
        subjects: vec![format!("{}.>", name.to_lowercase())],
        ..Default::default()
    }
}

fn consumer(name: &str) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        name: name.into(),
        ..Default::default()
    }
}

fn replicas(info: &pb::StreamInfo) -> Vec<u64> {
    info.cluster.clone().unwrap_or_default().replicas
}

/// Start a node with `--join` and add it with the CLI.
fn add_node(cluster: &mut Cluster) -> anyhow::Result<u64> {
    let id = cluster.spawn_joining()?;
    let addr = cluster.node(id).addr.clone();
    let out = cluster.wharf(&["cluster", "peer", "add", &id.to_string(), &addr, "--json"]);
    let v = json(&out)?;
    assert_eq!(v["added"], id, "{v}");
    Ok(id)
}

/// Run the CLI off the async runtime (a removal waits for replicas to move).
async fn wharf_blocking(servers: String, args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(wharf_bin())
            .args(&args)
            .env("WHARF_RETRY_FOR", "30s")
            .env("WHARF_SERVER", servers)
            .output()
            .expect("run wharf")
    })
    .await
    .expect("join")
}

/// Fetch and ack `n` messages of `stream`/`name`; their payloads.
async fn drain(client: &Client, stream: &str, name: &str, n: usize) -> Vec<String> {
    let mut c = client.consumer(stream, name);
    let mut got = Vec::new();
    while got.len() < n {
        for m in c
            .fetch(10, Duration::from_millis(500))
            .await
            .expect("fetch")
        {
            c.ack(m.stream_seq).await.expect("ack");
            got.push(String::from_utf8_lossy(&m.payload).into_owned());
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joined_nodes_become_voters_and_take_new_streams_by_load() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client.add_stream(stream("ORDERS")).await?;
    client.add_consumer("ORDERS", consumer("shipping")).await?;
    for i in 0..10 {
        client.publish("orders.created", format!("m{i}")).await?;
    }

    assert_eq!(add_node(&mut cluster)?, 4);
    assert_eq!(add_node(&mut cluster)?, 5);
    // Node 5 itself sees all five members and a meta group of five voters.
    eventually("five members", Duration::from_secs(30), || async {
        let s = cluster.status_of(5, Duration::from_secs(2)).await?;
        let meta = s.groups.iter().find(|g| g.name == "meta")?;
        let ids: Vec<u64> = s.nodes.iter().map(|n| n.id).collect();
        let ok = ids == [1, 2, 3, 4, 5]
            && meta.voters == [1, 2, 3, 4, 5]
            && meta.leader != 0
            && (meta.local_role == "follower" || meta.local_role == "leader");
        ok.then_some(())
    })
    .await?;

    // ORDERS holds one group on each of 1, 2, 3: the empty nodes come first.
    let a = client.add_stream(stream("NEW1")).await?;
    assert_eq!(replicas(&a), vec![1, 4, 5]);
    let b = client.add_stream(stream("NEW2")).await?;
    assert_eq!(replicas(&b), vec![2, 3, 4]);

    // The groups on the new nodes work end to end.
    client.add_consumer("NEW1", consumer("w")).await?;
    for i in 0..5 {
        client.publish("new1.x", format!("n{i}")).await?;
    }
    let got = drain(&client, "NEW1", "w", 5).await;
    assert_eq!(got, (0..5).map(|i| format!("n{i}")).collect::<Vec<_>>());
    // And the stream from before the joins still delivers everything.
    let old = drain(&client, "ORDERS", "shipping", 10).await;
    assert_eq!(old.len(), 10);

    // A joined node restarts from its data dir as a member (the founding
    // node set it got from a seed is stored there) with its replicas.
    cluster.restart(5)?;
    eventually("node 5 back with NEW1", Duration::from_secs(30), || async {
        let info = cluster.client_of(5).stream_info_local("NEW1").await.ok()?;
        let s = cluster.status_of(5, Duration::from_secs(2)).await?;
        let meta = s.groups.iter().find(|g| g.name == "meta")?;
        let messages = info.state.unwrap_or_default().messages;
        (messages == 5 && meta.leader != 0 && meta.voters == [1, 2, 3, 4, 5]).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_a_leading_node_under_load_moves_its_replicas() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client.add_stream(stream("ORDERS")).await?;
    client.add_consumer("ORDERS", consumer("shipping")).await?;
    add_node(&mut cluster)?;
    // A stream that lands on the new node too (1, 2 and 4 by load).
    assert_eq!(
        replicas(&client.add_stream(stream("OTHER")).await?),
        vec![1, 2, 4]
    );
    let victim = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(20))
        .await?;
    eprintln!("removing node {victim}, leader of ORDERS");

    let acked: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let published = Arc::new(AtomicU64::new(0));
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_working = Arc::new(AtomicBool::new(false));

    let publisher = {
        let (client, acked, published) = (client.clone(), acked.clone(), published.clone());
        let stop = stop_publishing.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("m{i}");
                // A publish whose outcome is unknown is retried with the
                // same id: the stream stores it once.
                let mut tries = 0;
                while let Err(e) = client.publish_with_id("orders.new", id.clone(), &id).await {
                    tries += 1;
                    assert!(tries < 5, "publish {id} keeps failing: {e}");
                }
                acked.lock().unwrap().insert(id);
                published.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        })
    };
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (client, seen, stop) = (client.clone(), seen.clone(), stop_working.clone());
        workers.push(tokio::spawn(async move {
            let mut c = client.consumer("ORDERS", "shipping");
            while !stop.load(Ordering::SeqCst) {
                let batch = c
                    .fetch(10, Duration::from_millis(500))
                    .await
                    .expect("fetch rides through the move");
                for m in batch {
                    let id = String::from_utf8_lossy(&m.payload).into_owned();
                    *seen.lock().unwrap().entry(id).or_default() += 1;
                    c.ack(m.stream_seq)
                        .await
                        .expect("ack rides through the move");
                }
            }
        }));
    }

    eventually("some load", Duration::from_secs(60), || async {
        (published.load(Ordering::SeqCst) >= 200).then_some(())
    })
    .await?;
    let args = ["cluster", "peer", "remove", &victim.to_string(), "--json"];
    let out = wharf_blocking(cluster.servers(), args.map(String::from).to_vec()).await;
    let v = json(&out)?;
    assert_eq!(v["removed"], victim, "{v}");
    assert!(v["moved_groups"].as_u64().unwrap_or(0) >= 2, "{v}");
    let at_removal = published.load(Ordering::SeqCst);
    eventually("publishing goes on", Duration::from_secs(30), || async {
        (published.load(Ordering::SeqCst) >= at_removal + 100).then_some(())
    })
    .await?;
    stop_publishing.store(true, Ordering::SeqCst);
    publisher.await?;

    let acked = acked.lock().unwrap().clone();
    eventually(
        "every acknowledged publish delivered",
        Duration::from_secs(90),
        || async {
            let seen = seen.lock().unwrap();
            acked.iter().all(|id| seen.contains_key(id)).then_some(())
        },
    )
    .await?;
    stop_working.store(true, Ordering::SeqCst);
    for w in workers {
        w.await?;
    }
    let twice: Vec<(String, u32)> = (seen.lock().unwrap().iter())
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| (id.clone(), *n))
        .collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let info = client.stream_info("ORDERS").await?;
    assert_eq!(
        info.state.unwrap_or_default().messages,
        acked.len() as u64,
        "each acknowledged publish stored once"
    );

    // Every group: three replicas, none on the removed node, and the Raft
    // voters (as each remaining replica sees them) are exactly those.
    let remaining: Vec<u64> = (1..=4).filter(|n| *n != victim).collect();
    eventually(
        "groups moved off the node",
        Duration::from_secs(30),
        || async {
            for n in &remaining {
                let s = cluster.status_of(*n, Duration::from_secs(2)).await?;
                let ids: Vec<u64> = s.nodes.iter().map(|n| n.id).collect();
                if ids != remaining {
                    return None;
                }
                for g in &s.groups {
                    if g.replicas.len() != 3 || g.replicas.contains(&victim) {
                        return None;
                    }
                    if !g.local_role.is_empty() && g.voters != g.replicas {
                        return None;
                    }
                }
            }
            Some(())
        },
    )
    .await?;
    // The removed node stopped every group but its (departed) meta replica.
    eventually(
        "removed node stopped its groups",
        Duration::from_secs(30),
        || async {
            let s = cluster.status_of(victim, Duration::from_secs(2)).await?;
            let hosted: Vec<&str> = (s.groups.iter())
                .filter(|g| g.kind != "meta" && !g.local_role.is_empty())
                .map(|g| g.name.as_str())
                .collect();
            hosted.is_empty().then_some(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peer_commands_refuse_bad_requests_clearly() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let fails_with = |args: &[&str], text: &str| {
        let out = cluster.wharf(args);
        assert_eq!(out.status.code(), Some(1), "{args:?} should fail");
        let err = stderr(&out);
        assert!(err.contains(text), "{args:?}: expected {text:?} in {err:?}");
    };
    fails_with(
        &["cluster", "peer", "remove", "9"],
        "node 9 is not a member of the cluster (members: 1, 2, 3)",
    );
    fails_with(
        &["cluster", "peer", "remove", "2"],
        "removing node 2 would leave 2 nodes; a cluster keeps at least 3",
    );
    fails_with(
        &["cluster", "peer", "add", "2", "127.0.0.1:1"],
        "node 2 is already a member of the cluster",
    );
    let taken = cluster.node(1).addr.clone();
    fails_with(
        &["cluster", "peer", "add", "7", &taken],
        &format!("address {taken} is already used by node 1"),
    );
    fails_with(
        &["cluster", "peer", "add", "0", "127.0.0.1:1"],
        "node id must be 1 or more",
    );
    fails_with(
        &["cluster", "peer", "add", "7", "no-port"],
        "address \"no-port\" is not host:port",
    );
    // Nothing listens there: the learner never catches up, and is taken out.
    let nobody = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("127.0.0.1:{}", l.local_addr()?.port())
    };
    fails_with(&["cluster", "peer", "add", "7", &nobody], "node 7 at");
    let s = cluster.status().await?;
    let meta = s.groups.iter().find(|g| g.name == "meta").expect("meta");
    assert_eq!(meta.replicas, vec![1, 2, 3]);
    assert_eq!(s.nodes.len(), 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_node_can_be_removed_and_its_replicas_replaced() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client.add_stream(stream("ORDERS")).await?;
    client.add_consumer("ORDERS", consumer("shipping")).await?;
    for i in 0..20 {
        client.publish("orders.created", format!("m{i}")).await?;
    }
    add_node(&mut cluster)?;
    cluster.kill(2);
    let args = ["cluster", "peer", "remove", "2", "--json"];
    let out = wharf_blocking(cluster.servers(), args.map(String::from).to_vec()).await;
    let v = json(&out)?;
    assert_eq!(v["nodes"], serde_json::json!([1, 3, 4]), "{v}");
    eventually("replicas on 1, 3, 4", Duration::from_secs(30), || async {
        let s = cluster.status_of(4, Duration::from_secs(2)).await?;
        let all_moved = s
            .groups
            .iter()
            .all(|g| g.replicas == [1, 3, 4] && (g.local_role.is_empty() || g.voters == [1, 3, 4]));
        all_moved.then_some(())
    })
    .await?;
    // Nothing was lost: the replacement holds the log, and with node 1 or 3
    // it forms a majority.
    let got = drain(&client, "ORDERS", "shipping", 20).await;
    assert_eq!(got, (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>());
    let local = cluster.client_of(4).stream_info_local("ORDERS").await;
    assert_eq!(local?.state.unwrap_or_default().messages, 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_replica_stream_moves_off_a_removed_node() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    add_node(&mut cluster)?;
    let single = pb::StreamConfig {
        replicas: 1,
        ..stream("SOLO")
    };
    // Every node is empty: the lowest id takes it.
    assert_eq!(replicas(&client.add_stream(single).await?), vec![1]);
    client.add_consumer("SOLO", consumer("w")).await?;
    for i in 0..10 {
        client.publish("solo.x", format!("s{i}")).await?;
    }
    let args = ["cluster", "peer", "remove", "1", "--json"];
    let out = wharf_blocking(cluster.servers(), args.map(String::from).to_vec()).await;
    assert_eq!(json(&out)?["nodes"], serde_json::json!([2, 3, 4]));
    let info = client.stream_info("SOLO").await?;
    assert_eq!(replicas(&info), vec![2]);
    assert_eq!(info.state.unwrap_or_default().messages, 10);
    let got = drain(&client, "SOLO", "w", 10).await;
    assert_eq!(got, (0..10).map(|i| format!("s{i}")).collect::<Vec<_>>());
    Ok(())
}
