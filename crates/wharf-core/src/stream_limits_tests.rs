//! Unit tests for the stream features beyond plain limits: per-subject
//! limits, discard-new, the duplicate window, purge, delete and the subject
//! index.

use super::*;

fn stream(edit: impl FnOnce(&mut StreamConfig)) -> StreamState {
    let mut cfg = StreamConfig {
        name: "ORDERS".to_string(),
        subjects: vec!["o.>".to_string()],
        ..StreamConfig::default()
    };
    edit(&mut cfg);
    let cfg = cfg.with_defaults();
    cfg.validate().expect("test config is valid");
    StreamState::new(cfg)
}

fn seqs(s: &StreamState) -> Vec<u64> {
    s.msgs.keys().copied().collect()
}

#[test]
fn duplicate_window_defaults_and_validation() {
    let c = stream(|_| {}).config().clone();
    assert_eq!(c.duplicate_window_ms, 120_000);
    assert_eq!(c.discard, DiscardPolicy::Old);
    assert_eq!(c.max_msgs_per_subject, -1);
    // A shorter max age caps the default window.
    let c = stream(|c| c.max_age_ms = 30_000).config().clone();
    assert_eq!(c.duplicate_window_ms, 30_000);
    let too_long = StreamConfig {
        duplicate_window_ms: 60_000,
        ..c.clone()
    };
    assert_eq!(
        too_long.validate().unwrap_err().to_string(),
        "invalid stream configuration: duplicate window 60000ms is longer than max age 30000ms"
    );
    let too_short = StreamConfig {
        duplicate_window_ms: 50,
        ..c
    };
    assert_eq!(
        too_short.validate().unwrap_err().to_string(),
        "invalid stream configuration: duplicate window 50ms is shorter than the minimum of 100ms"
    );
}

#[test]
fn max_msgs_per_subject_removes_that_subjects_oldest() {
    let mut s = stream(|c| c.max_msgs_per_subject = 2);
    for subject in ["o.a", "o.b", "o.a", "o.b"] {
        s.append(subject, 1, 0).unwrap();
    }
    let a = s.append("o.a", 1, 0).unwrap();
    assert_eq!((a.seq, a.removed), (5, vec![1]));
    assert_eq!(seqs(&s), vec![2, 3, 4, 5]);
    assert_eq!(
        s.subject_counts(None, 10),
        vec![("o.a".to_string(), 2), ("o.b".to_string(), 2)]
    );
    assert_eq!(s.stats().num_subjects, 2);
    // Lowering the limit applies to every subject at once.
    let cfg = StreamConfig {
        max_msgs_per_subject: 1,
        ..s.config().clone()
    };
    assert_eq!(s.update_config(cfg, 0).unwrap(), vec![2, 3]);
    assert_eq!(seqs(&s), vec![4, 5]);
}

#[test]
fn discard_new_refuses_and_changes_nothing() {
    let mut s = stream(|c| {
        c.discard = DiscardPolicy::New;
        c.max_msgs = 2;
    });
    s.append("o.a", 1, 0).unwrap();
    s.append("o.a", 1, 0).unwrap();
    let before = s.clone();
    let err = s.append("o.a", 1, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "maximum messages exceeded: stream \"ORDERS\" refuses new messages (discard policy new)"
    );
    assert_eq!(s, before);

    let mut s = stream(|c| {
        c.discard = DiscardPolicy::New;
        c.max_bytes = 10;
    });
    s.append("o.a", 6, 0).unwrap();
    assert!(matches!(
        s.append("o.a", 5, 0),
        Err(CoreError::StreamFull { limit, .. }) if limit == "bytes"
    ));
    s.append("o.a", 4, 0).unwrap();

    let mut s = stream(|c| {
        c.discard = DiscardPolicy::New;
        c.max_msgs_per_subject = 1;
    });
    s.append("o.a", 1, 0).unwrap();
    s.append("o.b", 1, 0).unwrap();
    assert!(matches!(
        s.append("o.a", 1, 0),
        Err(CoreError::StreamFull { limit, .. }) if limit == "messages per subject"
    ));
}

#[test]
fn discard_new_counts_aged_out_messages_as_gone() {
    let mut s = stream(|c| {
        c.discard = DiscardPolicy::New;
        c.max_msgs = 1;
        c.max_age_ms = 1_000;
    });
    s.append("o.a", 1, 0).unwrap();
    assert!(s.append("o.a", 1, 999).is_err());
    let a = s.append("o.a", 1, 1_000).unwrap();
    assert_eq!((a.seq, a.removed), (2, vec![1]));
}

#[test]
fn duplicate_ids_store_once_inside_the_window() {
    let mut s = stream(|c| c.duplicate_window_ms = 1_000);
    let first = s.append_msg("o.a", 3, Some("id-1"), 0).unwrap();
    assert_eq!((first.seq, first.duplicate), (1, false));
    let dup = s.append_msg("o.b", 9, Some("id-1"), 999).unwrap();
    assert_eq!(
        dup,
        Appended {
            seq: 1,
            removed: vec![],
            duplicate: true
        }
    );
    assert_eq!(s.stats().messages, 1);
    assert_eq!(s.num_msg_ids(), 1);
    // Ids are independent of each other, and no id means no dedup.
    assert_eq!(s.append_msg("o.a", 3, Some("id-2"), 999).unwrap().seq, 2);
    assert_eq!(s.append("o.a", 3, 999).unwrap().seq, 3);
    assert_eq!(s.append("o.a", 3, 999).unwrap().seq, 4);
    // Once the window has passed, the id is new again.
    assert!(s.has_expired(1_000));
    assert_eq!(s.expire(1_000), Vec::<u64>::new());
    assert_eq!(s.num_msg_ids(), 1);
    let again = s.append_msg("o.a", 3, Some("id-1"), 1_000).unwrap();
    assert_eq!((again.seq, again.duplicate), (5, false));
}

