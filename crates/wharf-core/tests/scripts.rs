//! Data-driven script tests (in the style of toydb's goldenscript, hand-rolled).
//!
//! Every `tests/scripts/*.txt` file tells one story. Lines starting with `> `
//! are commands; the lines after a command, up to a blank line, a comment
//! (`#`) or the next command, are its expected output. Run with
//! `UPDATE_SCRIPTS=1` to rewrite the expected output from the actual one
//! (then review the diff!).
//!
//! The harness drives one stream, one consumer and one dispatcher the way
//! the server does: `dispatch` plans, applies the plan to the consumer as
//! the Raft command would, and settles. Time is a script clock set by any
//! `now=T` argument (default 0). Commands:
//!
//! - `stream subjects=a,b [name= replicas= max_msgs= max_bytes= max_age_ms= max_msg_size=
//!   max_msgs_per_subject= discard=old|new duplicate_window_ms=]`
//! - `update_stream [same keys]` (starts from the current config)
//! - `consumer [name= filter= ack_wait_ms= max_ack_pending= max_waiting=]`
//! - `update_consumer [same keys]`
//! - `publish <subject> [size=N] [count=N] [id=MSG_ID] [now=T]`
//! - `purge [subject=F] [keep=N] [seq=N]`, `delete <seq>`, `subjects [filter=F]`,
//!   `stats` (the stream's counters, no consumer needed)
//! - `pull session=S id=P batch=N [expires=T]`, `close session=S`
//! - `dispatch [now=T] [max=N]`
//! - `plan [now=T] [max=N]`, `commit [now=T]`, `fail` (split dispatch: plan
//!   and propose, then apply or fail the oldest proposal)
//! - `ack <seq>...`, `nak <seq> [delay=T]`, `progress <seq>`, `term <seq> [reason=R]`,
//!   `expire [now=T]`, `state`
//! - retention (see `support/retention.rs`): `stream ... retention=workqueue|interest`,
//!   `other name=N [filters=a,b]`, `other_progress name=N position=P [pending=1,2]`,
//!   `unregister name=N`, `dead_lettered <seq>...` (with `consumer dead_letter=SUBJECT`).
//!   After every command the consumer's progress goes to the stream, as the
//!   stream leader would report it; what that removes prints as `retention removed=...`.
//!
//! Errors from the crate print as `error: <message>`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use wharf_core::{
    start_position, AckPolicy, ConsumerConfig, ConsumerState, DeliverPolicy, Dispatcher,
    FinishedPull, Plan, PriorityPolicy, PullEnd, StreamConfig, StreamState, Thresholds,
};
use wharf_core::{DiscardPolicy, Purge};

#[path = "support/retention.rs"]
mod retention;

type Out = Result<Vec<String>, String>;

/// Parsed `key=value` arguments plus bare words.
struct Args {
    keys: BTreeMap<String, String>,
    words: Vec<String>,
}

impl Args {
    fn parse(tokens: &[&str]) -> Args {
        let mut keys = BTreeMap::new();
        let mut words = Vec::new();
        for t in tokens {
            match t.split_once('=') {
                Some((k, v)) => {
                    keys.insert(k.to_string(), v.to_string());
                }
                None => words.push(t.to_string()),
            }
        }
        Args { keys, words }
    }

    fn take<T: std::str::FromStr>(&mut self, key: &str) -> Result<Option<T>, String> {
        match self.keys.remove(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("bad value {v:?} for {key}")),
        }
    }

    fn need<T: std::str::FromStr>(&mut self, key: &str) -> Result<T, String> {
        self.take(key)?.ok_or_else(|| format!("missing {key}="))
    }

    fn done(self) -> Result<(), String> {
        match self.keys.keys().next() {
            Some(k) => Err(format!("unknown argument {k}=")),
            None => Ok(()),
        }
    }
}

#[derive(Default)]
struct Harness {
    stream: Option<StreamState>,
    consumer: Option<ConsumerState>,
    dispatcher: Dispatcher,
    proposed: VecDeque<Plan>,
    now_ms: i64,
    /// Other consumers registered with the stream: name -> filters.
    others: BTreeMap<String, Vec<String>>,
}

