//! `wharf`: the server, a local dev cluster, and client commands.
//!
//! Every failure prints `error: <message>` on stderr and exits with code 1;
//! usage errors from the argument parser exit with 1 as well.

mod bench;
mod cli;
mod client_cmd;
mod format;
mod limits_config;
mod security_cmd;
mod server_cmd;
mod server_config;
mod sled_sync;
mod stream_cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let worker_threads = match &cli.command {
        cli::Command::Server(args) => match server_config::worker_threads(args) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(1);
            }
        },
        _ => None,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            cli::Command::Server(args) => server_cmd::server(args).await,
            cli::Command::Dev(args) => server_cmd::dev(args).await,
            cli::Command::Health { service } => {
                server_cmd::health(&cli.server, &cli.conn.options()?, &service).await
            }
            cli::Command::Bench(args) => bench::run(&cli.server, cli.retry_for, args).await,
            cli::Command::Passwd(args) => security_cmd::passwd(args),
            command => {
                client_cmd::run(&cli.server, &cli.conn.options()?, cli.retry_for, command).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
