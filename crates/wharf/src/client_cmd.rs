//! Client commands: streams, publish, consumers, pulling, cluster status.

use std::time::Duration;

use anyhow::{bail, Result};
use wharf_client::{proto as pb, Client};

use crate::cli::{ClusterCmd, Command, ConsumerCmd, NextArgs, PeerCmd, StreamCmd};
use crate::format;

pub async fn run(
    servers: &str,
    options: &wharf_client::ConnectOptions,
    retry_for: Duration,
    command: Command,
) -> Result<()> {
    let client = Client::connect(servers, options)?.with_retry_for(retry_for);
    match command {
        Command::Stream(cmd) => stream(&client, cmd).await,
        Command::Pub(args) => {
            let payload = args.payload.into_bytes();
            let headers = args.headers.into_iter().collect();
            let id = args.id.as_deref().unwrap_or_default();
            let ack = (client.publish_with_headers(&args.subject, payload, id, headers)).await?;
            if args.json {
                let mut v = serde_json::json!({"stream": ack.stream, "seq": ack.seq});
                if ack.duplicate {
                    v["duplicate"] = true.into();
                }
                println!("{v}");
            } else if ack.duplicate {
                println!(
                    "Duplicate message: already stored in stream {} at sequence {}",
                    ack.stream, ack.seq
                );
            } else {
                println!("Stored in stream {} at sequence {}", ack.stream, ack.seq);
            }
            Ok(())
        }
        Command::Consumer(cmd) => consumer(&client, cmd).await,
        Command::Cluster(ClusterCmd::Status { json }) => {
            let status = client.cluster_status().await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&format::cluster_json(&status))?
                );
            } else {
                print!("{}", format::cluster_text(&status));
            }
            Ok(())
        }
        Command::Cluster(ClusterCmd::Peer(cmd)) => peer(&client, cmd).await,
        Command::Server(_)
        | Command::Dev(_)
        | Command::Bench(_)
        | Command::Passwd(_)
        | Command::Health { .. } => {
            unreachable!("handled in main")
        }
    }
}

async fn stream(client: &Client, cmd: StreamCmd) -> Result<()> {
    match cmd {
        StreamCmd::Add(a) => {
            let max_age_ms = u64::try_from(a.max_age.as_millis())?;
            let config = pb::StreamConfig {
                name: a.name,
                subjects: a.subjects,
                replicas: a.replicas,
                max_msgs: a.max_msgs,
                max_bytes: a.max_bytes,
                max_age_ms,
                max_msg_size: a.max_msg_size,
                max_msgs_per_subject: a.max_msgs_per_subject,
                discard: discard_policy(&a.discard) as i32,
                duplicate_window_ms: a.dupe_window.map(ms).transpose()?.unwrap_or(0),
                retention: match a.retention.as_str() {
                    "workqueue" => pb::RetentionPolicy::RetentionWorkqueue,
                    "interest" => pb::RetentionPolicy::RetentionInterest,
                    _ => pb::RetentionPolicy::RetentionLimits,
                } as i32,
            };
            let info = client.add_stream(config).await?;
            print_stream(&info, a.json)
        }
        StreamCmd::Info {
            name,
            json,
            local,
            subjects,
        } => {
            let info = if local {
                client.stream_info_local(&name).await?
            } else if subjects {
                client.stream_info_subjects(&name).await?
            } else {
                client.stream_info(&name).await?
            };
            print_stream(&info, json)
        }
        StreamCmd::Edit(e) => crate::stream_cmd::edit(client, e).await,
        StreamCmd::Purge(p) => crate::stream_cmd::purge(client, p).await,
        StreamCmd::Get { name, seq, json } => {
            crate::stream_cmd::get(client, &name, seq, json).await
        }
        StreamCmd::Rmm { name, seq } => {
            client.delete_message(&name, seq).await?;
            println!("Deleted message {seq} from stream {name}");
            Ok(())
        }
        StreamCmd::Stepdown { name } => {
            let r = client.step_down(&name, None).await?;
            println!(
                "Stream {name}: leader moved from node {} to node {}",
                r.previous_leader, r.leader
            );
            Ok(())
        }
        StreamCmd::Ls { json } => {
            let streams = client.list_streams().await?;
            if json {
                let v: Vec<_> = streams.iter().map(format::stream_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", format::stream_table(&streams));
            }
            Ok(())
        }
        StreamCmd::Rm { name } => {
            client.delete_stream(&name).await?;
            println!("Deleted stream {name}");
            Ok(())
        }
    }
}

pub(crate) fn discard_policy(name: &str) -> pb::DiscardPolicy {
    match name {
        "new" => pb::DiscardPolicy::DiscardNew,
        _ => pb::DiscardPolicy::DiscardOld,
    }
}

pub(crate) fn print_stream(info: &pb::StreamInfo, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&format::stream_json(info))?
        );
    } else {
        print!("{}", format::stream_text(info));
    }
    Ok(())
}

