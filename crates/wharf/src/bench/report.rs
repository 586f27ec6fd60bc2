//! Measurement shared by `wharf bench` and the NATS driver (which includes
//! this file by path): the payload's send stamp, the open-loop pacer, HDR
//! histograms per publisher and per worker, the progress line, and the one
//! report, as text or as JSON. Both tools printing through this file is what
//! makes their figures comparable.
//!
//! Latencies are recorded in microseconds. A publish-ack latency runs from the
//! publish's *intended* send time (its slot on the fixed timeline with
//! `--rate`, the moment it was handed to the client otherwise) to its ack; an
//! end-to-end latency runs from the same intended time, stamped in the first
//! eight bytes of the payload, to the moment the worker's fetch returned it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use super::args::BenchArgs;

/// Longest latency a histogram holds (one hour, in microseconds); longer ones are clamped.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Turns `Instant`s into nanoseconds since the Unix epoch, monotonic within a run.
#[derive(Clone, Copy)]
pub struct Clock {
    base: Instant,
    base_ns: u64,
}

impl Clock {
    pub fn new() -> Clock {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Clock {
            base: Instant::now(),
            base_ns: u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    pub fn ns(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.base);
        self.base_ns + u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns.saturating_sub(self.base_ns))
    }
}

/// A payload of `size` bytes (at least 16): the intended send time in
/// nanoseconds since the epoch (0 for unmeasured fill messages), a tag, filler.
pub fn payload(size: usize, stamp_ns: u64, tag: u64) -> Vec<u8> {
    let mut p = vec![b'x'; size.max(16)];
    p[..8].copy_from_slice(&stamp_ns.to_le_bytes());
    p[8..16].copy_from_slice(&tag.to_le_bytes());
    p
}

/// The send stamp of a payload made by [`payload`]; `None` for fill messages.
pub fn stamp_of(payload: &[u8]) -> Option<u64> {
    let raw: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw)).filter(|&ns| ns != 0)
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("static histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_LATENCY_US)
}

/// Slots the pacer thread may run ahead of its publisher.
const PACER_QUEUE: usize = 64;

/// The fixed send timeline of one publisher. Unpaced, a send's intended time
/// is simply when it is made.
///
/// Paced, a thread of its own sleeps until each slot (`std::thread::sleep`,
/// a high-resolution timer: late by tens of microseconds) and hands the slot
/// to the publisher over a bounded channel. tokio's timer would do without
/// the thread, but it rounds every deadline up to the next millisecond, so
/// each send would leave up to a millisecond after its slot, and since
/// latencies count from the slot, every open-loop figure would carry that
/// lateness of the load generator. A publisher that falls behind gets its
/// late slots at once, keeping their intended times, once it takes them (the
/// thread waits while [`PACER_QUEUE`] slots are untaken). The thread ends at
/// its next slot after the pacer is dropped.
pub struct Pacer {
    slots: Option<tokio::sync::mpsc::Receiver<Instant>>,
}