impl Harness {
    fn run(&mut self, line: &str) -> Out {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let (cmd, rest) = tokens.split_first().ok_or("empty command")?;
        let mut args = Args::parse(rest);
        if let Some(t) = args.take("now")? {
            self.now_ms = t;
        }
        let out = match *cmd {
            "stream" => self.stream_cmd(&mut args, false),
            "update_stream" => self.stream_cmd(&mut args, true),
            "consumer" => self.consumer_cmd(&mut args, false),
            "update_consumer" => self.consumer_cmd(&mut args, true),
            "publish" => self.publish(&mut args),
            "purge" | "delete" | "subjects" | "stats" => self.stream_admin(cmd, &mut args),
            "pull" => {
                let session = args.need("session")?;
                let id = args.need("id")?;
                let batch = args.need("batch")?;
                let expires = args.take("expires")?;
                let max_bytes = args.take("max_bytes")?.unwrap_or(0);
                let thresholds = Thresholds {
                    min_pending: args.take("min_pending")?.unwrap_or(0),
                    min_ack_pending: args.take("min_ack_pending")?.unwrap_or(0),
                };
                let max_waiting = self.consumer()?.config().max_waiting;
                match self.dispatcher.add_pull_with_max_bytes(
                    session,
                    id,
                    batch,
                    expires,
                    max_waiting,
                    max_bytes,
                ) {
                    Ok(()) => {
                        self.dispatcher.set_thresholds(session, id, thresholds);
                        Ok(vec![])
                    }
                    Err(e) => Ok(vec![format!("error: {e}")]),
                }
            }
            "start" => {
                let (Some(c), Some(st)) = (&self.consumer, &self.stream) else {
                    return Err("start needs a stream and a consumer".into());
                };
                let (after, backlog) = start_position(c.config(), st);
                let took = self.consumer_mut()?.apply_start(after, backlog.clone());
                Ok(vec![format!(
                    "start after={after} backlog={} took={took}",
                    join(&backlog)
                )])
            }
            "close" => {
                let n = self.dispatcher.remove_session(args.need("session")?);
                Ok(vec![format!("dropped {n} waiting pull(s)")])
            }
            "dispatch" => {
                let max = args.take("max")?.unwrap_or(100);
                let plan = self.plan(max)?;
                let mut out = self.apply(&plan)?;
                out.extend(plan.finished.iter().map(finished));
                Ok(nothing_if_empty(out))
            }
            "plan" => {
                let max = args.take("max")?.unwrap_or(100);
                let plan = self.plan(max)?;
                let mut out: Vec<String> = plan
                    .assignments
                    .iter()
                    .map(|a| {
                        let kind = if a.redelivery { " redelivery" } else { "" };
                        format!(
                            "planned session={} pull={} stream_seq={}{kind}",
                            a.session, a.pull_id, a.stream_seq
                        )
                    })
                    .collect();
                out.extend(plan.gone.iter().map(|s| format!("gone stream_seq={s}")));
                out.extend(
                    plan.exhausted
                        .iter()
                        .map(|s| format!("exhausted stream_seq={s}")),
                );
                out.extend(plan.finished.iter().map(finished));
                if plan.has_proposal() {
                    self.proposed.push_back(plan);
                }
                Ok(nothing_if_empty(out))
            }
            "commit" => {
                let plan = self.proposed.pop_front().ok_or("nothing proposed")?;
                self.apply(&plan).map(nothing_if_empty)
            }
            "fail" => {
                let plan = self.proposed.pop_front().ok_or("nothing proposed")?;
                self.dispatcher.settle(&plan.all_seqs());
                Ok(vec![])
            }
            "ack" => {
                let seqs = (args.words.iter())
                    .map(|w| w.parse::<u64>().map_err(|_| format!("bad seq {w:?}")))
                    .collect::<Result<Vec<_>, _>>()?;
                let n = self.consumer_mut()?.apply_ack(&seqs);
                Ok(vec![format!("acked {n}")])
            }
            "nak" => {
                let seq = one_seq(&args)?;
                let delay = args.take("delay")?.unwrap_or(0);
                let now = self.now_ms;
                let was = self.consumer_mut()?.apply_nak(seq, delay, now);
                Ok(vec![format!("nak pending={was}")])
            }
            "progress" => {
                let seq = one_seq(&args)?;
                let now = self.now_ms;
                let was = self.consumer_mut()?.apply_in_progress(seq, now);
                Ok(vec![format!("in progress pending={was}")])
            }
            "term" => {
                let seq = one_seq(&args)?;
                let reason: String = args.take("reason")?.unwrap_or_default();
                let was = self.consumer_mut()?.apply_term(seq, &reason);
                Ok(vec![format!("term pending={was}")])
            }
            "other" | "other_progress" | "unregister" | "dead_lettered" => {
                self.retention_cmd(cmd, &mut args)
            }
            "expire" => {
                let mut out: Vec<String> = self
                    .dispatcher
                    .expire(self.now_ms)
                    .iter()
                    .map(finished)
                    .collect();
                let now = self.now_ms;
                let removed = self.stream_mut()?.expire(now);
                if !removed.is_empty() {
                    out.push(format!("removed={}", join(&removed)));
                }
                Ok(nothing_if_empty(out))
            }
            "state" => self.state(),
            other => Err(format!("unknown command {other:?}")),
        }?;
        args.done()?;
        let mut out = out;
        out.extend(self.report_progress());
        Ok(out)
    }

