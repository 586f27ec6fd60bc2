//! Client commands: streams, publish, consumers, pulling, cluster status.

use std::time::Duration;

use anyhow::{bail, Result};
use wharf_client::{proto as pb, Client};

use crate::cli::{ClusterCmd, Command, ConsumerCmd, NextArgs, StreamCmd};
use crate::format;

pub async fn run(servers: &str, retry_for: Duration, command: Command) -> Result<()> {
    let client = Client::new(servers)?.with_retry_for(retry_for);
    match command {
        Command::Stream(cmd) => stream(&client, cmd).await,
        Command::Pub(args) => {
            let ack = client
                .publish(&args.subject, args.payload.into_bytes())
                .await?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"stream": ack.stream, "seq": ack.seq})
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
        Command::Server(_) | Command::Dev(_) | Command::Bench(_) => {
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
            };
            let info = client.add_stream(config).await?;
            print_stream(&info, a.json)
        }
        StreamCmd::Info { name, json, local } => {
            let info = if local {
                client.stream_info_local(&name).await?
            } else {
                client.stream_info(&name).await?
            };
            print_stream(&info, json)
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

fn print_stream(info: &pb::StreamInfo, json: bool) -> Result<()> {
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

fn ms(d: Duration) -> Result<u64> {
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
            let config = pb::ConsumerConfig {
                name: a.name,
                filter_subject: a.filter.unwrap_or_default(),
                ack_wait_ms: ms(a.ack_wait)?,
                max_ack_pending: a.max_pending,
                max_waiting: a.max_waiting,
                ack_policy: ack_policy as i32,
                max_deliver: a.max_deliver,
                backoff_ms: a.backoff.into_iter().map(ms).collect::<Result<_>>()?,
                redeliver_on_disconnect: a.redeliver_on_disconnect,
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
        ConsumerCmd::Next(args) => next(client, args).await,
    }
}

async fn next(client: &Client, args: NextArgs) -> Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    let mut consumer = client.consumer(&args.stream, &args.name);
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
