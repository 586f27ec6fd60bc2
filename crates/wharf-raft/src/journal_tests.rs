//! The journal's file format: replay of what was synced, and nothing else.

use super::*;

fn db() -> (tempfile::TempDir, sled::Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path().join("sled"))
        .open()
        .unwrap();
    (dir, db)
}

/// The records framed as the log stores frame them.
fn framed(records: &[Record]) -> Vec<u8> {
    let buf = JournalBuffer::default();
    for r in records {
        buf.push(r).unwrap();
    }
    buf.take(Vec::new()).unwrap()
}

fn insert(group: GroupId, index: u64, value: &[u8]) -> Record {
    Record::LogInsert {
        group,
        entries: vec![(index, value.to_vec())],
    }
}

fn log_of(db: &sled::Db, group: GroupId) -> Vec<(u64, Vec<u8>)> {
    let log = db.open_tree(tree_names(group).0).unwrap();
    log.iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            let key: [u8; 8] = k.as_ref().try_into().unwrap();
            (u64::from_be_bytes(key), v.to_vec())
        })
        .collect()
}

fn replayed_log(path: &Path, group: GroupId) -> (Replayed, Vec<(u64, Vec<u8>)>) {
    let (_dir, db) = db();
    let replayed = replay(path, &db).unwrap();
    let log = log_of(&db, group);
    (replayed, log)
}

#[test]
fn replay_applies_every_record_in_order() {
    let (dir, db) = db();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    f.write_and_sync(&framed(&[
        Record::LogInsert {
            group: 7,
            entries: vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())],
        },
        Record::LogRemove {
            group: 7,
            from: 3,
            to: 3,
        },
    ]))
    .unwrap();
    f.write_and_sync(&framed(&[
        insert(7, 3, b"C"),
        Record::MetaSet {
            group: 7,
            key: b"vote".to_vec(),
            value: b"v2".to_vec(),
        },
        insert(8, 1, b"x"),
        Record::DropGroup { group: 8 },
    ]))
    .unwrap();
    let replayed = replay(&path, &db).unwrap();
    assert_eq!(replayed.records, 6);
    assert_eq!(replayed.groups, vec![7, 8]);
    assert_eq!(replayed.torn_bytes, 0);
    assert_eq!(
        log_of(&db, 7),
        vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"C".to_vec())]
    );
    let meta = db.open_tree(tree_names(7).1).unwrap();
    assert_eq!(meta.get(b"vote").unwrap().unwrap().as_ref(), b"v2");
    assert!(log_of(&db, 8).is_empty(), "group 8 was dropped");
}

#[test]
fn replay_stops_at_a_torn_or_corrupt_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(1, 1, b"kept")])).unwrap();
    let second_at = f.pos as usize;
    f.write_and_sync(&framed(&[insert(1, 2, b"torn")])).unwrap();
    let end = f.pos as usize;
    drop(f);
    let whole = std::fs::read(&path).unwrap();
    assert!(whole.len() > end, "the file is preallocated past its end");

    // The second sync cut short (the preallocated zeros after it too).
    std::fs::write(&path, &whole[..end - 3]).unwrap();
    let (replayed, log) = replayed_log(&path, 1);
    assert_eq!(replayed.records, 1);
    assert!(replayed.torn_bytes > 0);
    assert_eq!(log, vec![(1, b"kept".to_vec())]);

    // A flipped byte in the second sync: its CRC fails.
    let mut bad = whole.clone();
    bad[end - 1] ^= 0xff;
    std::fs::write(&path, &bad).unwrap();
    let (replayed, log) = replayed_log(&path, 1);
    assert_eq!(replayed.records, 1);
    assert_eq!(
        replayed.torn_bytes,
        (end - second_at - FRAME_HEADER_BYTES) as u64
    );
    assert_eq!(log, vec![(1, b"kept".to_vec())]);

    // Intact, both are there, and the zeros after them end the replay.
    std::fs::write(&path, &whole).unwrap();
    let (replayed, log) = replayed_log(&path, 1);
    assert_eq!((replayed.records, replayed.torn_bytes), (2, 0));
    assert_eq!(log.len(), 2);
}

