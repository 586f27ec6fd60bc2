//! The Prometheus text exposition format (version 0.0.4), written by hand,
//! and a fixed-bucket latency histogram.
//!
//! [`Exposition`] writes one metric family at a time: its `# HELP` and
//! `# TYPE` lines, then its samples, so every family's samples stay together
//! as the format requires. Label values are escaped (`\\`, `"`, newline);
//! metric and label names are the caller's constants and are not checked.
//!
//! [`Histogram`] counts observations in fixed buckets with atomics, so the
//! gRPC layer records a call without taking a lock.
//!
//! Left out: OpenMetrics (`# EOF`, exemplars, `_created`), summaries, and
//! timestamps on samples (Prometheus stamps them at scrape time).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `Content-Type` of what [`Exposition`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Metric kinds as the `# TYPE` line names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// A text exposition being written.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start a family: its help and type lines. Its samples follow.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.write_name(name, labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// One sample with a floating-point value.
    pub fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.write_name(name, labels, None);
        let _ = writeln!(self.out, " {}", format_f64(value));
    }

    /// The `_bucket`, `_sum` and `_count` samples of one histogram series.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS_SECONDS.iter().zip(&h.buckets) {
            cumulative += count;
            self.write_name(&bucket, labels, Some(&format_f64(*bound)));
            let _ = writeln!(self.out, " {cumulative}");
        }
        self.write_name(&bucket, labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", h.count);
        self.sample_f64(&format!("{name}_sum"), labels, h.sum_seconds());
        self.sample(&format!("{name}_count"), labels, h.count);
    }

    fn write_name(&mut self, name: &str, labels: &[(&str, &str)], le: Option<&str>) {
        self.out.push_str(name);
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        let le = le.map(|v| ("le", v));
        for (k, v) in labels.iter().copied().chain(le) {
            if !first {
                self.out.push(',');
            }
            first = false;
            self.out.push_str(k);
            self.out.push_str("=\"");
            escape_label_value(&mut self.out, v);
            self.out.push('"');
        }
        self.out.push('}');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn format_f64(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

/// Upper bounds of the latency buckets, in seconds: from half a millisecond
/// (a local unary call) to a minute (long pulls and streams).
pub const BUCKETS_SECONDS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// A latency histogram with the fixed [`BUCKETS_SECONDS`]; lock-free.
#[derive(Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); beyond the last bound they
    /// count only in `count`.
    buckets: [AtomicU64; BUCKETS_SECONDS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

/// A consistent-enough copy of a [`Histogram`] for rendering.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: [u64; BUCKETS_SECONDS.len()],
    pub count: u64,
    pub sum_us: u64,
}

impl HistogramSnapshot {
    pub fn sum_seconds(&self) -> f64 {
        self.sum_us as f64 / 1e6
    }
}

impl Histogram {
    pub fn observe(&self, elapsed: std::time::Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS_SECONDS.iter().position(|b| seconds <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot::default();
        for (dst, src) in s.buckets.iter_mut().zip(&self.buckets) {
            *dst = src.load(Ordering::Relaxed);
        }
        // Read the count last: a concurrent observation may then show in the
        // count but not yet in a bucket, which only ever lands it in +Inf.
        s.sum_us = self.sum_us.load(Ordering::Relaxed);
        s.count = self.count.load(Ordering::Relaxed);
        s.count = s.count.max(s.buckets.iter().sum());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Exposition::new();
        e.family(
            "wharf_stream_messages",
            "Messages stored.\nNow.",
            Kind::Gauge,
        );
        e.sample("wharf_stream_messages", &[("stream", "ORD\"E\\RS\n")], 6);
        e.sample("wharf_stream_messages", &[], 0);
        e.sample_f64("x", &[("a", "1"), ("b", "2")], 0.5);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP wharf_stream_messages Messages stored.\\nNow.\n\
             # TYPE wharf_stream_messages gauge\n\
             wharf_stream_messages{stream=\"ORD\\\"E\\\\RS\\n\"} 6\n\
             wharf_stream_messages 0\n\
             x{a=\"1\",b=\"2\"} 0.5\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_sum_and_count() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300)); // <= 0.0005
        h.observe(Duration::from_millis(3)); // <= 0.005
        h.observe(Duration::from_millis(4)); // <= 0.005
        h.observe(Duration::from_secs(120)); // beyond the last bound
        let snap = h.snapshot();
        assert_eq!(snap.count, 4);
        let mut e = Exposition::new();
        e.family("lat_seconds", "Latency.", Kind::Histogram);
        e.histogram("lat_seconds", &[("method", "Publish")], &snap);
        let text = e.finish();
        assert!(text.contains("lat_seconds_bucket{method=\"Publish\",le=\"0.0005\"} 1\n"));
        assert!(text.contains("lat_seconds_bucket{method=\"Publish\",le=\"0.0025\"} 1\n"));
        assert!(text.contains("lat_seconds_bucket{method=\"Publish\",le=\"0.005\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{method=\"Publish\",le=\"60\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{method=\"Publish\",le=\"+Inf\"} 4\n"));
        assert!(text.contains("lat_seconds_count{method=\"Publish\"} 4\n"));
        assert!(text.contains("lat_seconds_sum{method=\"Publish\"} 120.0073\n"));
        assert!(text.contains("# TYPE lat_seconds histogram\n"));
    }
}
