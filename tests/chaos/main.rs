//! `cargo run -p wharf-tests --bin chaos -- --duration 60s --seed 7 --faults all`
//!
//! One chaos run against a fresh three-node cluster (see `wharf_tests::chaos`):
//! prints the fault timeline and the checker's counts, writes history.json and
//! summary.json to the results dir, and exits 1 when the history is invalid
//! (2 when the run itself could not be carried out).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use wharf_tests::chaos::{self, nemesis::FaultKind, Options};

#[derive(Parser, Debug)]
#[command(about = "Chaos run with a history checker against a 3-node wharf cluster")]
struct Args {
    /// How long the workload and the nemesis run (e.g. 60s, 10m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Fault kinds, comma-separated: kill, leader-kill, pause, restart,
    /// partition, power-loss, member, all.
    #[arg(long, default_value = "all")]
    faults: String,
    #[arg(long, default_value_t = 3)]
    publishers: u32,
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Total publishes per second across publishers.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Shortest and longest hold of one fault.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    fault_min: Duration,
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    fault_max: Duration,
    /// Shortest and longest quiet time between faults.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    recovery_min: Duration,
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    recovery_max: Duration,
    /// Bound on the drain after the final heal.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    drain: Duration,
    /// Longest stall (no publish acknowledged, or no delivery) that passes.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    max_stall: Duration,
    /// Results dir for history.json and summary.json [default: target/chaos/seed-<seed>].
    #[arg(long)]
    results: Option<PathBuf>,
    /// Keep the nodes' data dirs and logs even when the run is valid.
    #[arg(long)]
    keep: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    // wharf_bin() looks next to test binaries (target/<profile>/deps/..); a
    // bin lives in target/<profile> itself, next to `wharf`.
    if std::env::var_os("WHARF_BIN").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(PathBuf::from))
        {
            std::env::set_var("WHARF_BIN", dir.join("wharf"));
        }
    }
    let faults = match FaultKind::parse_list(&a.faults) {
        Ok(f) if !f.is_empty() => f,
        Ok(_) => {
            eprintln!("--faults: name at least one fault");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("--faults: {e}");
            return ExitCode::from(2);
        }
    };
    let results = a
        .results
        .unwrap_or_else(|| PathBuf::from(format!("target/chaos/seed-{}", a.seed)));
    let opts = Options {
        seed: a.seed,
        duration: a.duration,
        faults,
        publishers: a.publishers.max(1),
        workers: a.workers.max(1),
        rate: a.rate.max(1),
        fault_hold: (a.fault_min, a.fault_max.max(a.fault_min)),
        recovery: (a.recovery_min, a.recovery_max.max(a.recovery_min)),
        drain: a.drain,
        max_stall: a.max_stall,
        results: Some(results.clone()),
        keep: a.keep,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(chaos::run(opts)) {
        Ok(o) => {
            println!("fault timeline:\n{}", o.timeline);
            println!("checker:\n{}", o.report);
            if let Some(s) = &o.skipped {
                println!("note: {s}");
            }
            if let Some(d) = &o.data_dir {
                println!("node data and logs kept in {}", d.display());
            }
            println!("history and summary in {}", results.display());
            if o.valid() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("chaos run failed: {e:#}");
            ExitCode::from(2)
        }
    }
}