fn print_consumer(info: &pb::ConsumerInfo, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&format::consumer_json(info))?
        );
    } else {
        print!("{}", format::consumer_text(info));
    }
    Ok(())
}

pub(crate) fn ms(d: Duration) -> Result<u64> {
    let ms = u64::try_from(d.as_millis())?;
    if ms == 0 {
        bail!("durations must be at least 1ms");
    }
    Ok(ms)
}

async fn consumer(client: &Client, cmd: ConsumerCmd) -> Result<()> {
    match cmd {
        ConsumerCmd::Add(a) => {
            let ack_policy = match a.ack_policy.as_str() {
                "all" => pb::AckPolicy::AckAll,
                "none" => pb::AckPolicy::AckNone,
                _ => pb::AckPolicy::AckExplicit,
            };
            let (deliver_policy, opt_start_seq, opt_start_time_ms) =
                match (a.start_seq, a.start_time, a.deliver.as_str()) {
                    (Some(seq), _, _) => (pb::DeliverPolicy::DeliverByStartSequence, seq, 0),
                    (_, Some(t), _) => (pb::DeliverPolicy::DeliverByStartTime, 0, epoch_ms(t)?),
                    (_, _, "new") => (pb::DeliverPolicy::DeliverNew, 0, 0),
                    (_, _, "last") => (pb::DeliverPolicy::DeliverLast, 0, 0),
                    (_, _, "last-per-subject") => (pb::DeliverPolicy::DeliverLastPerSubject, 0, 0),
                    _ => (pb::DeliverPolicy::DeliverAll, 0, 0),
                };
            let config = pb::ConsumerConfig {
                name: a.name,
                filter_subject: a.filter.first().cloned().unwrap_or_default(),
                filter_subjects: a.filter.iter().skip(1).cloned().collect(),
                inactive_threshold_ms: a.inactive_threshold.map(ms).transpose()?.unwrap_or(0),
                deliver_policy: deliver_policy as i32,
                opt_start_seq,
                opt_start_time_ms,
                metadata: a.metadata.into_iter().collect(),
                priority_policy: match a.priority.as_str() {
                    "pinned" => pb::PriorityPolicy::PriorityPinned,
                    "overflow" => pb::PriorityPolicy::PriorityOverflow,
                    _ => pb::PriorityPolicy::PriorityNone,
                } as i32,
                pause_until_ms: 0,
                ack_wait_ms: ms(a.ack_wait)?,
                max_ack_pending: a.max_pending,
                max_waiting: a.max_waiting,
                ack_policy: ack_policy as i32,
                max_deliver: a.max_deliver,
                backoff_ms: a.backoff.into_iter().map(ms).collect::<Result<_>>()?,
                redeliver_on_disconnect: a.redeliver_on_disconnect,
                dead_letter_subject: a.dead_letter_subject.unwrap_or_default(),
            };
            print_consumer(&client.add_consumer(&a.stream, config).await?, a.json)
        }
        ConsumerCmd::Edit(e) => {
            let info = client.consumer_info(&e.stream, &e.name).await?;
            let mut config = info.config.unwrap_or_default();
            if let Some(w) = e.ack_wait {
                config.ack_wait_ms = ms(w)?;
            }
            if let Some(p) = e.max_pending {
                config.max_ack_pending = p;
            }
            if let Some(w) = e.max_waiting {
                config.max_waiting = w;
            }
            if let Some(m) = e.max_deliver {
                config.max_deliver = m;
            }
            if let Some(b) = e.backoff {
                config.backoff_ms = b.into_iter().map(ms).collect::<Result<_>>()?;
            }
            if let Some(d) = e.dead_letter_subject {
                config.dead_letter_subject = d;
            }
            if let Some(r) = e.redeliver_on_disconnect {
                config.redeliver_on_disconnect = r;
            }
            print_consumer(&client.update_consumer(&e.stream, config).await?, e.json)
        }
        ConsumerCmd::Info { stream, name, json } => {
            print_consumer(&client.consumer_info(&stream, &name).await?, json)
        }
        ConsumerCmd::Ls { stream, json } => {
            let consumers = client.list_consumers(&stream).await?;
            if json {
                let v: Vec<_> = consumers.iter().map(format::consumer_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", format::consumer_table(&consumers));
            }
            Ok(())
        }
        ConsumerCmd::Rm { stream, name } => {
            client.delete_consumer(&stream, &name).await?;
            println!("Deleted consumer {stream} > {name}");
            Ok(())
        }
        ConsumerCmd::Stepdown { stream, name } => {
            let r = client.step_down(&stream, Some(&name)).await?;
            println!(
                "Consumer {stream} > {name}: leader moved from node {} to node {}",
                r.previous_leader, r.leader
            );
            Ok(())
        }
        ConsumerCmd::Pause(p) => {
            let until = match (p.duration, p.until) {
                (Some(d), _) => std::time::SystemTime::now() + d,
                (_, Some(t)) => t,
                (None, None) => bail!("say how long: --for 10m or --until TIME"),
            };
            let info = set_pause(client, &p.stream, &p.name, epoch_ms(until)?).await?;
            println!(
                "Paused {} > {} for {}",
                p.stream,
                p.name,
                humantime::format_duration(Duration::from_millis(
                    info.pause_remaining_ms.max(0) as u64 / 1000 * 1000
                ))
            );
            Ok(())
        }
        ConsumerCmd::Resume { stream, name } => {
            set_pause(client, &stream, &name, 0).await?;
            println!("Resumed {stream} > {name}");
            Ok(())
        }
        ConsumerCmd::Next(args) => next(client, args).await,
    }
}

fn epoch_ms(t: std::time::SystemTime) -> Result<i64> {
    let ms = t.duration_since(std::time::UNIX_EPOCH)?.as_millis();
    Ok(i64::try_from(ms)?)
}

async fn set_pause(
    client: &Client,
    stream: &str,
    name: &str,
    until_ms: i64,
) -> Result<pb::ConsumerInfo> {
    let info = client.consumer_info(stream, name).await?;
    let mut config = info.config.unwrap_or_default();
    config.pause_until_ms = until_ms;
    Ok(client.update_consumer(stream, config).await?)
}

async fn next(client: &Client, args: NextArgs) -> Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    let mut consumer = client
        .consumer(&args.stream, &args.name)
        .with_max_bytes(args.max_bytes)
        .with_overflow(args.min_pending, args.min_ack_pending);
    let messages = consumer.fetch(args.count, args.wait).await?;
    if messages.is_empty() {
        bail!(
            "no message received within {}",
            humantime::format_duration(args.wait)
        );
    }
    for m in &messages {
        if args.json {
            println!("{}", format::message_json(m));
        } else {
            print!("{}", format::message_text(m));
        }
        let said = if args.nak {
            consumer.nak(m.stream_seq, args.nak_delay).await?;
            "Nak'ed message"
        } else if args.term {
            consumer
                .term(m.stream_seq, "terminated from the CLI")
                .await?;
            "Terminated message"
        } else if args.no_ack {
            continue;
        } else {
            consumer.ack(m.stream_seq).await?;
            "Acknowledged message"
        };
        if !args.json {
            println!("{said}\n");
        }
    }
    consumer.close();
    Ok(())
}