impl Pacer {
    /// `rate` in msgs/s; 0 for no pacing. Fails only if the thread cannot
    /// be started.
    pub fn new(rate: f64, start: Instant) -> std::io::Result<Pacer> {
        if rate <= 0.0 {
            return Ok(Pacer { slots: None });
        }
        // Whole nanoseconds, so slot k is exactly k intervals after start.
        let interval_ns = (1e9 / rate).round().max(1.0) as u64;
        let (tx, rx) = tokio::sync::mpsc::channel(PACER_QUEUE);
        std::thread::Builder::new()
            .name("bench-pacer".into())
            .spawn(move || {
                for k in 0u64.. {
                    let at = start + Duration::from_nanos(interval_ns.saturating_mul(k));
                    if let Some(wait) = at.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    if tx.blocking_send(at).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Pacer { slots: Some(rx) })
    }

    pub fn paced(&self) -> bool {
        self.slots.is_some()
    }

    /// Wait for the next slot and return its intended time (late slots are
    /// returned at once, keeping their intended time).
    pub async fn next(&mut self) -> Instant {
        match &mut self.slots {
            None => Instant::now(),
            // The thread sends until the receiver is dropped, so `None`
            // cannot come while we hold it; answer "now" rather than panic.
            Some(slots) => slots.recv().await.unwrap_or_else(Instant::now),
        }
    }
}

/// What one publisher (or, merged, all of them) saw.
pub struct PubStats {
    pub latency: Histogram<u64>,
    pub ok: u64,
    pub errors: u64,
    pub bytes: u64,
    pub last_ack: Option<Instant>,
    /// Longest time between two consecutive acks of one publisher.
    pub max_gap: Duration,
}

impl Default for PubStats {
    fn default() -> Self {
        PubStats {
            latency: histogram(),
            ok: 0,
            errors: 0,
            bytes: 0,
            last_ack: None,
            max_gap: Duration::ZERO,
        }
    }
}

impl PubStats {
    pub fn ack(&mut self, intended: Instant, now: Instant, bytes: usize) {
        let _ = self
            .latency
            .record(micros(now.saturating_duration_since(intended)));
        self.ok += 1;
        self.bytes += bytes as u64;
        if let Some(last) = self.last_ack {
            self.max_gap = self.max_gap.max(now.saturating_duration_since(last));
        }
        self.last_ack = Some(now);
    }

    pub fn merge(&mut self, other: PubStats) {
        let _ = self.latency.add(&other.latency);
        self.ok += other.ok;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.last_ack = self.last_ack.max(other.last_ack);
        self.max_gap = self.max_gap.max(other.max_gap);
    }
}

/// What one worker (or, merged, all of them) saw.
pub struct SubStats {
    pub e2e: Histogram<u64>,
    pub received: u64,
    pub redelivered: u64,
    pub errors: u64,
    pub bytes: u64,
    pub last_recv: Option<Instant>,
}

impl Default for SubStats {
    fn default() -> Self {
        SubStats {
            e2e: histogram(),
            received: 0,
            redelivered: 0,
            errors: 0,
            bytes: 0,
            last_recv: None,
        }
    }
}

impl SubStats {
    /// Count one message returned by a fetch at `now`.
    pub fn received(&mut self, clock: &Clock, payload: &[u8], delivered: u64, now: Instant) {
        if let Some(ns) = stamp_of(payload) {
            let sent = clock.instant(ns);
            let _ = self.e2e.record(micros(now.saturating_duration_since(sent)));
        }
        self.received += 1;
        self.bytes += payload.len() as u64;
        if delivered > 1 {
            self.redelivered += 1;
        }
        self.last_recv = Some(now);
    }

    pub fn merge(&mut self, other: SubStats) {
        let _ = self.e2e.add(&other.e2e);
        self.received += other.received;
        self.redelivered += other.redelivered;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.last_recv = self.last_recv.max(other.last_recv);
    }
}

/// Live counters for the progress line and for the workers' stop condition.
#[derive(Default)]
pub struct Progress {
    pub published: AtomicU64,
    pub consumed: AtomicU64,
    pub errors: AtomicU64,
    /// How many messages the workers must receive; `u64::MAX` until known.
    pub target: AtomicU64,
    pub publishers_done: AtomicBool,
    pub stop: AtomicBool,
}

impl Progress {
    pub fn new() -> Arc<Progress> {
        let p = Progress::default();
        p.target.store(u64::MAX, Ordering::Relaxed);
        Arc::new(p)
    }

    pub fn workers_done(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.consumed.load(Ordering::Relaxed) >= self.target.load(Ordering::Relaxed)
    }
}

/// Print a progress line on stderr once a second until `progress.stop`.
pub fn spawn_progress(progress: Arc<Progress>, label: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let tty = std::io::stderr().is_terminal();
        let start = Instant::now();
        let (mut last_p, mut last_c) = (0u64, 0u64);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        while !progress.stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let p = progress.published.load(Ordering::Relaxed);
            let c = progress.consumed.load(Ordering::Relaxed);
            let e = progress.errors.load(Ordering::Relaxed);
            let line = format!(
                "[{label} {:>4}s] published {p} ({}/s)  consumed {c} ({}/s)  errors {e}",
                start.elapsed().as_secs(),
                p - last_p,
                c - last_c,
            );
            (last_p, last_c) = (p, c);
            let mut err = std::io::stderr().lock();
            let _ = if tty {
                write!(err, "\r{line}\x1b[K")
            } else {
                writeln!(err, "{line}")
            };
        }
        if tty {
            let _ = writeln!(std::io::stderr());
        }
    })
}

fn percentiles(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
        "mean": (h.mean() * 10.0).round() / 10.0,
    })
}

fn per_s(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        (n as f64 / secs * 10.0).round() / 10.0
    } else {
        0.0
    }
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        (bytes as f64 / secs / 1e6 * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// The whole run's outcome, one shape for both brokers.
pub struct Report<'a> {
    pub broker: &'static str,
    pub args: &'a BenchArgs,
    /// Publishing phase: stats and its start.
    pub publish: Option<(PubStats, Instant)>,
    /// Consuming phase: stats and its start.
    pub consume: Option<(SubStats, Instant)>,
    pub notes: Vec<String>,
}

