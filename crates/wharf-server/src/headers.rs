//! Message headers: what a publish may carry.
//!
//! Headers are stored with the message and delivered with it; the broker
//! itself writes only the `Wharf-Dead-Letter-*` headers of dead-letter
//! copies. Limits keep one message's metadata small next to its payload.
//!
//! Invariants: names are 1 to [`MAX_HEADER_NAME_BYTES`] bytes of printable
//! ASCII without ':' or spaces; values hold no CR or LF; at most
//! [`MAX_HEADERS`] headers and [`MAX_HEADER_BYTES`] bytes in all.
//!
//! Left out: several values for one name (NATS allows them; a map here).

use std::collections::HashMap;

use crate::error::{Result, ServerError};

/// Most headers on one message.
pub const MAX_HEADERS: usize = 64;
/// Longest header name.
pub const MAX_HEADER_NAME_BYTES: usize = 256;
/// Most bytes of names and values together on one message.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Checks a publish's headers against the rules above.
pub fn validate(headers: &HashMap<String, String>) -> Result<()> {
    if headers.len() > MAX_HEADERS {
        return Err(ServerError::Invalid(format!(
            "{} headers: at most {MAX_HEADERS} are allowed",
            headers.len()
        )));
    }
    let mut total = 0usize;
    for (name, value) in headers {
        let name_ok = !name.is_empty()
            && name.len() <= MAX_HEADER_NAME_BYTES
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !name_ok {
            return Err(ServerError::Invalid(format!(
                "header name {name:?} must be 1 to {MAX_HEADER_NAME_BYTES} printable ASCII characters without ':' or spaces"
            )));
        }
        if value.contains(['\r', '\n']) {
            return Err(ServerError::Invalid(format!(
                "header {name:?} has a line break in its value"
            )));
        }
        total += name.len() + value.len();
    }
    if total > MAX_HEADER_BYTES {
        return Err(ServerError::Invalid(format!(
            "headers take {total} bytes: at most {MAX_HEADER_BYTES} are allowed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, value: &str) -> HashMap<String, String> {
        HashMap::from([(name.to_string(), value.to_string())])
    }

    #[test]
    fn accepts_ordinary_headers_and_refuses_bad_ones() {
        assert!(validate(&one("Trace-Id", "abc 123")).is_ok());
        assert!(validate(&one("", "x")).is_err());
        assert!(validate(&one("a:b", "x")).is_err());
        assert!(validate(&one("a b", "x")).is_err());
        assert!(validate(&one("ok", "line\nbreak")).is_err());
        assert!(validate(&one(&"n".repeat(MAX_HEADER_NAME_BYTES + 1), "x")).is_err());
        assert!(validate(&one("big", &"v".repeat(MAX_HEADER_BYTES))).is_err());
        let many: HashMap<String, String> = (0..=MAX_HEADERS)
            .map(|i| (format!("h{i}"), String::new()))
            .collect();
        assert!(validate(&many).is_err());
    }
}