async fn peer(client: &Client, cmd: PeerCmd) -> Result<()> {
    match cmd {
        PeerCmd::Add { id, addr, json } => {
            let r = client.peer_add(id, &addr).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"added": id, "nodes": node_ids(&r.nodes)})
                );
            } else {
                println!(
                    "Node {id} at {addr} added; members: {:?}",
                    node_ids(&r.nodes)
                );
            }
            Ok(())
        }
        PeerCmd::Remove { id, timeout, json } => {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut moved = None;
            loop {
                let r = client.peer_remove(id).await?;
                // The first round reports how many groups it re-placed.
                let moved = *moved.get_or_insert(r.moved_groups);
                if r.done {
                    if json {
                        let v = serde_json::json!({"removed": id, "moved_groups": moved, "nodes": node_ids(&r.nodes)});
                        println!("{v}");
                    } else {
                        println!(
                            "Node {id} removed ({moved} groups re-placed); members: {:?}",
                            node_ids(&r.nodes)
                        );
                    }
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    bail!(
                        "node {id} is still being removed after {timeout:?}; groups still moving: {} (the move goes on; run the command again to keep waiting)",
                        r.moving.join(", ")
                    );
                }
                if !json {
                    eprintln!("Moving replicas off node {id}: {}", r.moving.join(", "));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn node_ids(nodes: &[pb::NodeStatus]) -> Vec<u64> {
    nodes.iter().map(|n| n.id).collect()
}