    fn stream_cmd(&mut self, args: &mut Args, update: bool) -> Out {
        let mut cfg = match (&self.stream, update) {
            (Some(s), true) => s.config().clone(),
            (None, true) => return Err("no stream to update".into()),
            _ => StreamConfig {
                name: "ORDERS".into(),
                ..StreamConfig::default()
            },
        };
        if let Some(name) = args.take("name")? {
            cfg.name = name;
        }
        if let Some(subjects) = args.take::<String>("subjects")? {
            cfg.subjects = subjects.split(',').map(str::to_string).collect();
        }
        cfg.replicas = args.take("replicas")?.unwrap_or(cfg.replicas);
        cfg.max_msgs = args.take("max_msgs")?.unwrap_or(cfg.max_msgs);
        cfg.max_bytes = args.take("max_bytes")?.unwrap_or(cfg.max_bytes);
        cfg.max_age_ms = args.take("max_age_ms")?.unwrap_or(cfg.max_age_ms);
        cfg.max_msg_size = args.take("max_msg_size")?.unwrap_or(cfg.max_msg_size);
        cfg.max_msgs_per_subject =
            (args.take("max_msgs_per_subject")?).unwrap_or(cfg.max_msgs_per_subject);
        cfg.duplicate_window_ms =
            (args.take("duplicate_window_ms")?).unwrap_or(cfg.duplicate_window_ms);
        if let Some(r) = args.take::<String>("retention")? {
            cfg.retention = retention::parse_retention(&r)?;
        }
        if let Some(discard) = args.take::<String>("discard")? {
            cfg.discard = match discard.as_str() {
                "old" => DiscardPolicy::Old,
                "new" => DiscardPolicy::New,
                other => return Err(format!("bad discard {other:?}")),
            };
        }
        let cfg = cfg.with_defaults();
        if let Some(s) = self.stream.as_mut().filter(|_| update) {
            return Ok(match s.update_config(cfg, self.now_ms) {
                Ok(removed) if removed.is_empty() => vec![],
                Ok(removed) => vec![format!("removed={}", join(&removed))],
                Err(e) => vec![format!("error: {e}")],
            });
        }
        if let Err(e) = cfg.validate() {
            return Ok(vec![format!("error: {e}")]);
        }
        self.stream = Some(StreamState::new(cfg));
        Ok(vec![])
    }

