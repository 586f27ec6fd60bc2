//! Consumer features with a SIGKILL of the consumer group's leader node in
//! the middle: in-progress, BackOff timing with MaxDeliver, term, the
//! overflow priority policy and the ack-all policy. Each test does the
//! feature, kills (kill -9) the node leading `JOBS/w`, waits for a new leader
//! and checks that the feature's replicated state carries on there.
//!
//! Every wait is bounded and on a condition (a delivery, consumer info, a
//! group leader); the only plain time passing is where the assertion is
//! about time (AckWait, BackOff steps). Deadlines are generous: the machine
//! is shared. Left out: nak with delay, dedup and pinned groups, which have
//! their own failover tests (ack_kinds.rs, stream_features.rs,
//! priority_groups.rs).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, Cluster};

/// The consumer group every test kills the leader of.
const GROUP: &str = "JOBS/w";
/// How long a new consumer leader may take to appear on a loaded machine.
const ELECTION_DEADLINE: Duration = Duration::from_secs(30);

async fn setup(cluster: &Cluster, config: pb::ConsumerConfig) -> anyhow::Result<Client> {
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    client.add_consumer("JOBS", config).await?;
    cluster.wait_group_leader(GROUP, ELECTION_DEADLINE).await?;
    Ok(client)
}

/// SIGKILL the node leading the consumer group; returns (killed node, new
/// leader, when the new leader was seen).
async fn kill_consumer_leader(cluster: &mut Cluster) -> anyhow::Result<(u64, u64, Instant)> {
    let old = cluster.wait_group_leader(GROUP, ELECTION_DEADLINE).await?;
    cluster.kill(old);
    let new = cluster.wait_group_leader(GROUP, ELECTION_DEADLINE).await?;
    assert_ne!(new, old, "the killed node cannot still lead {GROUP}");
    eprintln!("killed node {old} leading {GROUP}; node {new} leads now");
    Ok((old, new, Instant::now()))
}