impl Report<'_> {
    pub fn to_json(&self) -> Value {
        let a = self.args;
        let publish = self.publish.as_ref().map(|(s, start)| {
            let secs = s
                .last_ack
                .map(|t| t.saturating_duration_since(*start).as_secs_f64())
                .unwrap_or(0.0);
            json!({
                "msgs": s.ok,
                "errors": s.errors,
                "bytes": s.bytes,
                "elapsed_s": (secs * 1000.0).round() / 1000.0,
                "msgs_per_s": per_s(s.ok, secs),
                "mb_per_s": mb_per_s(s.bytes, secs),
                "max_ack_gap_ms": s.max_gap.as_millis() as u64,
                "ack_latency_us": percentiles(&s.latency),
            })
        });
        let consume = self.consume.as_ref().map(|(s, start)| {
            let secs = s
                .last_recv
                .map(|t| t.saturating_duration_since(*start).as_secs_f64())
                .unwrap_or(0.0);
            json!({
                "msgs": s.received,
                "redelivered": s.redelivered,
                "errors": s.errors,
                "bytes": s.bytes,
                "elapsed_s": (secs * 1000.0).round() / 1000.0,
                "msgs_per_s": per_s(s.received, secs),
                "mb_per_s": mb_per_s(s.bytes, secs),
                "e2e_latency_us": percentiles(&s.e2e),
            })
        });
        json!({
            "broker": self.broker,
            "workload": {
                "pub": a.pubs,
                "sub": a.subs,
                "msgs": a.msgs,
                "duration_s": a.duration.map(|d| d.as_secs_f64()),
                "size": a.size,
                "window": a.window,
                "batch": a.batch,
                "ack": a.ack.as_str(),
                "ack_next": a.ack_next,
                "replicas": a.replicas,
                "rate": a.rate,
                "max_ack_pending": a.max_ack_pending,
            },
            "publish": publish,
            "consume": consume,
            "notes": self.notes,
        })
    }

    pub fn to_text(&self) -> String {
        let v = self.to_json();
        let a = self.args;
        let mut out = format!(
            "{} bench: {} publisher(s) ({}), {} worker(s) (batch {}, ack {}{}), {} B messages, R{}{}\n",
            self.broker,
            a.pubs,
            if a.window == 0 {
                "sync".to_string()
            } else {
                format!("async, window {}", a.window)
            },
            a.subs,
            a.batch,
            a.ack.as_str(),
            if a.ack_next { " with the next pull" } else { "" },
            a.size,
            a.replicas,
            if a.rate > 0 {
                format!(", open loop at {} msgs/s", a.rate)
            } else {
                String::new()
            },
        );
        for (name, key, lat) in [
            ("Publish", "publish", "ack_latency_us"),
            ("Consume", "consume", "e2e_latency_us"),
        ] {
            let p = &v[key];
            if p.is_null() {
                continue;
            }
            out += &format!(
                "\n{name}: {} msgs in {:.2}s = {:.0} msgs/s, {:.2} MB/s, {} errors",
                p["msgs"],
                p["elapsed_s"].as_f64().unwrap_or(0.0),
                p["msgs_per_s"].as_f64().unwrap_or(0.0),
                p["mb_per_s"].as_f64().unwrap_or(0.0),
                p["errors"],
            );
            if key == "publish" {
                out += &format!(", longest ack gap {} ms", p["max_ack_gap_ms"]);
            } else {
                out += &format!(", {} redelivered", p["redelivered"]);
            }
            let l = &p[lat];
            if l.is_null() {
                out += "\n";
            } else {
                out += &format!(
                    "\n  {} (us): p50 {}  p90 {}  p99 {}  p99.9 {}  max {}\n",
                    if key == "publish" {
                        "ack latency"
                    } else {
                        "end-to-end latency"
                    },
                    l["p50"],
                    l["p90"],
                    l["p99"],
                    l["p999"],
                    l["max"],
                );
            }
        }
        for n in &self.notes {
            out += &format!("\nnote: {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paced_slots_follow_the_timeline_and_never_come_early() {
        let start = Instant::now();
        let mut pacer = Pacer::new(2_000.0, start).unwrap();
        assert!(pacer.paced());
        for k in 0..40u64 {
            let intended = pacer.next().await;
            assert_eq!(intended, start + Duration::from_nanos(500_000 * k));
            assert!(Instant::now() >= intended, "slot {k} came before its time");
        }
    }

    #[tokio::test]
    async fn a_publisher_that_falls_behind_keeps_its_slots_intended_times() {
        let start = Instant::now();
        let mut pacer = Pacer::new(10_000.0, start).unwrap();
        // Fall 20 slots behind (a blocking sleep, as a stalled publisher).
        std::thread::sleep(Duration::from_millis(2));
        for k in 0..20u64 {
            let intended = pacer.next().await;
            assert_eq!(intended, start + Duration::from_nanos(100_000 * k));
        }
    }

    #[tokio::test]
    async fn unpaced_sends_are_intended_when_made() {
        let mut pacer = Pacer::new(0.0, Instant::now()).unwrap();
        assert!(!pacer.paced());
        let before = Instant::now();
        let intended = pacer.next().await;
        assert!(intended >= before && intended <= Instant::now());
    }
}