/// A value that makes one frame of `insert(1, _, value)` end the block after
/// the file header's: frames of different generations then meet on a block
/// boundary, where the zero-padding of the last block does not reach.
fn value_filling_two_blocks() -> Vec<u8> {
    let empty = framed(&[insert(1, 1, b"")]).len();
    let frame_bytes = 2 * direct_io::BLOCK_BYTES - FILE_HEADER_BYTES - FRAME_HEADER_BYTES;
    vec![b'o'; frame_bytes - empty]
}

#[test]
fn after_a_clear_the_older_generation_behind_the_end_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    let old = value_filling_two_blocks();
    for i in 1..=5 {
        f.write_and_sync(&framed(&[insert(1, i, &old)])).unwrap();
    }
    let allocated = std::fs::metadata(&path).unwrap().len();
    let before = std::fs::read(&path).unwrap();
    f.clear().unwrap();
    assert_eq!(replayed_log(&path, 1).0.records, 0, "cleared");
    // The clear wrote block 0 whole, all but the header as it was: a torn
    // write of it leaves the old header over the old frames, never a part.
    let after = std::fs::read(&path).unwrap();
    let block = direct_io::BLOCK_BYTES;
    assert_ne!(after[..FILE_HEADER_BYTES], before[..FILE_HEADER_BYTES]);
    assert_eq!(
        after[FILE_HEADER_BYTES..block],
        before[FILE_HEADER_BYTES..block]
    );
    // As long as each old frame: the second old frame follows it on disk,
    // its header whole and valid but for the generation.
    let new = vec![b'n'; old.len()];
    f.write_and_sync(&framed(&[insert(1, 9, &new)])).unwrap();
    assert_eq!(f.len_bytes(), 2 * direct_io::BLOCK_BYTES as u64);
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    let second_old = &on_disk[2 * direct_io::BLOCK_BYTES..][..FRAME_HEADER_BYTES];
    assert_ne!(
        second_old, &[0u8; FRAME_HEADER_BYTES],
        "old frame still there"
    );
    assert_eq!(
        on_disk.len() as u64,
        allocated,
        "the file is reused, not truncated"
    );
    let (replayed, log) = replayed_log(&path, 1);
    assert_eq!((replayed.records, replayed.torn_bytes), (1, 0));
    assert_eq!(log, vec![(9, new)]);

    // Reopened (as after a restart), it continues with a newer generation.
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(1, 10, b"after restart")]))
        .unwrap();
    let (replayed, log) = replayed_log(&path, 1);
    assert_eq!(replayed.records, 1);
    assert_eq!(log, vec![(10, b"after restart".to_vec())]);
}

#[test]
fn where_the_file_system_allows_direct_writes_they_stay_direct() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    let allowed = direct_io::open_direct(&path).unwrap().is_some();
    assert_eq!(f.direct, allowed);
    f.clear().unwrap();
    for i in 1..=20u64 {
        let value = vec![1u8; (i as usize * 1237) % 7000];
        f.write_and_sync(&framed(&[insert(5, i, &value)])).unwrap();
    }
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(5, 21, b"x")])).unwrap();
    // No write was refused as misaligned (which would fall back for good).
    assert_eq!(f.direct, allowed);
    drop(f);
    assert_eq!(replayed_log(&path, 5).0.records, 1);
}

#[test]
fn through_the_page_cache_the_same_frames_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    for round in 0..2u64 {
        // As where the file system refuses O_DIRECT (tmpfs before Linux 6.6), and a restart.
        let mut f = JournalFile::open_with(&path, false).unwrap();
        assert!(!f.direct);
        f.clear().unwrap();
        let mut want = Vec::new();
        for i in 1..=40u64 {
            // Sizes that end frames inside blocks, on them, and past them.
            let value = vec![i as u8; (i as usize * 613) % 9000];
            f.write_and_sync(&framed(&[insert(4, round * 100 + i, &value)]))
                .unwrap();
            want.push((round * 100 + i, value));
        }
        drop(f);
        let (replayed, log) = replayed_log(&path, 4);
        assert_eq!((replayed.records, replayed.torn_bytes), (40, 0));
        assert_eq!(log, want);
    }
}

