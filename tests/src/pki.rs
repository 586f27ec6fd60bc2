//! Test certificates and secured node configs, made at test time.
//!
//! [`Pki::new`] writes into a temporary directory: a cluster CA, one node
//! certificate signed by it (SANs `localhost` and 127.0.0.1-127.0.0.9, server
//! and client use, so every node on loopback can share it), and a foreign CA
//! with its own node certificate for negative tests. Nothing here is fit for
//! production: keys are written unprotected to the temp dir.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

pub struct Pki {
    dir: tempfile::TempDir,
}

/// The three PEM files a node's `[tls]` section names.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

fn ca(name: &str) -> Result<(rcgen::Certificate, KeyPair)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert, key))
}

fn node_cert(ca: &rcgen::Certificate, ca_key: &KeyPair) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    for last in 1..=9u8 {
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, last].into()));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "wharf node");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, ca, ca_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    pub fn new() -> Result<Pki> {
        let dir = tempfile::Builder::new().prefix("wharf-pki-").tempdir()?;
        for (prefix, name) in [("", "wharf test cluster CA"), ("foreign-", "foreign CA")] {
            let (ca_cert, ca_key) = ca(name)?;
            let (cert, key) = node_cert(&ca_cert, &ca_key)?;
            std::fs::write(dir.path().join(format!("{prefix}ca.pem")), ca_cert.pem())?;
            std::fs::write(dir.path().join(format!("{prefix}node.pem")), cert)?;
            std::fs::write(dir.path().join(format!("{prefix}node.key")), key)?;
        }
        Ok(Pki { dir })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster's node certificate, key and CA.
    pub fn cluster(&self) -> TlsFiles {
        self.files("")
    }

    /// A node certificate from another CA (trusting that other CA).
    pub fn foreign(&self) -> TlsFiles {
        self.files("foreign-")
    }

    fn files(&self, prefix: &str) -> TlsFiles {
        let p = |name: &str| self.dir.path().join(format!("{prefix}{name}"));
        TlsFiles {
            cert: p("node.pem"),
            key: p("node.key"),
            ca: p("ca.pem"),
        }
    }

    /// PEM of the cluster CA, for clients.
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        std::fs::read(self.dir.path().join("ca.pem")).context("read ca.pem")
    }

    /// Write `name` with a `[tls]` section for `tls` (if any) followed by
    /// `rest` (e.g. an `[auth]` section); returns its path.
    pub fn write_config(&self, name: &str, tls: Option<&TlsFiles>, rest: &str) -> Result<PathBuf> {
        let mut text = String::new();
        if let Some(t) = tls {
            text.push_str(&format!(
                "[tls]\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\n\n",
                t.cert, t.key, t.ca
            ));
        }
        text.push_str(rest);
        let path = self.dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

/// The argon2 hash of `secret`, made by `wharf passwd` (so the command is
/// exercised too).
pub fn passwd(secret: &str) -> Result<String> {
    let out = std::process::Command::new(crate::wharf_bin())
        .args(["passwd", "--secret", secret])
        .output()
        .context("run wharf passwd")?;
    anyhow::ensure!(
        out.status.success(),
        "wharf passwd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}
