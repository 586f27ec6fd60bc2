//! The CLI's behaviour without a cluster: help, usage errors and bad server
//! arguments exit with a message and code 1, never a panic.

use std::process::Command;

fn wharf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(args)
        .output()
        .expect("run wharf")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_exits_zero() {
    let out = wharf(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("consumer"));
}

#[test]
fn usage_errors_exit_one() {
    for args in [
        vec!["stream"],
        vec!["consumer", "next", "ORDERS"],
        vec![
            "consumer", "next", "ORDERS", "shipping", "--ack", "--no-ack",
        ],
        vec![
            "consumer",
            "add",
            "ORDERS",
            "shipping",
            "--ack-wait",
            "soon",
        ],
        vec!["frobnicate"],
    ] {
        let out = wharf(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn bad_server_arguments_exit_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    for (peers, why) in [
        ("1=127.0.0.1:1", "must include this node"),
        ("2=127.0.0.1:1,2=127.0.0.1:2", "appears twice"),
        ("two=127.0.0.1:1", "bad node id"),
        ("2", "expected id=host:port"),
    ] {
        let out = wharf(&[
            "server",
            "--node-id",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data,
            "--peers",
            peers,
        ]);
        assert_eq!(out.status.code(), Some(1), "{peers}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{peers}: {}", stderr(&out));
    }
}

#[test]
fn unreachable_cluster_is_an_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("127.0.0.1:{port}");
    let out = wharf(&["--server", &server, "--retry-for", "1s", "stream", "ls"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
    let out = wharf(&["--server", &server, "health"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}
