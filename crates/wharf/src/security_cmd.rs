//! Client-side security flags (TLS, token, user and password) and
//! `wharf passwd`, which turns a password or token into the argon2 hash the
//! server's `[auth]` section stores.
//!
//! Secrets given as flags show in the process list: prefer the WHARF_TOKEN /
//! WHARF_PASSWORD environment variables, and `wharf passwd` reads stdin.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use wharf_client::ConnectOptions;

/// Longest secret `wharf passwd` accepts.
const MAX_SECRET_BYTES: usize = 4096;

#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// PEM file of the cluster's CA; turns TLS on for client commands.
    #[arg(long, global = true, env = "WHARF_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate to present (with --tls-key).
    #[arg(long, global = true, env = "WHARF_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, env = "WHARF_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name to verify in the server's certificate (default: the address's host).
    #[arg(long, global = true, env = "WHARF_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Bearer token (prefer the WHARF_TOKEN environment variable).
    #[arg(
        long,
        global = true,
        env = "WHARF_TOKEN",
        hide_env_values = true,
        conflicts_with = "user"
    )]
    pub token: Option<String>,
    /// User name (with --password).
    #[arg(long, global = true, env = "WHARF_USER", requires = "password")]
    pub user: Option<String>,
    /// Password of --user (prefer the WHARF_PASSWORD environment variable).
    #[arg(long, global = true, env = "WHARF_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

impl ConnArgs {
    pub fn options(&self) -> Result<ConnectOptions> {
        if self.tls_cert.is_some() && self.tls_ca.is_none() {
            bail!("--tls-cert needs --tls-ca");
        }
        let tls_identity_pem = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((read(c, "--tls-cert")?, read(k, "--tls-key")?)),
            _ => None,
        };
        Ok(ConnectOptions {
            tls_ca_pem: self
                .tls_ca
                .as_ref()
                .map(|p| read(p, "--tls-ca"))
                .transpose()?,
            tls_identity_pem,
            tls_server_name: self.tls_server_name.clone(),
            token: self.token.clone(),
            user: self.user.clone().zip(self.password.clone()),
            local_address: None,
        })
    }
}

#[derive(Args, Debug)]
pub struct PasswdArgs {
    /// The password or token to hash. Without it, the first line of stdin.
    #[arg(long, env = "WHARF_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
}

/// Print the argon2 PHC string of the secret, for `password_hash` or
/// `token_hash` in the server's `[[auth.users]]`.
pub fn passwd(args: PasswdArgs) -> Result<()> {
    let secret = match args.secret {
        Some(s) => s,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_SECRET_BYTES as u64 + 2)
                .read_to_string(&mut text)
                .context("reading the secret from stdin")?;
            text.lines().next().unwrap_or_default().to_string()
        }
    };
    if secret.is_empty() || secret.len() > MAX_SECRET_BYTES {
        bail!("the secret must be 1 to {MAX_SECRET_BYTES} bytes");
    }
    println!("{}", wharf_server::auth::hash_secret(&secret)?);
    Ok(())
}
