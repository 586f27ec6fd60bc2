//! `wharf server` settings from flags, environment and a TOML file.
//!
//! Precedence: a flag, then its environment variable (both handled by clap),
//! then the `--config` file, then the default. `node_id = "ordinal"` derives
//! the id from the host name's trailing number, so one StatefulSet template
//! serves every pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use wharf_server::{NodeConfig, RaftSettings};

use crate::cli::ServerArgs;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    node_id: Option<NodeIdSetting>,
    listen: Option<String>,
    data: Option<PathBuf>,
    peers: Option<PeersSetting>,
    /// Seeds of an existing cluster to join: "host:port,..." .
    join: Option<String>,
    heartbeat_ms: Option<u64>,
    election_min_ms: Option<u64>,
    election_max_ms: Option<u64>,
    snapshot_every_entries: Option<u64>,
    worker_threads: Option<usize>,
    cache_mb: Option<u64>,
    metrics_listen: Option<String>,
    log_format: Option<LogFormat>,
    limits: Option<crate::limits_config::LimitsFile>,
    /// `[tls]`: certificate files (docs/SECURITY.md).
    tls: Option<wharf_server::security::TlsConfig>,
    /// `[auth]`: cluster secret and users (docs/SECURITY.md).
    auth: Option<wharf_server::security::AuthConfig>,
}

/// How `wharf server` writes its log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's json format).
    Json,
}

/// The log format from the flag, its environment variable, or the file.
/// Read before the rest of the settings so that their errors are logged in it.
pub fn log_format(args: &ServerArgs) -> Result<LogFormat> {
    match args.log_format.as_deref() {
        Some("json") => return Ok(LogFormat::Json),
        Some("text") => return Ok(LogFormat::Text),
        Some(other) => bail!("bad --log-format {other:?}: expected text or json"),
        None => {}
    }
    let file = match &args.config {
        Some(path) => load_file(path)?,
        None => FileConfig::default(),
    };
    Ok(file.log_format.unwrap_or_default())
}

/// Bounds of `--cache-mb`: below 16 MiB sled would evict the pages of the
/// groups' own indexes under any load; the upper bound only keeps the
/// conversion to bytes far from overflow.
const CACHE_MB: std::ops::RangeInclusive<u64> = 16..=1024 * 1024;

/// The page cache's size in bytes from `--cache-mb`, its variable or the file.
fn cache_bytes(flag: Option<u64>, file: Option<u64>) -> Result<u64> {
    match flag.or(file) {
        None => Ok(wharf_server::DEFAULT_CACHE_BYTES),
        Some(mb) if CACHE_MB.contains(&mb) => Ok(mb * 1024 * 1024),
        Some(mb) => bail!(
            "--cache-mb {mb} is out of range: from {} to {} MiB",
            CACHE_MB.start(),
            CACHE_MB.end()
        ),
    }
}

/// Most threads `--worker-threads` accepts.
const MAX_WORKER_THREADS: usize = 1024;

/// Threads of the server's runtime from the flag, its environment variable
/// or the file; `None` leaves tokio's default (one per CPU the process may
/// use). Read before the runtime is built.
pub fn worker_threads(args: &ServerArgs) -> Result<Option<usize>> {
    let threads = match (args.worker_threads, &args.config) {
        (Some(n), _) => Some(n),
        (None, Some(path)) => load_file(path)?.worker_threads,
        (None, None) => None,
    };
    match threads {
        Some(0) => bail!("--worker-threads must be at least 1"),
        Some(n) if n > MAX_WORKER_THREADS => {
            bail!("--worker-threads {n} is more than the {MAX_WORKER_THREADS} allowed")
        }
        other => Ok(other),
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NodeIdSetting {
    Number(u64),
    Text(String),
}

/// Peers as `"1=a:7001,2=b:7001"` or as a table `{ 1 = "a:7001", ... }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PeersSetting {
    Text(String),
    Table(BTreeMap<String, String>),
}

pub fn load_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("bad config file {}", path.display()))
}

/// Parse `1=host:port,2=host:port,...`.
pub fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((id, addr)) = part.split_once('=') else {
            bail!("bad peer {part:?}: expected id=host:port");
        };
        add_peer(&mut peers, id, addr)?;
    }
    if peers.is_empty() {
        bail!("--peers is empty");
    }
    Ok(peers)
}