    fn consumer_cmd(&mut self, args: &mut Args, update: bool) -> Out {
        let mut cfg = match (&self.consumer, update) {
            (Some(c), true) => c.config().clone(),
            (None, true) => return Err("no consumer to update".into()),
            _ => ConsumerConfig {
                name: "workers".into(),
                ..ConsumerConfig::default()
            },
        };
        if let Some(name) = args.take("name")? {
            cfg.name = name;
        }
        if let Some(filter) = args.take::<String>("filter")? {
            cfg.filter_subject = Some(filter);
        }
        cfg.ack_wait_ms = args.take("ack_wait_ms")?.unwrap_or(cfg.ack_wait_ms);
        cfg.max_ack_pending = args.take("max_ack_pending")?.unwrap_or(cfg.max_ack_pending);
        cfg.max_waiting = args.take("max_waiting")?.unwrap_or(cfg.max_waiting);
        cfg.max_deliver = args.take("max_deliver")?.unwrap_or(cfg.max_deliver);
        if let Some(backoff) = args.take::<String>("backoff")? {
            cfg.backoff_ms = backoff
                .split(',')
                .map(|v| v.parse().map_err(|_| format!("bad backoff {v:?}")))
                .collect::<Result<_, _>>()?;
        }
        if let Some(policy) = args.take::<String>("deliver")? {
            cfg.deliver_policy = match policy.split_once(':') {
                None if policy == "all" => DeliverPolicy::All,
                None if policy == "new" => DeliverPolicy::New,
                None if policy == "last" => DeliverPolicy::Last,
                None if policy == "last_per_subject" => DeliverPolicy::LastPerSubject,
                Some(("start_seq", n)) => {
                    DeliverPolicy::ByStartSeq(n.parse().map_err(|_| "bad seq")?)
                }
                Some(("start_time", t)) => {
                    DeliverPolicy::ByStartTime(t.parse().map_err(|_| "bad time")?)
                }
                _ => return Err(format!("bad deliver policy {policy:?}")),
            };
        }
        cfg.pause_until_ms = args.take("pause_until")?.unwrap_or(cfg.pause_until_ms);
        if let Some(filters) = args.take::<String>("filters")? {
            cfg.filter_subjects = filters.split(',').map(str::to_string).collect();
        }
        if let Some(p) = args.take::<String>("priority")? {
            cfg.priority_policy = match p.as_str() {
                "pinned" => PriorityPolicy::Pinned,
                "overflow" => PriorityPolicy::Overflow,
                "none" => PriorityPolicy::None,
                other => return Err(format!("bad priority {other:?}")),
            };
        }
        if let Some(subject) = args.take::<String>("dead_letter")? {
            cfg.dead_letter_subject = Some(subject);
        }
        if let Some(policy) = args.take::<String>("ack_policy")? {
            cfg.ack_policy = match policy.as_str() {
                "explicit" => AckPolicy::Explicit,
                "all" => AckPolicy::All,
                "none" => AckPolicy::None,
                other => return Err(format!("bad ack_policy {other:?}")),
            };
        }
        let cfg = cfg.with_defaults();
        if let Some(c) = self.consumer.as_mut().filter(|_| update) {
            return Ok(match c.update_config(cfg) {
                Ok(()) => vec![],
                Err(e) => vec![format!("error: {e}")],
            });
        }
        if let Err(e) = cfg.validate() {
            return Ok(vec![format!("error: {e}")]);
        }
        self.consumer = Some(ConsumerState::new(cfg));
        Ok(self.register_consumers())
    }

    fn publish(&mut self, args: &mut Args) -> Out {
        let subject = args
            .words
            .first()
            .cloned()
            .ok_or("publish needs a subject")?;
        let size = args.take("size")?.unwrap_or(10);
        let count = args.take("count")?.unwrap_or(1);
        let id: Option<String> = args.take("id")?;
        let now = self.now_ms;
        let stream = self.stream_mut()?;
        let mut out = Vec::new();
        for _ in 0..count {
            out.push(
                match stream.append_msg(&subject, size, id.as_deref(), now) {
                    Ok(a) if a.duplicate => format!("seq={} duplicate", a.seq),
                    Ok(a) if a.removed.is_empty() => format!("seq={}", a.seq),
                    Ok(a) => format!("seq={} removed={}", a.seq, join(&a.removed)),
                    Err(e) => format!("error: {e}"),
                },
            );
        }
        Ok(out)
    }

