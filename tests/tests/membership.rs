//! Cluster membership with real `wharf server` processes: nodes started with
//! `--join` and added by `wharf cluster peer add`, placement of new streams
//! on them by load, `peer remove` of a node that leads a group while a
//! publisher and workers keep running, a removed node stopping itself (also
//! when it is started again after its removal), and the errors of bad
//! requests.

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use wharf_client::{proto as pb, Client};
use wharf_tests::{eventually, json, stderr, wharf_bin, Cluster};

/// How long a removed node may take to stop by itself: to learn that its
/// removal is done (it asks every second), then a graceful shutdown.
const EXIT_WAIT: Duration = Duration::from_secs(30);

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

/// A client whose first seed is a node still waiting to be added (it knows
/// no meta leader and answers admin calls UNAVAILABLE only after the
/// server's own retry window, longer than the client's): the failed call
/// leaves the client at its next seed, so the next call succeeds. Found by
/// `chaos --seed 2040`, where such a client kept asking the joining node
/// for 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_ran_out_of_time_moves_the_next_one_to_another_seed() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let joining = cluster.spawn_joining()?;
    let seeds = format!("{},{}", cluster.node(joining).addr, cluster.node(1).addr);
    let client = Client::new(&seeds)?.with_retry_for(Duration::from_secs(1));
    eventually(
        "the joining node answers",
        Duration::from_secs(20),
        || async {
            wharf_client::Client::new(&cluster.node(joining).addr)
                .ok()?
                .cluster_status()
                .await
                .ok()
        },
    )
    .await?;
    let first = client.add_stream(stream("FIRST")).await;
    assert!(first.is_err(), "the joining node cannot route: {first:?}");
    client
        .add_stream(stream("SECOND"))
        .await
        .map_err(|e| anyhow::anyhow!("the second call stayed at the joining node: {e}"))?;
    Ok(())
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
    // The removed node stopped by itself (exit code 0).
    let status = cluster.wait_exit(victim, EXIT_WAIT).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "removed node {victim} did not exit by itself: {status:?}"
    );
    Ok(())
}

/// Members, and every group's (name, replicas, voters, leader, term), as
/// each of `nodes` reports them.
type View = Vec<(u64, Vec<u64>, Vec<(String, Vec<u64>, Vec<u64>, u64, u64)>)>;

async fn view(cluster: &Cluster, nodes: &[u64]) -> Option<View> {
    let mut out = Vec::new();
    for id in nodes {
        let s = cluster.status_of(*id, Duration::from_secs(2)).await?;
        let members = s.nodes.iter().map(|n| n.id).collect();
        let groups = (s.groups.iter())
            .map(|g| {
                let (replicas, voters) = (g.replicas.clone(), g.voters.clone());
                (g.name.clone(), replicas, voters, g.leader, g.term)
            })
            .collect();
        out.push((*id, members, groups));
    }
    Some(out)
}

/// The view of `nodes` once every group they host has a leader they agree
/// on (same term) and its Raft voters are its replicas.
async fn settled_view(cluster: &Cluster, nodes: &[u64]) -> anyhow::Result<View> {
    eventually("a settled cluster", Duration::from_secs(60), || async {
        let v = view(cluster, nodes).await?;
        let mut leaders: HashMap<&str, (u64, u64)> = HashMap::new();
        for (_, _, groups) in &v {
            for (name, replicas, voters, leader, term) in groups {
                if voters.is_empty() {
                    continue; // not hosted on this node
                }
                if *leader == 0 || voters != replicas {
                    return None;
                }
                if *leaders.entry(name).or_insert((*leader, *term)) != (*leader, *term) {
                    return None;
                }
            }
        }
        Some(v)
    })
    .await
}