/// Consumer info once the consumer answers (through any running node).
async fn info(client: &Client) -> anyhow::Result<pb::ConsumerInfo> {
    eventually("consumer info", Duration::from_secs(30), || async {
        client.consumer_info("JOBS", "w").await.ok()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_mid_in_progress() -> anyhow::Result<()> {
    const ACK_WAIT: Duration = Duration::from_secs(5);
    let mut cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        ack_wait_ms: ACK_WAIT.as_millis() as u64,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    client.publish("jobs.a", "slow").await?;
    let mut slow = client.consumer("JOBS", "w");
    let m = slow.fetch(1, Duration::from_secs(10)).await?.remove(0);
    assert_eq!(m.delivered, 1);
    let seq = m.stream_seq;

    // The slow worker reports progress every 500 ms, through the failover,
    // and records when its latest report was committed.
    let stop = Arc::new(AtomicBool::new(false));
    let last_report = Arc::new(Mutex::new(Instant::now()));
    let reporter = {
        let (stop, last_report) = (stop.clone(), last_report.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                slow.in_progress(seq).await?;
                *last_report.lock().unwrap() = Instant::now();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            anyhow::Ok(slow)
        })
    };
    // Another worker keeps pulling: it must not get the message while the
    // slow worker reports progress.
    let mut other = client.consumer("JOBS", "w");
    let before_kill = Instant::now() + ACK_WAIT / 2;
    while Instant::now() < before_kill {
        let stolen = other.fetch(1, Duration::from_secs(1)).await?;
        assert!(
            stolen.is_empty(),
            "redelivered while in progress: {stolen:?}"
        );
    }
    let (_, _, elected) = kill_consumer_leader(&mut cluster).await?;
    // Reports reach the new leader...
    eventually(
        "an in-progress report committed by the new leader",
        Duration::from_secs(30),
        || async { (*last_report.lock().unwrap() > elected).then_some(()) },
    )
    .await?;
    // ... and keep the message from the other worker for two more AckWaits.
    let keep_until = Instant::now() + ACK_WAIT * 2;
    while Instant::now() < keep_until {
        let stolen = other.fetch(1, Duration::from_secs(1)).await?;
        assert!(
            stolen.is_empty(),
            "redelivered after the failover while in progress: {stolen:?}"
        );
    }
    let i = info(&client).await?;
    assert_eq!((i.num_ack_pending, i.num_redelivered), (1, 0), "{i:?}");

    // The slow worker stops reporting: one AckWait after its last report the
    // message goes to the other worker, as a second delivery.
    stop.store(true, Ordering::SeqCst);
    let _slow = reporter.await??;
    let stopped = *last_report.lock().unwrap();
    let again = other.fetch(1, Duration::from_secs(30)).await?;
    let waited = stopped.elapsed();
    assert_eq!(
        again.len(),
        1,
        "never redelivered after the reports stopped"
    );
    assert_eq!((again[0].stream_seq, again[0].delivered), (seq, 2));
    assert!(
        waited >= ACK_WAIT - Duration::from_millis(500),
        "redelivered {waited:?} after the last in-progress, AckWait is {ACK_WAIT:?}"
    );
    other.ack(seq).await?;
    let i = info(&client).await?;
    assert_eq!((i.num_ack_pending, i.num_redelivered), (0, 1), "{i:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_mid_backoff() -> anyhow::Result<()> {
    const STEP_1: Duration = Duration::from_secs(1);
    const STEP_2: Duration = Duration::from_secs(3);
    // Delivery latency the client sees after the server stamped a delivery.
    const EARLY_TOLERANCE: Duration = Duration::from_millis(300);
    // A new leader re-arms the timer from the replicated delivery time; more
    // than this late means it did not (say it restarted a full AckWait).
    const LATE_TOLERANCE: Duration = Duration::from_secs(4);
    let mut cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        backoff_ms: vec![STEP_1.as_millis() as u64, STEP_2.as_millis() as u64],
        max_deliver: 3,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    client.publish("jobs.a", "flaky").await?;
    let mut worker = client.consumer("JOBS", "w");
    let first = worker.fetch(1, Duration::from_secs(10)).await?.remove(0);
    let t1 = Instant::now();
    assert_eq!(first.delivered, 1);
    let second = worker.fetch(1, Duration::from_secs(15)).await?.remove(0);
    let t2 = Instant::now();
    assert_eq!((second.stream_seq, second.delivered), (first.stream_seq, 2));
    assert!(
        t2 - t1 >= STEP_1 - EARLY_TOLERANCE,
        "first step is {STEP_1:?}, redelivered after {:?}",
        t2 - t1
    );

    // The second step (3 s) runs while the consumer's leader dies.
    let (_, _, elected) = kill_consumer_leader(&mut cluster).await?;
    let third = worker.fetch(1, Duration::from_secs(30)).await?;
    let t3 = Instant::now();
    assert_eq!(third.len(), 1, "no third delivery after the failover");
    assert_eq!(
        (third[0].stream_seq, third[0].delivered),
        (first.stream_seq, 3)
    );
    let gap = t3 - t2;
    eprintln!(
        "second step: redelivered {gap:?} after the second delivery; new leader seen after {:?}",
        elected - t2
    );
    assert!(
        gap >= STEP_2 - EARLY_TOLERANCE,
        "second step is {STEP_2:?}, redelivered after {gap:?}"
    );
    let due = (t2 + STEP_2).max(elected);
    assert!(
        t3 <= due + LATE_TOLERANCE,
        "redelivered {:?} after it was due (second step {STEP_2:?}, gap {gap:?})",
        t3 - due
    );

    // MaxDeliver 3: after the last step the consumer gives the message up,
    // and nobody gets it again.
    let i = eventually("max deliver reached", Duration::from_secs(30), || async {
        let i = client.consumer_info("JOBS", "w").await.ok()?;
        (i.num_exhausted == 1).then_some(i)
    })
    .await?;
    let exhausted_after = t3.elapsed();
    assert!(
        exhausted_after >= STEP_2 - EARLY_TOLERANCE,
        "given up {exhausted_after:?} after the third delivery, last step is {STEP_2:?}"
    );
    assert_eq!(i.num_ack_pending, 0, "{i:?}");
    assert_eq!(i.num_redelivered, 1, "{i:?}");
    assert_eq!(i.delivered.unwrap_or_default().consumer_seq, 3, "{i:?}");
    assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, 1, "{i:?}");
    let late = worker.fetch(1, STEP_2 + Duration::from_secs(1)).await?;
    assert!(late.is_empty(), "delivered after MaxDeliver: {late:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_mid_term() -> anyhow::Result<()> {
    const ACK_WAIT: Duration = Duration::from_secs(2);
    let mut cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        ack_wait_ms: ACK_WAIT.as_millis() as u64,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    client.publish("jobs.bad", "poison").await?;
    client.publish("jobs.good", "fine").await?;
    let mut worker = client.consumer("JOBS", "w");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(worker.fetch(2, Duration::from_secs(5)).await?);
    }
    assert_eq!(got.iter().map(|m| m.stream_seq).collect::<Vec<_>>(), [1, 2]);
    // Term the poison message; leave the good one unacked, so its
    // redelivery after the failover shows the new leader redelivers at all.
    worker.term(1, "cannot parse").await?;
    let i = info(&client).await?;
    assert_eq!((i.num_terminated, i.num_ack_pending), (1, 1), "{i:?}");

    kill_consumer_leader(&mut cluster).await?;
    let i = info(&client).await?;
    assert_eq!((i.num_terminated, i.num_ack_pending), (1, 1), "{i:?}");
    let again = worker.fetch(1, Duration::from_secs(30)).await?;
    assert_eq!(again.len(), 1, "the unacked message was not redelivered");
    assert_eq!((again[0].stream_seq, again[0].delivered), (2, 2));
    worker.ack(2).await?;
    // Several AckWaits later the termed message is still never redelivered.
    let quiet_until = Instant::now() + ACK_WAIT * 3;
    while Instant::now() < quiet_until {
        let late = worker.fetch(1, Duration::from_secs(1)).await?;
        assert!(late.is_empty(), "termed message redelivered: {late:?}");
    }
    let i = info(&client).await?;
    assert_eq!(i.num_terminated, 1, "{i:?}");
    assert_eq!(i.num_ack_pending, 0, "{i:?}");
    assert_eq!(i.num_redelivered, 1, "{i:?}");
    assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, 2, "{i:?}");
    Ok(())
}

/// Fetch with a standby worker while checking (through consumer info) that
/// its pull reached the consumer's current leader, so an empty answer means
/// "not served" rather than "not yet registered".
async fn standby_fetch_registered(
    client: &Client,
    standby: wharf_client::Consumer,
    batch: u32,
    wait: Duration,
) -> anyhow::Result<(wharf_client::Consumer, Vec<wharf_client::Message>)> {
    let pull = tokio::spawn(async move {
        let mut standby = standby;
        let got = standby.fetch(batch, wait).await;
        (standby, got)
    });
    // Poll until the pull shows as waiting or has already been answered.
    let mut registered = false;
    while !registered && !pull.is_finished() {
        if let Ok(i) = client.consumer_info("JOBS", "w").await {
            registered = i.num_waiting >= 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (standby, got) = pull.await?;
    let got = got?;
    anyhow::ensure!(
        registered || !got.is_empty(),
        "the standby's pull never showed as waiting on the consumer's leader"
    );
    Ok((standby, got))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_mid_overflow() -> anyhow::Result<()> {
    const THRESHOLD: u64 = 5;
    let mut cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        priority_policy: pb::PriorityPolicy::PriorityOverflow as i32,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    let mut seen = BTreeSet::new();
    let mut main = client.consumer("JOBS", "w");
    let mut standby = client.consumer("JOBS", "w").with_overflow(THRESHOLD, 0);
    let mut published = 0u64;
    let started = Instant::now();

    for round in ["before", "after"] {
        // Below the threshold (3 unprocessed) the standby gets nothing.
        for _ in 0..3 {
            published += 1;
            client.publish("jobs.a", format!("m{published}")).await?;
        }
        let (s, got) =
            standby_fetch_registered(&client, standby, 10, Duration::from_secs(3)).await?;
        standby = s;
        assert!(
            got.is_empty(),
            "{round} the failover the standby got {got:?} with 3 unprocessed (threshold {THRESHOLD})"
        );
        eprintln!(
            "{round}: below threshold checked at {:?}",
            started.elapsed()
        );
        // Above it (3 + 5 = 8 unprocessed) the standby helps.
        for _ in 0..5 {
            published += 1;
            client.publish("jobs.a", format!("m{published}")).await?;
        }
        let (s, helped) =
            standby_fetch_registered(&client, standby, 2, Duration::from_secs(15)).await?;
        standby = s;
        assert!(
            !helped.is_empty(),
            "{round} the failover the standby got nothing with 8 unprocessed"
        );
        let helped_seqs: Vec<u64> = helped.iter().map(|m| m.stream_seq).collect();
        eprintln!(
            "{round}: standby got {helped_seqs:?} at {:?}",
            started.elapsed()
        );
        for m in &helped {
            assert!(seen.insert(m.stream_seq), "delivered twice: {m:?}");
            assert_eq!(m.delivered, 1, "{m:?}");
            standby.ack(m.stream_seq).await?;
        }
        // The main worker (no threshold) takes the rest.
        let deadline = Instant::now() + Duration::from_secs(30);
        while (seen.len() as u64) < published && Instant::now() < deadline {
            for m in main.fetch(10, Duration::from_secs(2)).await? {
                assert!(seen.insert(m.stream_seq), "delivered twice: {m:?}");
                main.ack(m.stream_seq).await?;
            }
        }
        assert_eq!(seen.len() as u64, published, "{round}: not all delivered");
        eprintln!("{round}: main drained at {:?}", started.elapsed());
        let i = info(&client).await?;
        assert_eq!((i.num_pending, i.num_ack_pending), (0, 0), "{i:?}");
        if round == "before" {
            kill_consumer_leader(&mut cluster).await?;
            let i = info(&client).await?;
            assert_eq!(
                i.delivered.unwrap_or_default().stream_seq,
                published,
                "{i:?}"
            );
            assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, published);
        }
    }
    assert_eq!(seen, (1..=published).collect::<BTreeSet<_>>());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_mid_ack_all() -> anyhow::Result<()> {
    const ACK_WAIT: Duration = Duration::from_secs(2);
    let mut cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        ack_wait_ms: ACK_WAIT.as_millis() as u64,
        ack_policy: pb::AckPolicy::AckAll as i32,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    for i in 1..=10 {
        client.publish("jobs.a", format!("m{i}")).await?;
    }
    let mut worker = client.consumer("JOBS", "w");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 10 && Instant::now() < deadline {
        got.extend(worker.fetch(10, Duration::from_secs(5)).await?);
    }
    let seqs: Vec<u64> = got.iter().map(|m| m.stream_seq).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    // Acking 6 settles 1..=6.
    worker.ack(6).await?;
    let i = info(&client).await?;
    assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, 6, "{i:?}");
    assert_eq!(i.num_ack_pending, 4, "{i:?}");

    kill_consumer_leader(&mut cluster).await?;
    let i = info(&client).await?;
    assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, 6, "{i:?}");
    assert_eq!(i.num_ack_pending, 4, "{i:?}");
    // After AckWait the new leader redelivers 7..=10 and nothing below.
    let mut again = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while again.len() < 4 && Instant::now() < deadline {
        for m in worker.fetch(4, Duration::from_secs(5)).await? {
            assert!(m.stream_seq > 6, "acked-all message redelivered: {m:?}");
            assert_eq!(m.delivered, 2, "{m:?}");
            again.insert(m.stream_seq);
        }
    }
    assert_eq!(again, (7..=10).collect::<BTreeSet<_>>());
    // Acking 10 settles the rest, across the leader change.
    worker.ack(10).await?;
    let i = info(&client).await?;
    assert_eq!(i.ack_floor.unwrap_or_default().stream_seq, 10, "{i:?}");
    assert_eq!((i.num_ack_pending, i.num_redelivered), (0, 4), "{i:?}");
    let late = worker.fetch(10, ACK_WAIT * 2).await?;
    assert!(late.is_empty(), "redelivered after ack-all: {late:?}");
    Ok(())
}