    /// Stream-only commands: purge, delete, subjects, stats.
    fn stream_admin(&mut self, cmd: &str, args: &mut Args) -> Out {
        let stream = self.stream_mut()?;
        Ok(match cmd {
            "purge" => {
                let purge = Purge {
                    filter: args.take("subject")?,
                    keep: args.take("keep")?,
                    below_seq: args.take("seq")?,
                };
                match stream.purge(&purge) {
                    Ok(removed) if removed.is_empty() => vec!["purged 0".to_string()],
                    Ok(removed) => vec![format!("purged {}: {}", removed.len(), join(&removed))],
                    Err(e) => vec![format!("error: {e}")],
                }
            }
            "delete" => {
                let seq = one_seq(args)?;
                vec![match stream.delete(seq) {
                    Ok(()) => format!("deleted {seq}"),
                    Err(e) => format!("error: {e}"),
                }]
            }
            "subjects" => {
                let filter: Option<String> = args.take("filter")?;
                let counts = stream.subject_counts(filter.as_deref(), usize::MAX);
                let lines = counts
                    .iter()
                    .map(|(s, n)| format!("subject={s} messages={n}"));
                nothing_if_empty(lines.collect())
            }
            _ => {
                let st = stream.stats();
                vec![format!(
                    "stream: messages={} bytes={} first_seq={} last_seq={} num_subjects={} msg_ids={}",
                    st.messages,
                    st.bytes,
                    st.first_seq,
                    st.last_seq,
                    st.num_subjects,
                    stream.num_msg_ids()
                )]
            }
        })
    }

    fn plan(&mut self, max: usize) -> Result<Plan, String> {
        let (Some(c), Some(s)) = (&self.consumer, &self.stream) else {
            return Err("dispatch needs a stream and a consumer".into());
        };
        Ok(self.dispatcher.plan(c, s, self.now_ms, max))
    }

    /// Applies a plan as the Raft command would, settles it, and prints the
    /// deliveries in assignment order.
    fn apply(&mut self, plan: &Plan) -> Out {
        let seqs = plan.stream_seqs();
        let now = self.now_ms;
        let consumer = self.consumer_mut()?;
        let deliveries = consumer.apply_deliver(&seqs, &plan.gone, now);
        let exhausted = consumer.apply_exhausted(&plan.exhausted);
        self.dispatcher.settle(&plan.all_seqs());
        let mut out = Vec::new();
        for a in &plan.assignments {
            out.push(
                match deliveries.iter().find(|d| d.stream_seq == a.stream_seq) {
                    Some(d) => format!(
                        "session={} pull={} stream_seq={} consumer_seq={} deliveries={}",
                        a.session, a.pull_id, d.stream_seq, d.consumer_seq, d.deliveries
                    ),
                    None => format!(
                        "skipped session={} pull={} stream_seq={}",
                        a.session, a.pull_id, a.stream_seq
                    ),
                },
            );
        }
        out.extend(plan.gone.iter().map(|s| format!("gone stream_seq={s}")));
        out.extend(
            exhausted
                .iter()
                .map(|s| format!("exhausted stream_seq={s}")),
        );
        Ok(out)
    }

    fn state(&self) -> Out {
        let mut out = Vec::new();
        if let Some(s) = &self.stream {
            let st = s.stats();
            out.push(format!(
                "stream: messages={} bytes={} first_seq={} last_seq={}",
                st.messages, st.bytes, st.first_seq, st.last_seq
            ));
        }
        let c = self.consumer()?;
        let (d, f) = (c.delivered(), c.ack_floor());
        out.push(format!(
            "delivered: consumer_seq={} stream_seq={}",
            d.consumer_seq, d.stream_seq
        ));
        out.push(format!(
            "ack_floor: consumer_seq={} stream_seq={}",
            f.consumer_seq, f.stream_seq
        ));
        for (seq, p) in c.pending_iter() {
            out.push(format!(
                "pending: stream_seq={seq} consumer_seq={} deliveries={} delivered_ms={}",
                p.consumer_seq, p.deliveries, p.delivered_ms
            ));
        }
        let num_pending = self.stream.as_ref().map_or(0, |s| {
            s.count_matching_after(d.stream_seq, c.config().filter_subject.as_deref())
        });
        out.push(format!(
            "num_ack_pending={} num_redelivered={} num_pending={} num_waiting={}",
            c.num_ack_pending(),
            c.num_redelivered(),
            num_pending + c.backlog_len(),
            self.dispatcher.num_waiting()
        ));
        if let Some(pinned) = self.dispatcher.pinned() {
            out.push(format!("pinned: session={pinned}"));
        }
        if c.num_terminated() + c.num_exhausted() > 0 {
            out.push(format!(
                "num_terminated={} num_exhausted={}",
                c.num_terminated(),
                c.num_exhausted()
            ));
        }
        out.extend(retention::dead_letter_lines(c));
        for w in self.dispatcher.waiting() {
            let mut line = format!(
                "waiting: session={} pull={} remaining={} delivered={}",
                w.session, w.pull_id, w.remaining, w.delivered
            );
            if let Some(t) = w.expires_at_ms {
                let _ = write!(line, " expires={t}");
            }
            out.push(line);
        }
        Ok(out)
    }