fn add_peer(peers: &mut BTreeMap<u64, String>, id: &str, addr: &str) -> Result<()> {
    let part = format!("{id}={addr}");
    let id: u64 = id
        .trim()
        .parse()
        .with_context(|| format!("bad node id in {part:?}"))?;
    let addr = addr.trim();
    if addr.is_empty() || !addr.contains(':') {
        bail!("bad peer address in {part:?}: expected host:port");
    }
    if peers.insert(id, addr.to_string()).is_some() {
        bail!("node id {id} appears twice in --peers");
    }
    Ok(())
}

/// `wharf-2` -> 3: the trailing number of a host name, plus one.
pub fn node_id_from_hostname(hostname: &str) -> Result<u64> {
    let digits: String = hostname
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let digits: String = digits.chars().rev().collect();
    if digits.is_empty() {
        bail!("node id `ordinal`: host name {hostname:?} does not end in a number");
    }
    let ordinal: u64 = digits
        .parse()
        .with_context(|| format!("host name {hostname:?}"))?;
    Ok(ordinal + 1)
}

fn hostname() -> Result<String> {
    if let Ok(h) = std::env::var("HOSTNAME") {
        if !h.is_empty() {
            return Ok(h);
        }
    }
    let h = std::fs::read_to_string("/etc/hostname")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .context("node id `ordinal` needs the host name (HOSTNAME or /etc/hostname)")?;
    Ok(h.trim().to_string())
}

fn node_id(setting: &str) -> Result<u64> {
    if setting == "ordinal" {
        return node_id_from_hostname(&hostname()?);
    }
    setting
        .parse()
        .map_err(|_| anyhow!("bad node id {setting:?}: expected a number or `ordinal`"))
}

