//! Subjects, subject filters and names.
//!
//! A subject is a dot-separated list of non-empty tokens (`orders.shipped`),
//! at most [`MAX_SUBJECT_BYTES`] bytes, with no whitespace or control
//! characters. A filter is a subject that may also use two wildcards, each of
//! which must be a whole token: `*` matches exactly one token and `>` matches
//! one or more tokens and may only be the last token.
//!
//! Invariants: the matching functions ([`subject_matches`],
//! [`filters_overlap`]) never allocate and never panic, whatever they are
//! given; on invalid input they simply return a (meaningless) boolean, so
//! callers validate first. Validation functions return a [`CoreError`] that
//! names the offending value and the rule it breaks.
//!
//! Deliberately left out: subject interning, a subscription trie (streams and
//! consumers are few, a linear scan is enough), and NATS's `$`-prefixed
//! system subjects (they are ordinary subjects here).

use crate::error::CoreError;

/// Longest subject or filter accepted, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 255;
/// Longest stream or consumer name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Most subject filters on one stream or one consumer. Overlap checks are
/// quadratic in this, and the meta group repeats them against every other
/// stream, so it must stay small.
pub const MAX_FILTERS: usize = 256;

/// Checks a subject messages are published to: no wildcards allowed.
pub fn validate_subject(s: &str) -> Result<(), CoreError> {
    check_tokens(s, false).map_err(|reason| CoreError::InvalidSubject {
        subject: s.to_string(),
        reason,
    })
}

/// Checks a subject filter: `*` and `>` allowed as whole tokens, `>` last.
pub fn validate_filter(s: &str) -> Result<(), CoreError> {
    check_tokens(s, true).map_err(|reason| CoreError::InvalidFilter {
        filter: s.to_string(),
        reason,
    })
}

fn check_tokens(s: &str, wildcards: bool) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "it is {} bytes long; the maximum is {MAX_SUBJECT_BYTES}",
            s.len()
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it may not contain whitespace or control characters".to_string());
    }
    let count = s.split('.').count();
    for (i, token) in s.split('.').enumerate() {
        if token.is_empty() {
            return Err("tokens between dots may not be empty".to_string());
        }
        let has_wildcard = token.contains(['*', '>']);
        if !has_wildcard {
            continue;
        }
        if !wildcards {
            return Err("wildcards '*' and '>' are only allowed in filters".to_string());
        }
        match token {
            "*" => {}
            ">" if i + 1 == count => {}
            ">" => return Err("'>' may only be the last token".to_string()),
            _ => {
                return Err(format!(
                    "wildcard in token {token:?}: '*' and '>' must be a whole token"
                ))
            }
        }
    }
    Ok(())
}

/// Does `subject` match `filter`? Both are assumed valid; never allocates.
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(ft), Some(st)) if ft == st => {}
            _ => return false,
        }
    }
}

/// Could some subject match both filters? Used to refuse streams whose
/// subjects overlap. Symmetric; never allocates.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let mut a = a.split('.');
    let mut b = b.split('.');
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            // `>` needs one or more tokens; the other side has at least this one.
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(x), Some(y)) if x == y => {}
            _ => return false,
        }
    }
}