    fn consumer(&self) -> Result<&ConsumerState, String> {
        self.consumer
            .as_ref()
            .ok_or_else(|| "no consumer yet".into())
    }

    fn consumer_mut(&mut self) -> Result<&mut ConsumerState, String> {
        self.consumer
            .as_mut()
            .ok_or_else(|| "no consumer yet".into())
    }

    fn stream_mut(&mut self) -> Result<&mut StreamState, String> {
        self.stream.as_mut().ok_or_else(|| "no stream yet".into())
    }
}

fn one_seq(args: &Args) -> Result<u64, String> {
    match args.words.as_slice() {
        [w] => w.parse().map_err(|_| format!("bad seq {w:?}")),
        _ => Err("expected one stream seq".into()),
    }
}

fn finished(f: &FinishedPull) -> String {
    let end = match f.end {
        PullEnd::Done => "done",
        PullEnd::Expired => "expired",
    };
    format!(
        "finished session={} pull={} delivered={} {end}",
        f.session, f.pull_id, f.delivered
    )
}

fn nothing_if_empty(out: Vec<String>) -> Vec<String> {
    if out.is_empty() {
        vec!["nothing".to_string()]
    } else {
        out
    }
}

fn join(seqs: &[u64]) -> String {
    seqs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs one script; returns the regenerated text and a description of
/// every mismatch.
fn run_script(path: &Path, text: &str) -> (String, Vec<String>) {
    let mut harness = Harness::default();
    let lines: Vec<&str> = text.lines().collect();
    let mut regenerated = String::new();
    let mut mismatches = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(cmd) = line.strip_prefix("> ") else {
            regenerated.push_str(line);
            regenerated.push('\n');
            continue;
        };
        let cmd_line = i;
        let mut expected = Vec::new();
        while i < lines.len()
            && !lines[i].trim().is_empty()
            && !lines[i].starts_with("> ")
            && !lines[i].starts_with('#')
        {
            expected.push(lines[i]);
            i += 1;
        }
        let actual = harness.run(cmd).unwrap_or_else(|e| {
            panic!(
                "{}:{cmd_line}: script error in {cmd:?}: {e}",
                path.display()
            )
        });
        if actual != expected {
            mismatches.push(format!(
                "{}:{cmd_line}: > {cmd}\n  expected:\n    {}\n  actual:\n    {}",
                path.display(),
                expected.join("\n    "),
                actual.join("\n    ")
            ));
        }
        let _ = writeln!(regenerated, "> {cmd}");
        for l in actual {
            let _ = writeln!(regenerated, "{l}");
        }
    }
    (regenerated, mismatches)
}

fn script_paths() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/scripts exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    paths.sort();
    paths
}

#[test]
fn scripts() {
    let update = std::env::var_os("UPDATE_SCRIPTS").is_some();
    let paths = script_paths();
    assert!(
        paths.len() >= 9,
        "expected the script files, found {}",
        paths.len()
    );
    let mut failures = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("readable script");
        let (regenerated, mismatches) = run_script(&path, &text);
        if update {
            if regenerated != text {
                std::fs::write(&path, regenerated).expect("writable script");
            }
        } else {
            failures.extend(mismatches);
        }
    }
    assert!(
        failures.is_empty(),
        "{} script command(s) differ (UPDATE_SCRIPTS=1 rewrites them):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