pub fn resolve(args: ServerArgs) -> Result<NodeConfig> {
    let file = match &args.config {
        Some(path) => load_file(path)?,
        None => FileConfig::default(),
    };
    let id_setting = match (args.node_id, file.node_id) {
        (Some(s), _) => s,
        (None, Some(NodeIdSetting::Number(n))) => n.to_string(),
        (None, Some(NodeIdSetting::Text(s))) => s,
        (None, None) => {
            bail!("--node-id (or WHARF_NODE_ID, or node_id in the config file) is required")
        }
    };
    let listen = args
        .listen
        .or(file.listen)
        .ok_or_else(|| anyhow!("--listen is required"))?;
    let listen = listen
        .parse()
        .with_context(|| format!("bad --listen address {listen:?}"))?;
    let data = args
        .data
        .or(file.data)
        .ok_or_else(|| anyhow!("--data is required"))?;
    let peers = match (args.peers, file.peers) {
        (Some(s), _) | (None, Some(PeersSetting::Text(s))) => parse_peers(&s)?,
        (None, Some(PeersSetting::Table(t))) => {
            let mut peers = BTreeMap::new();
            for (id, addr) in t {
                add_peer(&mut peers, &id, &addr)?;
            }
            peers
        }
        (None, None) => BTreeMap::new(),
    };
    let join: Vec<String> = args
        .join
        .or(file.join)
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    match (peers.is_empty(), join.is_empty()) {
        (true, true) => bail!(
            "--peers (found a new cluster) or --join (join an existing one) is required"
        ),
        (false, false) => bail!(
            "--peers and --join exclude each other: --peers founds a new cluster, --join joins an existing one"
        ),
        _ => {}
    }
    let metrics_listen = match args.metrics_listen.or(file.metrics_listen) {
        Some(s) if !s.is_empty() => Some(
            s.parse()
                .with_context(|| format!("bad --metrics-listen address {s:?}"))?,
        ),
        _ => None,
    };
    let defaults = RaftSettings::default();
    let raft = RaftSettings {
        heartbeat_ms: args
            .heartbeat_ms
            .or(file.heartbeat_ms)
            .unwrap_or(defaults.heartbeat_ms),
        election_min_ms: args
            .election_min_ms
            .or(file.election_min_ms)
            .unwrap_or(defaults.election_min_ms),
        election_max_ms: args
            .election_max_ms
            .or(file.election_max_ms)
            .unwrap_or(defaults.election_max_ms),
        snapshot_every_entries: match args.snapshot_every_entries.or(file.snapshot_every_entries) {
            Some(0) => None,
            Some(n) => Some(n),
            None => defaults.snapshot_every_entries,
        },
        cache_bytes: cache_bytes(args.cache_mb, file.cache_mb)?,
        ..defaults
    };
    Ok(NodeConfig {
        node_id: node_id(&id_setting)?,
        listen,
        data_dir: data,
        peers,
        join,
        raft,
        metrics_listen,
        limits: crate::limits_config::resolve(&args.limits, file.limits),
        security: wharf_server::SecurityConfig {
            tls: file.tls,
            auth: file.auth,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinal_from_statefulset_host_names() {
        assert_eq!(node_id_from_hostname("wharf-0").unwrap(), 1);
        assert_eq!(node_id_from_hostname("wharf-12").unwrap(), 13);
        assert!(node_id_from_hostname("wharf").is_err());
    }

    #[test]
    fn peers_as_text_or_table() {
        let p = parse_peers("1=a:1, 2=b:2").unwrap();
        assert_eq!(p.get(&2).map(String::as_str), Some("b:2"));
        assert!(parse_peers("1=a:1,1=b:2").is_err());
        let file: FileConfig = toml::from_str(
            "node_id = \"ordinal\"\nlisten = \"0.0.0.0:7001\"\ndata = \"/data\"\n[peers]\n1 = \"wharf-0.h:7001\"\n2 = \"wharf-1.h:7001\"\n",
        )
        .unwrap();
        assert!(matches!(file.peers, Some(PeersSetting::Table(ref t)) if t.len() == 2));
        assert!(
            toml::from_str::<FileConfig>("nodeid = 1").is_err(),
            "unknown keys are refused"
        );
    }

    /// The ```toml block of docs/CONFIG.md.
    fn documented_example() -> String {
        let doc = include_str!("../../../docs/CONFIG.md");
        let start = doc
            .find("```toml\n")
            .expect("a toml block in docs/CONFIG.md")
            + 8;
        let len = doc[start..].find("```").expect("closed toml block");
        doc[start..start + len].to_string()
    }

    #[test]
    fn documented_example_sets_every_setting() {
        let example = documented_example();
        let file: FileConfig = toml::from_str(&example).expect("docs/CONFIG.md example parses");
        // Every key of the file format appears in the example, so the doc
        // cannot fall behind a new setting.
        let FileConfig {
            node_id,
            listen,
            data,
            peers,
            heartbeat_ms,
            election_min_ms,
            election_max_ms,
            snapshot_every_entries,
            worker_threads,
            cache_mb,
            metrics_listen,
            log_format,
            limits,
            // Excludes `peers`; documented beside it, exercised by the
            // membership tests.
            join: _,
            // Documented in docs/SECURITY.md, exercised by the security_* tests.
            tls: _,
            auth: _,
        } = file;
        assert!(limits.is_some());
        assert!(node_id.is_some() && listen.is_some() && data.is_some() && peers.is_some());
        assert!(heartbeat_ms.is_some() && election_min_ms.is_some() && election_max_ms.is_some());
        assert!(metrics_listen.is_some() && snapshot_every_entries.is_some());
        assert!(worker_threads.is_some() && cache_mb.is_some());
        assert_eq!(log_format, Some(LogFormat::Json));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, &example).unwrap();
        let args = ServerArgs {
            config: Some(path),
            ..no_flags()
        };
        assert_eq!(log_format_of(&args), LogFormat::Json);
        assert_eq!(super::worker_threads(&args).unwrap(), worker_threads);
        let c = resolve(args).expect("the documented example resolves");
        assert_eq!(c.node_id, 1);
        assert_eq!(c.listen.port(), 7001);
        assert_eq!(c.peers.len(), 3);
        assert_eq!(c.metrics_listen.map(|a| a.port()), Some(9090));
        // The file's timings reach the Raft settings (whatever the doc's
        // example picks, so editing it does not break this test).
        assert_eq!(Some(c.raft.heartbeat_ms), heartbeat_ms);
        assert_eq!(Some(c.raft.election_min_ms), election_min_ms);
        assert_eq!(Some(c.raft.election_max_ms), election_max_ms);
        assert_eq!(
            cache_mb.map(|mb| mb * 1024 * 1024),
            Some(c.raft.cache_bytes)
        );
        assert_eq!(c.limits.max_connections_per_ip, 1024);
    }

    /// `wharf server` with no flags at all.
    fn no_flags() -> ServerArgs {
        ServerArgs {
            config: None,
            node_id: None,
            listen: None,
            data: None,
            peers: None,
            join: None,
            heartbeat_ms: None,
            election_min_ms: None,
            election_max_ms: None,
            snapshot_every_entries: None,
            worker_threads: None,
            cache_mb: None,
            metrics_listen: None,
            log_format: None,
            limits: Default::default(),
        }
    }

    /// Flags naming a one-node cluster, nothing else.
    fn one_node_flags() -> ServerArgs {
        ServerArgs {
            node_id: Some("1".into()),
            listen: Some("127.0.0.1:1".into()),
            data: Some("/d".into()),
            peers: Some("1=a:1".into()),
            ..no_flags()
        }
    }

    fn log_format_of(args: &ServerArgs) -> LogFormat {
        log_format(args).unwrap()
    }

    #[test]
    fn metrics_listen_and_log_format_from_flags() {
        let mut args = one_node_flags();
        assert_eq!(log_format_of(&args), LogFormat::Text, "text by default");
        args.log_format = Some("json".into());
        assert_eq!(log_format_of(&args), LogFormat::Json);
        let off = ServerArgs {
            metrics_listen: Some(String::new()),
            ..args.clone()
        };
        assert_eq!(resolve(off).unwrap().metrics_listen, None, "empty is off");
        assert_eq!(
            resolve(args.clone()).unwrap().metrics_listen,
            None,
            "off by default"
        );
        let bad = ServerArgs {
            metrics_listen: Some("nope".into()),
            ..args.clone()
        };
        let err = resolve(bad).unwrap_err().to_string();
        assert!(err.contains("--metrics-listen"), "{err}");
        assert!(toml::from_str::<FileConfig>("log_format = \"yaml\"").is_err());
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, "node_id = 2\nlisten = \"127.0.0.1:1\"\ndata = \"/d\"\npeers = \"1=a:1,2=b:2\"\nheartbeat_ms = 300\n").unwrap();
        let args = ServerArgs {
            config: Some(path),
            listen: Some("127.0.0.1:9".into()),
            ..no_flags()
        };
        let c = resolve(args).unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.listen.port(), 9);
        assert_eq!(c.raft.heartbeat_ms, 300);
        assert_eq!(c.peers.len(), 2);
    }

    #[test]
    fn worker_threads_from_flag_or_file_and_refused_when_zero_or_huge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, "worker_threads = 3\n").unwrap();
        let args = one_node_flags();
        assert_eq!(
            super::worker_threads(&args).unwrap(),
            None,
            "tokio's default"
        );
        let from_file = ServerArgs {
            config: Some(path),
            ..args.clone()
        };
        assert_eq!(super::worker_threads(&from_file).unwrap(), Some(3));
        let flag_wins = ServerArgs {
            worker_threads: Some(1),
            ..from_file
        };
        assert_eq!(super::worker_threads(&flag_wins).unwrap(), Some(1));
        for bad in [0, 100_000] {
            let args = ServerArgs {
                worker_threads: Some(bad),
                ..args.clone()
            };
            let err = super::worker_threads(&args).unwrap_err().to_string();
            assert!(err.contains("--worker-threads"), "{err}");
        }
    }

    #[test]
    fn cache_from_flag_or_file_and_refused_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, "cache_mb = 64\n").unwrap();
        let args = one_node_flags();
        let default = resolve(args.clone()).unwrap().raft.cache_bytes;
        assert_eq!(default, 256 * 1024 * 1024);
        let from_file = ServerArgs {
            config: Some(path),
            ..args.clone()
        };
        assert_eq!(
            resolve(from_file.clone()).unwrap().raft.cache_bytes,
            64 << 20
        );
        let flag_wins = ServerArgs {
            cache_mb: Some(32),
            ..from_file
        };
        assert_eq!(resolve(flag_wins).unwrap().raft.cache_bytes, 32 << 20);
        for bad in [0, 15, 1024 * 1024 + 1, u64::MAX] {
            let args = ServerArgs {
                cache_mb: Some(bad),
                ..args.clone()
            };
            let err = resolve(args).unwrap_err().to_string();
            assert!(
                err.contains("--cache-mb") && err.contains("out of range"),
                "{err}"
            );
        }
    }
}