/// Checks a stream or consumer name: 1 to 64 characters of `[A-Za-z0-9_-]`.
/// `kind` ("stream" or "consumer") is used in the error message.
pub fn validate_name(kind: &str, name: &str) -> Result<(), CoreError> {
    let reason = if name.is_empty() {
        Some("names may not be empty".to_string())
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Some("names may only contain A-Z, a-z, 0-9, '-' and '_'".to_string())
    } else if name.len() > MAX_NAME_CHARS {
        Some(format!(
            "names may be at most {MAX_NAME_CHARS} characters long"
        ))
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(CoreError::InvalidName {
            kind: kind.to_string(),
            name: name.to_string(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_table() {
        let cases = [
            ("a", "a", true),
            ("a", "b", false),
            ("a.b", "a.b", true),
            ("a.b", "a", false),
            ("a", "a.b", false),
            ("a.*", "a.b", true),
            ("a.*", "a", false),
            ("a.*", "a.b.c", false),
            ("*.b", "a.b", true),
            ("*.*", "a.b", true),
            ("*", "a", true),
            ("*", "a.b", false),
            ("a.>", "a.b", true),
            ("a.>", "a.b.c.d", true),
            ("a.>", "a", false),
            (">", "a", true),
            (">", "a.b.c", true),
            ("*.>", "a", false),
            ("*.>", "a.b", true),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.b.d", false),
            ("orders.shipped", "orders.created", false),
            ("orders.>", "orders.created", true),
            ("orders", "orders.created", false),
            ("ab", "a", false),
            ("a", "ab", false),
        ];
        for (filter, subject, want) in cases {
            assert_eq!(
                subject_matches(filter, subject),
                want,
                "filter {filter:?} subject {subject:?}"
            );
        }
    }

    #[test]
    fn overlap_table() {
        let cases = [
            ("a", "a", true),
            ("a", "b", false),
            ("a.>", "a.b", true),
            ("a.>", "a", false),
            ("a.*", "a.b", true),
            ("a.*", "a.b.c", false),
            ("a.*", "*.b", true),
            ("a.*", "b.*", false),
            (">", "x.y.z", true),
            ("a.*.c", "a.b.>", true),
            ("a.*.c", "a.b.d", false),
            ("*.*", "a.>", true),
            ("*", "a.>", false),
            ("orders.>", "orders.shipped", true),
            ("orders.>", "payments.>", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(filters_overlap(a, b), want, "{a:?} vs {b:?}");
            assert_eq!(filters_overlap(b, a), want, "{b:?} vs {a:?} (symmetry)");
        }
    }

    #[test]
    fn valid_subjects_and_filters() {
        for s in ["a", "orders.shipped", "a-b_c.D9", "$SYS.x"] {
            assert_eq!(validate_subject(s), Ok(()), "{s}");
            assert_eq!(validate_filter(s), Ok(()), "{s}");
        }
        for f in ["*", ">", "a.*", "a.>", "*.b.>", "*.*"] {
            assert_eq!(validate_filter(f), Ok(()), "{f}");
            assert!(validate_subject(f).is_err(), "{f} is not a publish subject");
        }
        assert_eq!(validate_subject(&"a".repeat(255)), Ok(()));
    }

    #[test]
    fn invalid_subjects_and_filters() {
        let long = "a".repeat(256);
        for s in [
            "", ".", "a.", ".a", "a..b", "a b", "a\tb", "a\n", &long, "ord*", "a.b>",
        ] {
            assert!(validate_subject(s).is_err(), "subject {s:?}");
            assert!(validate_filter(s).is_err(), "filter {s:?}");
        }
        for f in [">.a", "a.>.b", "a.**", "*a", ">>"] {
            assert!(validate_filter(f).is_err(), "filter {f:?}");
        }
    }

    #[test]
    fn error_messages_are_readable() {
        assert_eq!(
            validate_filter("ord*").unwrap_err().to_string(),
            "subject filter \"ord*\" is invalid: wildcard in token \"ord*\": '*' and '>' must be a whole token"
        );
        assert_eq!(
            validate_subject("a.*").unwrap_err().to_string(),
            "subject \"a.*\" is invalid: wildcards '*' and '>' are only allowed in filters"
        );
        assert_eq!(
            validate_filter("a.>.b").unwrap_err().to_string(),
            "subject filter \"a.>.b\" is invalid: '>' may only be the last token"
        );
    }

    #[test]
    fn names() {
        assert_eq!(validate_name("stream", "ORDERS"), Ok(()));
        assert_eq!(validate_name("consumer", "a-b_C9"), Ok(()));
        assert_eq!(validate_name("stream", &"x".repeat(64)), Ok(()));
        assert_eq!(
            validate_name("stream", "a.b").unwrap_err().to_string(),
            "stream name \"a.b\" is invalid: names may only contain A-Z, a-z, 0-9, '-' and '_'"
        );
        assert_eq!(
            validate_name("consumer", "").unwrap_err().to_string(),
            "consumer name \"\" is invalid: names may not be empty"
        );
        assert!(validate_name("stream", &"x".repeat(65)).is_err());
        for bad in ["a b", "a*", "a>", "é", "a/b"] {
            assert!(validate_name("stream", bad).is_err(), "{bad:?}");
        }
    }
}