#[test]
fn the_file_grows_in_steps_of_written_zeros_and_replays_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    let value = vec![7u8; 300 * 1024];
    let syncs = 20u64; // about 6 MiB: past the first step
    for i in 1..=syncs {
        f.write_and_sync(&framed(&[insert(3, i, &value)])).unwrap();
    }
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len % GROW_BYTES, 0, "grown in whole steps");
    assert!(len >= f.pos && len > GROW_BYTES);
    let (replayed, log) = replayed_log(&path, 3);
    assert_eq!(replayed.records, syncs);
    assert_eq!(log.len() as u64, syncs);
    assert!(log.iter().all(|(_, v)| *v == value));
}

#[test]
fn a_journal_of_the_earlier_format_replays_then_restarts_in_this_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    // The earlier format: framed records from the first byte, no header.
    let old = framed(&[insert(2, 1, b"one"), insert(2, 2, b"two")]);
    std::fs::write(&path, &old).unwrap();
    let (replayed, log) = replayed_log(&path, 2);
    assert_eq!((replayed.records, replayed.torn_bytes), (2, 0));
    assert_eq!(log.len(), 2);

    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    assert_eq!(replayed_log(&path, 2).0.records, 0);
    f.write_and_sync(&framed(&[insert(2, 3, b"three")]))
        .unwrap();
    assert_eq!(replayed_log(&path, 2).1, vec![(3, b"three".to_vec())]);
}

#[test]
fn a_missing_journal_replays_nothing() {
    let (dir, db) = db();
    let path = dir.path().join("journal");
    assert_eq!(replay(&path, &db).unwrap(), Replayed::default());
    let f = JournalFile::open(&path).unwrap();
    assert!(!f.wants_checkpoint());
    assert_eq!(replay(&path, &db).unwrap(), Replayed::default());
}

#[test]
fn nothing_is_written_before_the_first_clear_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(1, 1, b"replayed")]))
        .unwrap();
    drop(f);
    // Reopened: the file holds what the next replay must see; a frame
    // written after its end (past the zeros) would never be read back.
    let mut f = JournalFile::open(&path).unwrap();
    let err = f
        .write_and_sync(&framed(&[insert(1, 2, b"lost")]))
        .unwrap_err();
    assert!(err.to_string().contains("before it was cleared"), "{err}");
    assert_eq!(replayed_log(&path, 1).1, vec![(1, b"replayed".to_vec())]);
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(1, 2, b"kept")])).unwrap();
    assert_eq!(replayed_log(&path, 1).1, vec![(2, b"kept".to_vec())]);
}

#[test]
fn after_a_failed_clear_every_call_fails() {
    // /dev/full takes no truncation and no write: the clear fails.
    let Ok(mut f) = JournalFile::open(Path::new("/dev/full")) else {
        return; // not on this system
    };
    assert!(f.clear().is_err());
    let err = f
        .write_and_sync(&framed(&[insert(1, 1, b"x")]))
        .unwrap_err();
    assert!(err.to_string().contains("failed earlier"), "{err}");
    assert!(f
        .clear()
        .unwrap_err()
        .to_string()
        .contains("failed earlier"));
}

#[test]
fn replay_of_garbage_after_a_valid_header_stops_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut f = JournalFile::open(&path).unwrap();
    f.clear().unwrap();
    f.write_and_sync(&framed(&[insert(4, 1, b"good")])).unwrap();
    let end = f.pos as usize;
    let generation = f.generation;
    drop(f);
    let whole = std::fs::read(&path).unwrap();
    // A frame header of this generation claiming u32::MAX bytes.
    let mut huge = whole[..end].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&0u32.to_le_bytes());
    huge.extend_from_slice(&generation.to_le_bytes());
    huge.extend_from_slice(&[1, 2, 3]);
    std::fs::write(&path, &huge).unwrap();
    let (replayed, log) = replayed_log(&path, 4);
    assert_eq!(replayed.records, 1);
    assert!(replayed.torn_bytes > 0);
    assert_eq!(log, vec![(1, b"good".to_vec())]);
    // Pseudo-random bytes after the good frame, many seeds.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200 {
        let mut junk = whole[..end].to_vec();
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            junk.push(x as u8);
        }
        std::fs::write(&path, &junk).unwrap();
        assert_eq!(replayed_log(&path, 4).0.records, 1);
    }
}