#[test]
fn duplicate_of_a_removed_message_still_answers_the_original() {
    let mut s = stream(|c| c.max_msgs = 1);
    s.append_msg("o.a", 1, Some("x"), 0).unwrap();
    s.append("o.a", 1, 0).unwrap();
    let dup = s.append_msg("o.a", 1, Some("x"), 0).unwrap();
    assert_eq!((dup.seq, dup.duplicate), (1, true));
    assert_eq!(seqs(&s), vec![2]);
}

#[test]
fn duplicate_window_is_checked_before_discard_new() {
    let mut s = stream(|c| {
        c.discard = DiscardPolicy::New;
        c.max_msgs = 1;
    });
    s.append_msg("o.a", 1, Some("x"), 0).unwrap();
    let dup = s.append_msg("o.a", 1, Some("x"), 0).unwrap();
    assert!(dup.duplicate);
    assert!(s.append_msg("o.a", 1, Some("y"), 0).is_err());
}

#[test]
fn message_ids_have_a_length_limit() {
    let mut s = stream(|_| {});
    let long = "x".repeat(MAX_MSG_ID_BYTES + 1);
    assert!(matches!(
        s.append_msg("o.a", 1, Some(&long), 0),
        Err(CoreError::InvalidRequest(_))
    ));
}

fn five_on_two_subjects() -> StreamState {
    let mut s = stream(|_| {});
    for subject in ["o.a", "o.b", "o.a", "o.b", "o.a"] {
        s.append(subject, 2, 0).unwrap();
    }
    s
}

#[test]
fn purge_variants() {
    let mut s = five_on_two_subjects();
    assert_eq!(s.purge(&Purge::default()).unwrap(), vec![1, 2, 3, 4, 5]);
    assert_eq!(s.stats().first_seq, 6);
    assert_eq!((s.stats().bytes, s.stats().num_subjects), (0, 0));

    let mut s = five_on_two_subjects();
    let by_subject = Purge {
        filter: Some("o.a".into()),
        ..Purge::default()
    };
    assert_eq!(s.purge(&by_subject).unwrap(), vec![1, 3, 5]);
    assert_eq!(seqs(&s), vec![2, 4]);

    let mut s = five_on_two_subjects();
    let keep = Purge {
        keep: Some(2),
        ..Purge::default()
    };
    assert_eq!(s.purge(&keep).unwrap(), vec![1, 2, 3]);

    let mut s = five_on_two_subjects();
    let keep_of_subject = Purge {
        filter: Some("o.a".into()),
        keep: Some(1),
        ..Purge::default()
    };
    assert_eq!(s.purge(&keep_of_subject).unwrap(), vec![1, 3]);

    let mut s = five_on_two_subjects();
    let below = Purge {
        below_seq: Some(4),
        ..Purge::default()
    };
    assert_eq!(s.purge(&below).unwrap(), vec![1, 2, 3]);
    let wildcard_below = Purge {
        filter: Some("o.*".into()),
        below_seq: Some(5),
        ..Purge::default()
    };
    assert_eq!(s.purge(&wildcard_below).unwrap(), vec![4]);
    assert_eq!(seqs(&s), vec![5]);
    assert_eq!(s.stats().bytes, 2);
}

#[test]
fn purge_refuses_bad_requests() {
    let mut s = five_on_two_subjects();
    let both = Purge {
        keep: Some(1),
        below_seq: Some(3),
        ..Purge::default()
    };
    assert_eq!(
        s.purge(&both).unwrap_err().to_string(),
        "a purge takes keep or seq, not both"
    );
    let bad = Purge {
        filter: Some("o..a".into()),
        ..Purge::default()
    };
    assert!(s.purge(&bad).is_err());
    assert_eq!(s.stats().messages, 5);
}

#[test]
fn delete_removes_one_message_from_every_index() {
    let mut s = five_on_two_subjects();
    s.delete(3).unwrap();
    assert_eq!(seqs(&s), vec![1, 2, 4, 5]);
    assert_eq!(s.get(3), None);
    assert_eq!(
        s.subject_counts(Some("o.a"), 10),
        vec![("o.a".to_string(), 2)]
    );
    assert_eq!(
        s.delete(3).unwrap_err().to_string(),
        "no message with sequence 3 in stream \"ORDERS\""
    );
    assert!(s.delete(99).is_err());
    // The first and last can go too; sequences are never reused.
    s.delete(1).unwrap();
    s.delete(5).unwrap();
    assert_eq!(s.stats().first_seq, 2);
    assert_eq!(s.append("o.c", 1, 0).unwrap().seq, 6);
}

#[test]
fn subject_counts_are_bounded() {
    let s = five_on_two_subjects();
    assert_eq!(s.subject_counts(None, 1), vec![("o.a".to_string(), 3)]);
    assert_eq!(s.subject_counts(Some("x.>"), 10), vec![]);
}

#[test]
fn dedup_window_and_subject_index_survive_serde() {
    let mut s = stream(|c| c.max_msgs_per_subject = 2);
    s.append_msg("o.a", 1, Some("m1"), 10).unwrap();
    s.append_msg("o.b", 1, Some("m2"), 20).unwrap();
    let bytes = serde_json::to_vec(&s).unwrap();
    let mut back: StreamState = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back, s);
    assert!(back.append_msg("o.a", 1, Some("m2"), 30).unwrap().duplicate);
}
