//! Who a caller is (users, hashed credentials) and what each user may do.
//!
//! Users come from the `[auth]` section of the node's config. Passwords and
//! tokens are stored only as argon2 PHC strings (`wharf passwd` makes them).
//! An argon2 check costs tens of milliseconds on purpose, so successful checks
//! are remembered in a bounded cache keyed by a keyed BLAKE2s digest of the
//! credential (never the credential itself); a wrong credential always pays
//! the full cost.
//!
//! Permissions, per user, each an allow list and a deny list of patterns in
//! subject syntax (`*` one token, `>` the rest); deny wins, nothing is allowed
//! unless listed:
//! - publish: matched against the message subject;
//! - consume: matched against `STREAM.CONSUMER` (names never contain dots);
//! - admin (create, edit, delete, purge, read by sequence, step down): matched
//!   against the stream name.
//!
//! Reading metadata (stream and consumer info, lists, cluster status) needs
//! only a successful login.
//!
//! Invariants: [`Principal::check`] is called before any state changes; a
//! call that arrives without a [`Principal`] (the interceptor did not run) is
//! refused, never allowed.
//!
//! Left out: reloading users without a restart, per-user rate limits, audit log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use blake2::digest::{KeyInit, Mac};
use serde::Deserialize;
use wharf_core::subject::{subject_matches, validate_filter};

use crate::error::{Result, ServerError};

/// Successful logins remembered at most (then the cache starts over).
const MAX_CACHED_LOGINS: usize = 4096;

/// One `[[auth.users]]` entry of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// argon2 PHC string of the user's password (`wharf passwd`).
    #[serde(default)]
    pub password_hash: Option<String>,
    /// argon2 PHC string of the user's bearer token (`wharf passwd`).
    #[serde(default)]
    pub token_hash: Option<String>,
    #[serde(default)]
    pub publish_allow: Vec<String>,
    #[serde(default)]
    pub publish_deny: Vec<String>,
    #[serde(default)]
    pub consume_allow: Vec<String>,
    #[serde(default)]
    pub consume_deny: Vec<String>,
    #[serde(default)]
    pub admin_allow: Vec<String>,
    #[serde(default)]
    pub admin_deny: Vec<String>,
}

/// The identity a call runs as, attached to every request by the interceptor.
#[derive(Clone, Debug)]
pub enum Principal {
    /// Authentication is off: everything is allowed.
    Anyone,
    /// Another node of the cluster (mutual TLS or the cluster secret). It
    /// forwards calls its own node has already authorized.
    Peer,
    /// A logged-in user.
    User(Arc<UserConfig>),
}

/// What a call is about to do.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    Publish {
        subject: &'a str,
    },
    Consume {
        stream: &'a str,
        consumer: &'a str,
    },
    Admin {
        stream: &'a str,
    },
    /// Metadata reads: any logged-in caller.
    Read,
}

impl<'a> Action<'a> {
    /// Administering the stream `stream` (or its consumers).
    pub fn admin(stream: &'a str) -> Self {
        Action::Admin { stream }
    }

    /// Publishing to `subject`.
    pub fn publish(subject: &'a str) -> Self {
        Action::Publish { subject }
    }
}

impl Principal {
    /// The principal the interceptor attached to `req`; none means refused.
    pub fn of<T>(req: &tonic::Request<T>) -> Result<Principal> {
        req.extensions()
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| ServerError::Unauthenticated("no credentials checked".into()))
    }

    /// Ok when this principal may perform `action`.
    pub fn check(&self, action: Action<'_>) -> Result<()> {
        let user = match self {
            Principal::Anyone | Principal::Peer => return Ok(()),
            Principal::User(u) => u,
        };
        let (allowed, what) = match action {
            Action::Read => return Ok(()),
            Action::Publish { subject } => (
                permitted(&user.publish_allow, &user.publish_deny, subject),
                format!("publish to {subject:?}"),
            ),
            Action::Consume { stream, consumer } => (
                permitted(
                    &user.consume_allow,
                    &user.consume_deny,
                    &format!("{stream}.{consumer}"),
                ),
                format!("consume from {stream}/{consumer}"),
            ),
            Action::Admin { stream } => (
                permitted(&user.admin_allow, &user.admin_deny, stream),
                format!("administer stream {stream:?}"),
            ),
        };
        if allowed {
            Ok(())
        } else {
            Err(ServerError::PermissionDenied(format!(
                "user {:?} may not {what}",
                user.name
            )))
        }
    }
}