/// Start the removed node `id` again from its data dir: it must exit by
/// itself with code 0 and say why, and `members` must report exactly what
/// they reported before (members, replicas, voters, leaders, terms). The
/// node's log of this run.
async fn restarted_removed_node_exits_quietly(
    cluster: &mut Cluster,
    id: u64,
    members: &[u64],
) -> anyhow::Result<String> {
    let before = settled_view(cluster, members).await?;
    let log_path = cluster.log_path(id);
    let logged_before = std::fs::metadata(&log_path)?.len() as usize;
    cluster.start_node(id)?;
    let status = cluster.wait_exit(id, EXIT_WAIT).await;
    let log = std::fs::read_to_string(&log_path)?;
    let run = log.get(logged_before..).unwrap_or_default().to_string();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "removed node {id}, started again, did not exit by itself: {status:?}\n{run}"
    );
    let why = format!("node {id} was removed from the cluster");
    assert!(run.contains(&why), "no {why:?} in node {id}'s log:\n{run}");
    let after = view(cluster, members).await.context("members' status")?;
    assert_eq!(
        before, after,
        "the cluster changed while removed node {id} ran"
    );
    Ok(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_node_stops_itself_once_its_replicas_moved() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client.add_stream(stream("ORDERS")).await?;
    add_node(&mut cluster)?;
    assert_eq!(
        replicas(&client.add_stream(stream("OTHER")).await?),
        vec![1, 2, 4]
    );
    client.add_consumer("OTHER", consumer("w")).await?;
    for i in 0..10 {
        client.publish("other.x", format!("o{i}")).await?;
    }

    let args = ["cluster", "peer", "remove", "4", "--json"];
    let out = wharf_blocking(cluster.servers(), args.map(String::from).to_vec()).await;
    assert_eq!(json(&out)?["nodes"], serde_json::json!([1, 2, 3]));
    let done = Instant::now();
    let status = cluster.wait_exit(4, EXIT_WAIT).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "node 4 did not exit by itself with code 0 within {EXIT_WAIT:?} of its removal: {status:?}"
    );
    eprintln!(
        "node 4 exited {:?} after the removal was done",
        done.elapsed()
    );
    // It said why, and only after it had let go of its replicas (their
    // moves were done).
    let log = std::fs::read_to_string(cluster.log_path(4))?;
    let why = (log.find("node 4 was removed from the cluster; its replicas have moved"))
        .context("node 4's log does not say why it stopped")?;
    let dropped =
        (log.find("stream group removed")).context("node 4 never dropped its replica of OTHER")?;
    assert!(dropped < why, "node 4 stopped before its replicas moved");
    // The others go on without it.
    let got = drain(&client, "OTHER", "w", 10).await;
    assert_eq!(got, (0..10).map(|i| format!("o{i}")).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_during_its_removal_stops_when_started_again() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client.add_stream(stream("ORDERS")).await?;
    add_node(&mut cluster)?;
    assert_eq!(
        replicas(&client.add_stream(stream("OTHER")).await?),
        vec![1, 2, 4]
    );
    client.add_consumer("OTHER", consumer("w")).await?;
    for i in 0..10 {
        client.publish("other.x", format!("o{i}")).await?;
    }
    // Node 3, the only node OTHER can move to, is down: the move waits.
    cluster.kill(3);
    let args = ["cluster", "peer", "remove", "4", "--json"];
    let remove = tokio::spawn(wharf_blocking(
        cluster.servers(),
        args.map(String::from).to_vec(),
    ));
    eventually(
        "node 4 applied its removal, OTHER still moving",
        Duration::from_secs(60),
        || async {
            let s = cluster.status_of(4, Duration::from_secs(2)).await?;
            let members: Vec<u64> = s.nodes.iter().map(|n| n.id).collect();
            let other = s.groups.iter().find(|g| g.name == "OTHER")?;
            (members == [1, 2, 3] && other.voters.contains(&4)).then_some(())
        },
    )
    .await?;
    cluster.kill(4);
    cluster.start_node(3)?;
    let out = remove.await?;
    assert_eq!(json(&out)?["nodes"], serde_json::json!([1, 2, 3]));

    // Its stored catalog says it was removed: it asks, and starts nothing.
    let run = restarted_removed_node_exits_quietly(&mut cluster, 4, &[1, 2, 3]).await?;
    assert!(
        run.contains("the stored catalog says this node was removed"),
        "{run}"
    );
    assert!(
        !run.contains("stream group started") && !run.contains("consumer group started"),
        "node 4 started a stream or consumer group after its removal:\n{run}"
    );
    let got = drain(&client, "OTHER", "w", 10).await;
    assert_eq!(got, (0..10).map(|i| format!("o{i}")).collect::<Vec<_>>());
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

    // Started again with its old data dir, whose catalog predates the
    // removal, node 2 finds out from the others and stops by itself; its
    // stale replicas disturb nobody meanwhile.
    restarted_removed_node_exits_quietly(&mut cluster, 2, &[1, 3, 4]).await?;
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
