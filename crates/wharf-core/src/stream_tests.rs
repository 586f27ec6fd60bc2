//! Unit tests for the stream index: config validation and updates, sequence
//! assignment, limits (count, bytes, age) and the lookup helpers.

use super::*;

fn config(subjects: &[&str]) -> StreamConfig {
    StreamConfig {
        name: "ORDERS".to_string(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        ..StreamConfig::default()
    }
    .with_defaults()
}

fn stream(cfg: StreamConfig) -> StreamState {
    cfg.validate().expect("test config is valid");
    StreamState::new(cfg)
}

#[test]
fn defaults() {
    let c = StreamConfig {
        max_msgs: 0,
        max_bytes: -5,
        max_msg_size: -1,
        ..config(&["a"])
    }
    .with_defaults();
    assert_eq!(c.replicas, 3);
    assert_eq!(c.max_msgs, -1);
    assert_eq!(c.max_bytes, -1);
    assert_eq!(c.max_msg_size, 1024 * 1024);
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn validate_refuses_bad_configs() {
    let cases: Vec<(StreamConfig, &str)> = vec![
        (
            StreamConfig { name: "a.b".into(), ..config(&["a"]) },
            "stream name \"a.b\" is invalid: names may only contain A-Z, a-z, 0-9, '-' and '_'",
        ),
        (config(&[]), "invalid stream configuration: a stream needs at least one subject"),
        (
            config(&["a", "a"]),
            "invalid stream configuration: subject \"a\" is listed twice",
        ),
        (
            config(&["orders.>", "orders.shipped"]),
            "invalid stream configuration: subjects \"orders.>\" and \"orders.shipped\" overlap",
        ),
        (
            config(&["ord*"]),
            "subject filter \"ord*\" is invalid: wildcard in token \"ord*\": '*' and '>' must be a whole token",
        ),
        (
            StreamConfig { replicas: 2, ..config(&["a"]) },
            "invalid stream configuration: replicas must be 1 or 3, not 2",
        ),
        (
            StreamConfig { replicas: 5, ..config(&["a"]) },
            "invalid stream configuration: replicas must be 1 or 3, not 5",
        ),
        (
            StreamConfig { max_msg_size: 2_000_000, ..config(&["a"]) },
            "invalid stream configuration: max_msg_size 2000000 exceeds the server limit of 1048576",
        ),
    ];
    for (cfg, want) in cases {
        assert_eq!(cfg.validate().unwrap_err().to_string(), want);
    }
    assert_eq!(config(&["a.>", "b.*", "c"]).validate(), Ok(()));
    assert_eq!(
        StreamConfig {
            replicas: 1,
            ..config(&["a"])
        }
        .validate(),
        Ok(())
    );
}

#[test]
fn check_update_fixes_name_and_replicas() {
    let old = config(&["a"]);
    let renamed = StreamConfig {
        name: "OTHER".into(),
        ..old.clone()
    };
    assert!(old.check_update(&renamed).is_err());
    let r1 = StreamConfig {
        replicas: 1,
        ..old.clone()
    };
    assert_eq!(
        old.check_update(&r1).unwrap_err().to_string(),
        "cannot update stream \"ORDERS\": replicas cannot be changed (3 -> 1)"
    );
    let more = StreamConfig {
        subjects: vec!["a".into(), "b".into()],
        max_msgs: 5,
        ..old.clone()
    };
    assert_eq!(old.check_update(&more), Ok(()));
    let broken = StreamConfig {
        subjects: vec![],
        ..old.clone()
    };
    assert!(old.check_update(&broken).is_err());
}

#[test]
fn sequences_start_at_one_and_are_never_reused() {
    let mut s = stream(StreamConfig {
        max_msgs: 1,
        ..config(&["a"])
    });
    assert_eq!(
        s.stats(),
        StreamStats {
            messages: 0,
            bytes: 0,
            first_seq: 1,
            last_seq: 0,
            num_subjects: 0
        }
    );
    assert_eq!(
        s.append("a", 5, 0).unwrap(),
        Appended {
            seq: 1,
            removed: vec![],
            duplicate: false
        }
    );
    assert_eq!(
        s.append("a", 5, 0).unwrap(),
        Appended {
            seq: 2,
            removed: vec![1],
            duplicate: false
        }
    );
    assert_eq!(
        s.append("a", 5, 0).unwrap(),
        Appended {
            seq: 3,
            removed: vec![2],
            duplicate: false
        }
    );
    assert_eq!(
        s.stats(),
        StreamStats {
            messages: 1,
            bytes: 5,
            first_seq: 3,
            last_seq: 3,
            num_subjects: 1
        }
    );
    assert!(s.get(2).is_none());
    assert_eq!(s.get(3).map(|m| m.size), Some(5));
}

#[test]
fn append_errors() {
    let mut s = stream(StreamConfig {
        max_msg_size: 100,
        ..config(&["orders.>"])
    });
    assert_eq!(
        s.append("payments.x", 1, 0).unwrap_err().to_string(),
        "subject \"payments.x\" is not bound to stream \"ORDERS\""
    );
    assert!(s.append("orders.*", 1, 0).is_err());
    assert!(s.append("", 1, 0).is_err());
    assert_eq!(
        s.append("orders.a", 101, 0).unwrap_err().to_string(),
        "message size 101 exceeds the stream's maximum of 100"
    );
    assert_eq!(s.append("orders.a", 100, 0).unwrap().seq, 1);
    // Failed appends do not consume sequences.
    assert_eq!(s.stats().last_seq, 1);

    let mut big = stream(config(&["a"]));
    assert_eq!(
        big.append("a", 2_000_000, 0).unwrap_err().to_string(),
        "message size 2000000 exceeds the stream's maximum of 1048576"
    );
}

#[test]
fn max_bytes_discards_old() {
    let mut s = stream(StreamConfig {
        max_bytes: 25,
        ..config(&["a"])
    });
    s.append("a", 10, 0).unwrap();
    s.append("a", 10, 0).unwrap();
    assert_eq!(s.append("a", 10, 0).unwrap().removed, vec![1]);
    assert_eq!(s.append("a", 20, 0).unwrap().removed, vec![2, 3]);
    assert_eq!(
        s.stats(),
        StreamStats {
            messages: 1,
            bytes: 20,
            first_seq: 4,
            last_seq: 4,
            num_subjects: 1
        }
    );
    assert_eq!(
        s.append("a", 26, 0).unwrap_err().to_string(),
        "message size 26 exceeds the stream's max_bytes of 25"
    );
    assert_eq!(s.append("a", 0, 0).unwrap().removed, Vec::<u64>::new());
}

#[test]
fn max_age_expires() {
    let mut s = stream(StreamConfig {
        max_age_ms: 1000,
        duplicate_window_ms: 1000,
        ..config(&["a"])
    });
    s.append("a", 1, 0).unwrap();
    s.append("a", 1, 500).unwrap();
    assert_eq!(s.expire(999), Vec::<u64>::new());
    assert_eq!(s.expire(1000), vec![1]);
    // Appending also expires.
    assert_eq!(
        s.append("a", 1, 1600).unwrap(),
        Appended {
            seq: 3,
            removed: vec![2],
            duplicate: false
        }
    );
    assert_eq!(s.expire(i64::MAX), vec![3]);
    assert_eq!(
        s.stats(),
        StreamStats {
            messages: 0,
            bytes: 0,
            first_seq: 4,
            last_seq: 3,
            num_subjects: 0
        }
    );
}

#[test]
fn publish_time_never_goes_backwards() {
    let mut s = stream(StreamConfig {
        max_age_ms: 100,
        duplicate_window_ms: 100,
        ..config(&["a"])
    });
    s.append("a", 1, 1000).unwrap();
    s.append("a", 1, 10).unwrap(); // a clock behind the previous leader's
    assert_eq!(s.get(2).unwrap().published_ms, 1000);
    assert_eq!(s.expire(1099), Vec::<u64>::new());
    assert_eq!(s.expire(1100), vec![1, 2]);
}

#[test]
fn no_age_limit_keeps_everything() {
    let mut s = stream(config(&["a"]));
    s.append("a", 1, i64::MIN).unwrap();
    assert_eq!(s.expire(i64::MAX), Vec::<u64>::new());
}

#[test]
fn update_config_enforces_new_limits() {
    let mut s = stream(config(&["a", "b"]));
    for _ in 0..5 {
        s.append("a", 1, 0).unwrap();
    }
    let tighter = StreamConfig {
        max_msgs: 2,
        ..s.config().clone()
    };
    assert_eq!(s.update_config(tighter, 0), Ok(vec![1, 2, 3]));
    assert_eq!(s.config().max_msgs, 2);
    let bad = StreamConfig {
        replicas: 1,
        ..s.config().clone()
    };
    assert!(s.update_config(bad, 0).is_err());
    assert_eq!(s.config().replicas, 3);
    // Dropping a subject: new publishes to it are refused, stored ones stay.
    let only_b = StreamConfig {
        subjects: vec!["b".into()],
        ..s.config().clone()
    };
    assert_eq!(s.update_config(only_b, 0), Ok(vec![]));
    assert!(s.append("a", 1, 0).is_err());
    assert_eq!(s.stats().messages, 2);
}

#[test]
fn matching_lookups() {
    let mut s = stream(config(&["orders.>"]));
    for subj in [
        "orders.created",
        "orders.shipped",
        "orders.created",
        "orders.shipped",
    ] {
        s.append(subj, 1, 0).unwrap();
    }
    assert_eq!(s.next_matching(0, None), Some(1));
    assert_eq!(s.next_matching(1, None), Some(2));
    assert_eq!(s.next_matching(0, Some("orders.shipped")), Some(2));
    assert_eq!(s.next_matching(2, Some("orders.shipped")), Some(4));
    assert_eq!(s.next_matching(4, None), None);
    assert_eq!(s.next_matching(u64::MAX, None), None);
    assert_eq!(s.count_matching_after(0, None), 4);
    assert_eq!(s.count_matching_after(1, Some("orders.shipped")), 2);
    assert_eq!(s.count_matching_after(0, Some("orders.*.x")), 0);
    assert_eq!(s.count_matching_after(u64::MAX, None), 0);
}

#[test]
fn state_round_trips_through_serde() {
    let mut s = stream(StreamConfig {
        max_msgs: 3,
        ..config(&["a"])
    });
    for t in 0..5 {
        s.append("a", 7, t).unwrap();
    }
    let json = serde_json::to_string(&s).unwrap();
    let back: StreamState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
}