/// Shorthand for the top of a handler: the request's principal may do `action`.
pub fn authorize<T>(req: &tonic::Request<T>, action: Action<'_>) -> Result<()> {
    Principal::of(req)?.check(action)
}

fn permitted(allow: &[String], deny: &[String], target: &str) -> bool {
    !deny.iter().any(|p| subject_matches(p, target))
        && allow.iter().any(|p| subject_matches(p, target))
}

/// The configured users, and the cache of recent successful logins.
pub struct Users {
    users: Vec<Arc<UserConfig>>,
    by_name: HashMap<String, usize>,
    cache_key: [u8; 32],
    cache: Mutex<HashMap<[u8; 32], usize>>,
}

impl Users {
    /// Checks every user: unique names, parseable hashes, valid patterns.
    pub fn new(configs: &[UserConfig]) -> Result<Users> {
        let mut by_name = HashMap::new();
        for (i, u) in configs.iter().enumerate() {
            if u.name.is_empty() || u.name.contains(':') {
                return Err(ServerError::Invalid(format!(
                    "auth user {:?}: names must be non-empty and contain no ':'",
                    u.name
                )));
            }
            if by_name.insert(u.name.clone(), i).is_some() {
                return Err(ServerError::Invalid(format!(
                    "auth user {:?} appears twice",
                    u.name
                )));
            }
            if u.password_hash.is_none() && u.token_hash.is_none() {
                return Err(ServerError::Invalid(format!(
                    "auth user {:?} has neither password_hash nor token_hash",
                    u.name
                )));
            }
            for hash in u.password_hash.iter().chain(&u.token_hash) {
                PasswordHash::new(hash).map_err(|e| {
                    ServerError::Invalid(format!(
                        "auth user {:?}: not an argon2 PHC string ({e}); make one with `wharf passwd`",
                        u.name
                    ))
                })?;
            }
            let lists = [
                &u.publish_allow,
                &u.publish_deny,
                &u.consume_allow,
                &u.consume_deny,
                &u.admin_allow,
                &u.admin_deny,
            ];
            for pattern in lists.into_iter().flatten() {
                validate_filter(pattern).map_err(|e| {
                    ServerError::Invalid(format!(
                        "auth user {:?}: pattern {pattern:?}: {e}",
                        u.name
                    ))
                })?;
            }
        }
        let mut cache_key = [0u8; 32];
        OsRng.fill_bytes(&mut cache_key);
        Ok(Users {
            users: configs.iter().cloned().map(Arc::new).collect(),
            by_name,
            cache_key,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The user whose token this is.
    pub fn by_token(&self, token: &str) -> Option<Arc<UserConfig>> {
        let key = self.digest(b"token", "", token);
        if let Some(i) = self.cached(&key) {
            return Some(self.users[i].clone());
        }
        // Tokens do not name their user: try each user that has one.
        let found = self.users.iter().position(|u| {
            u.token_hash
                .as_deref()
                .is_some_and(|h| verify_blocking(h, token))
        })?;
        self.remember(key, found);
        Some(self.users[found].clone())
    }

    /// The user `name`, if `password` is theirs.
    pub fn by_password(&self, name: &str, password: &str) -> Option<Arc<UserConfig>> {
        let i = *self.by_name.get(name)?;
        let key = self.digest(b"password", name, password);
        if self.cached(&key) == Some(i) {
            return Some(self.users[i].clone());
        }
        let hash = self.users[i].password_hash.as_deref()?;
        if !verify_blocking(hash, password) {
            return None;
        }
        self.remember(key, i);
        Some(self.users[i].clone())
    }

    /// The cache key of a credential; `None` (never expected: the key has
    /// the one valid length) disables the cache rather than risk collisions.
    fn digest(&self, kind: &[u8], name: &str, secret: &str) -> Option<[u8; 32]> {
        let mut mac = <blake2::Blake2sMac256 as KeyInit>::new_from_slice(&self.cache_key).ok()?;
        for part in [kind, name.as_bytes(), secret.as_bytes()] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        Some(mac.finalize().into_bytes().into())
    }

    fn cached(&self, key: &Option<[u8; 32]>) -> Option<usize> {
        self.cache.lock().ok()?.get(key.as_ref()?).copied()
    }

    fn remember(&self, key: Option<[u8; 32]>, user: usize) {
        let Some(key) = key else { return };
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHED_LOGINS {
                cache.clear();
            }
            cache.insert(key, user);
        }
    }
}

/// An argon2 check, moved off the async worker when possible: it is slow on
/// purpose and must not stall the other calls of this runtime thread.
fn verify_blocking(hash: &str, secret: &str) -> bool {
    let check = || {
        PasswordHash::new(hash)
            .map(|h| {
                Argon2::default()
                    .verify_password(secret.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(check)
        }
        _ => check(),
    }
}

/// An argon2id PHC string of `secret` with a fresh random salt.
pub fn hash_secret(secret: &str) -> Result<String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ServerError::Internal(format!("argon2: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserConfig {
        UserConfig {
            name: name.into(),
            token_hash: Some(hash_secret("tok").unwrap()),
            password_hash: Some(hash_secret("pw").unwrap()),
            publish_allow: vec!["orders.>".into()],
            publish_deny: vec!["orders.secret.>".into()],
            consume_allow: vec!["ORDERS.*".into()],
            consume_deny: vec!["ORDERS.audit".into()],
            admin_allow: vec![],
            admin_deny: vec![],
        }
    }

    #[test]
    fn security_logins_by_token_and_password() {
        let users = Users::new(&[user("alice")]).unwrap();
        assert_eq!(users.by_token("tok").unwrap().name, "alice");
        assert_eq!(users.by_token("tok").unwrap().name, "alice", "cached");
        assert!(users.by_token("bad").is_none());
        assert!(users.by_password("alice", "pw").is_some());
        assert!(users.by_password("alice", "pw").is_some(), "cached");
        assert!(users.by_password("alice", "tok").is_none());
        assert!(users.by_password("bob", "pw").is_none());
    }

    #[test]
    fn security_permissions_deny_wins_and_default_is_deny() {
        let p = Principal::User(Arc::new(user("alice")));
        assert!(p
            .check(Action::Publish {
                subject: "orders.new"
            })
            .is_ok());
        let denied = [
            Action::Publish {
                subject: "orders.secret.x",
            },
            Action::Publish {
                subject: "billing.x",
            },
            Action::Consume {
                stream: "ORDERS",
                consumer: "audit",
            },
            Action::Consume {
                stream: "BILLING",
                consumer: "a",
            },
            Action::Admin { stream: "ORDERS" },
        ];
        for action in denied {
            assert!(
                matches!(p.check(action), Err(ServerError::PermissionDenied(_))),
                "{action:?}"
            );
        }
        assert!(p
            .check(Action::Consume {
                stream: "ORDERS",
                consumer: "ship"
            })
            .is_ok());
        assert!(p.check(Action::Read).is_ok());
        assert!(Principal::Anyone
            .check(Action::Admin { stream: "X" })
            .is_ok());
    }

    #[test]
    fn security_bad_user_configs_are_refused() {
        let mut u = user("a");
        u.password_hash = Some("plain".into());
        assert!(Users::new(&[u]).is_err());
        let mut u = user("a");
        u.publish_allow = vec!["a.>.b".into()];
        assert!(Users::new(&[u]).is_err());
        assert!(Users::new(&[user("a"), user("a")]).is_err());
    }
}
