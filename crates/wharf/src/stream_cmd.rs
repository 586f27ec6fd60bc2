//! `wharf stream edit | purge | get`: the stream commands that do more than
//! one call or print more than a line.
//!
//! `edit` reads the current config, changes only the given flags and sends
//! the whole config back; the server answers once the stream applies it.

use anyhow::Result;
use wharf_client::{proto as pb, Client};

use crate::cli::{StreamEditArgs, StreamPurgeArgs};
use crate::client_cmd::{discard_policy, ms, print_stream};
use crate::format;

pub async fn edit(client: &Client, e: StreamEditArgs) -> Result<()> {
    let info = client.stream_info(&e.name).await?;
    let mut config = info.config.unwrap_or_default();
    if let Some(subjects) = e.subjects {
        config.subjects = subjects;
    }
    if let Some(n) = e.max_msgs {
        config.max_msgs = n;
    }
    if let Some(n) = e.max_bytes {
        config.max_bytes = n;
    }
    if let Some(age) = e.max_age {
        config.max_age_ms = u64::try_from(age.as_millis())?;
        // A window longer than the new age would be refused: let the
        // server cap the default to the age unless a window is given.
        if config.max_age_ms > 0 && config.duplicate_window_ms > config.max_age_ms {
            config.duplicate_window_ms = 0;
        }
    }
    if let Some(n) = e.max_msg_size {
        config.max_msg_size = n;
    }
    if let Some(n) = e.max_msgs_per_subject {
        config.max_msgs_per_subject = n;
    }
    if let Some(d) = e.discard {
        config.discard = discard_policy(&d) as i32;
    }
    if let Some(w) = e.dupe_window {
        config.duplicate_window_ms = ms(w)?;
    }
    print_stream(&client.update_stream(config).await?, e.json)
}

pub async fn purge(client: &Client, p: StreamPurgeArgs) -> Result<()> {
    let purged = client
        .purge_stream(
            &p.name,
            p.subject.as_deref(),
            p.keep.unwrap_or(0),
            p.seq.unwrap_or(0),
        )
        .await?;
    if p.json {
        println!("{}", serde_json::json!({"success": true, "purged": purged}));
    } else {
        println!(
            "Purged {} message{} from stream {}",
            format::thousands(purged),
            if purged == 1 { "" } else { "s" },
            p.name
        );
    }
    Ok(())
}

pub async fn get(client: &Client, stream: &str, seq: u64, json: bool) -> Result<()> {
    let m: pb::StreamMessage = client.get_message(stream, seq).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&format::stored_message_json(&m))?
        );
    } else {
        print!("{}", format::stored_message_text(stream, &m));
    }
    Ok(())
}
