//! The dead-letter subject on a real cluster: a termed message and one that
//! reached MaxDeliver are published once, with headers naming their origin,
//! delivery count and reason, also when the consumer's leader is killed in
//! the middle.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, Cluster};

async fn dlq_messages(client: &Client) -> Option<u64> {
    let info = client.stream_info("DLQ").await.ok()?;
    Some(info.state.unwrap_or_default().messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termed_and_exhausted_messages_reach_the_dead_letter_stream_once() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    for (name, subject, retention) in [
        ("JOBS", "jobs.>", pb::RetentionPolicy::RetentionWorkqueue),
        ("DLQ", "dlq.>", pb::RetentionPolicy::RetentionLimits),
    ] {
        client
            .add_stream(pb::StreamConfig {
                name: name.into(),
                subjects: vec![subject.into()],
                retention: retention as i32,
                ..Default::default()
            })
            .await?;
    }
    // The CLI flags create the consumer.
    let out = cluster.wharf(&[
        "consumer",
        "add",
        "JOBS",
        "w",
        "--ack-wait",
        "1s",
        "--max-deliver",
        "2",
        "--dead-letter-subject",
        "dlq.jobs",
        "--json",
    ]);
    let info = wharf_tests::json(&out)?;
    assert_eq!(info["config"]["dead_letter_subject"], "dlq.jobs");

    let headers = [("Trace-Id".to_string(), "t-1".to_string())].into();
    client
        .publish_with_headers("jobs.bad", "poison", "", headers)
        .await?;
    client.publish("jobs.slow", "never acked").await?;
    let mut worker = client.consumer("JOBS", "w");
    let got = worker.fetch(2, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].headers.get("Trace-Id").map(String::as_str),
        Some("t-1")
    );
    worker.term(got[0].stream_seq, "cannot parse").await?;
    eventually("the termed copy", Duration::from_secs(15), || async {
        (dlq_messages(&client).await == Some(1)).then_some(())
    })
    .await?;

    // Kill the consumer's leader while message 2 is still being redelivered.
    let leader = cluster
        .wait_group_leader("JOBS/w", Duration::from_secs(20))
        .await?;
    cluster.kill(leader);
    cluster
        .wait_group_leader("JOBS/w", Duration::from_secs(20))
        .await?;
    let client = cluster.client();
    let mut worker = client.consumer("JOBS", "w");
    // Second delivery of message 2 (not acked): then MaxDeliver gives up.
    let again = worker.fetch(1, Duration::from_secs(10)).await?;
    assert_eq!(
        (again.len(), again.first().map(|m| m.delivered)),
        (1, Some(2))
    );
    eventually("the exhausted copy", Duration::from_secs(20), || async {
        let info = client.consumer_info("JOBS", "w").await.ok()?;
        (info.num_dead_lettered == 2 && dlq_messages(&client).await == Some(2)).then_some(info)
    })
    .await?;

    let termed = client.get_message("DLQ", 1).await?;
    assert_eq!(termed.subject, "dlq.jobs");
    assert_eq!(&termed.payload[..], b"poison");
    let h = &termed.headers;
    assert_eq!(h["Wharf-Dead-Letter-Stream"], "JOBS");
    assert_eq!(h["Wharf-Dead-Letter-Consumer"], "w");
    assert_eq!(h["Wharf-Dead-Letter-Subject"], "jobs.bad");
    assert_eq!(h["Wharf-Dead-Letter-Stream-Seq"], "1");
    assert_eq!(h["Wharf-Dead-Letter-Deliveries"], "1");
    assert_eq!(h["Wharf-Dead-Letter-Reason"], "term: cannot parse");
    assert_eq!(h["Trace-Id"], "t-1");
    let exhausted = client.get_message("DLQ", 2).await?;
    assert_eq!(exhausted.headers["Wharf-Dead-Letter-Stream-Seq"], "2");
    assert_eq!(exhausted.headers["Wharf-Dead-Letter-Deliveries"], "2");
    assert_eq!(exhausted.headers["Wharf-Dead-Letter-Reason"], "max_deliver");

    // Once: nothing more arrives, and the work queue let both go.
    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!((info.num_terminated, info.num_exhausted), (1, 1));
    assert_eq!(info.dead_letter_backlog, 0);
    eventually(
        "the work queue to be empty",
        Duration::from_secs(15),
        || async {
            let s = client.stream_info("JOBS").await.ok()?.state?;
            (s.messages == 0).then_some(())
        },
    )
    .await?;
    assert_eq!(dlq_messages(&client).await, Some(2));
    Ok(())
}
