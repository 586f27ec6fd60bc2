//! Script commands for work-queue and interest retention and the dead-letter
//! outbox (part of the `scripts` harness).
//!
//! The harness's one consumer is registered with the stream under id 1 and
//! its progress is reported after every command, the way a stream leader
//! carries committed consumer progress into the stream group. `other`
//! registers more consumers whose progress the script sets by hand.

use std::collections::BTreeSet;

use wharf_core::{ConsumerProgress, ConsumerState, RetentionPolicy};

use super::{join, Args, Harness, Out};

/// Catalog id of the harness's consumer; others get 100, 101, ...
const MAIN_ID: u64 = 1;
const OTHER_ID_BASE: u64 = 100;

pub fn parse_retention(s: &str) -> Result<RetentionPolicy, String> {
    match s {
        "limits" => Ok(RetentionPolicy::Limits),
        "workqueue" => Ok(RetentionPolicy::WorkQueue),
        "interest" => Ok(RetentionPolicy::Interest),
        other => Err(format!("bad retention {other:?}")),
    }
}

pub fn dead_letter_lines(c: &ConsumerState) -> Vec<String> {
    let mut out: Vec<String> = c
        .dead_letter_outbox()
        .map(|(seq, d)| {
            format!(
                "dead_letter: stream_seq={seq} deliveries={} reason={}",
                d.deliveries,
                d.reason.describe()
            )
        })
        .collect();
    if c.num_dead_lettered() > 0 {
        out.push(format!("num_dead_lettered={}", c.num_dead_lettered()));
    }
    out
}

fn seq_list(s: &str) -> Result<BTreeSet<u64>, String> {
    s.split(',')
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().map_err(|_| format!("bad seq {w:?}")))
        .collect()
}

impl Harness {
    pub fn retention_cmd(&mut self, cmd: &str, args: &mut Args) -> Out {
        match cmd {
            "other" => {
                let name: String = args.need("name")?;
                let filters: Option<String> = args.take("filters")?;
                let filters = filters.map_or_else(Vec::new, |f| {
                    f.split(',').map(str::to_string).collect::<Vec<_>>()
                });
                self.others.insert(name, filters);
                Ok(self.register_consumers())
            }
            "unregister" => {
                let name: String = args.need("name")?;
                if self.others.remove(&name).is_none() {
                    return Err(format!("no other consumer {name:?}"));
                }
                Ok(self.register_consumers())
            }
            "other_progress" => {
                let name: String = args.need("name")?;
                let position = args.need("position")?;
                let pending: Option<String> = args.take("pending")?;
                let id = self.other_id(&name)?;
                let progress = ConsumerProgress {
                    started: true,
                    position,
                    pending: seq_list(&pending.unwrap_or_default())?,
                    backlog: BTreeSet::new(),
                };
                let removed = self.stream_mut()?.record_progress(&name, id, progress);
                Ok(removed_line(&removed))
            }
            "dead_lettered" => {
                let seqs = (args.words.iter())
                    .map(|w| w.parse::<u64>().map_err(|_| format!("bad seq {w:?}")))
                    .collect::<Result<Vec<_>, _>>()?;
                let n = self.consumer_mut()?.apply_dead_lettered(&seqs, &[]);
                Ok(vec![format!("dead_lettered {n}")])
            }
            other => Err(format!("unknown retention command {other:?}")),
        }
    }

    fn other_id(&self, name: &str) -> Result<u64, String> {
        let i = (self.others.keys().position(|n| n == name))
            .ok_or_else(|| format!("no other consumer {name:?}"))?;
        Ok(OTHER_ID_BASE + i as u64)
    }

    /// Registers the harness's consumer and the others with the stream.
    pub fn register_consumers(&mut self) -> Vec<String> {
        let mut list = Vec::new();
        if let Some(c) = &self.consumer {
            let filters = c.config().filters().iter().map(|f| f.to_string()).collect();
            list.push((c.config().name.clone(), MAIN_ID, filters));
        }
        for (i, (name, filters)) in self.others.iter().enumerate() {
            list.push((name.clone(), OTHER_ID_BASE + i as u64, filters.clone()));
        }
        match self.stream.as_mut() {
            Some(s) => removed_line(&s.set_consumers(list)),
            None => Vec::new(),
        }
    }

    /// Reports the harness's consumer's progress to the stream.
    pub fn report_progress(&mut self) -> Vec<String> {
        let (Some(c), Some(s)) = (&self.consumer, self.stream.as_mut()) else {
            return Vec::new();
        };
        let removed = s.record_progress(&c.config().name, MAIN_ID, c.progress());
        removed_line(&removed)
    }
}

fn removed_line(removed: &[u64]) -> Vec<String> {
    if removed.is_empty() {
        Vec::new()
    } else {
        vec![format!("retention removed={}", join(removed))]
    }
}
