fn main() {
    let path = std::env::args().nth(1).unwrap();
    let tree = std::env::args().nth(2).unwrap();
    let db = sled::open(&path).unwrap();
    let t = db.open_tree(&tree).unwrap();
    let keys: Vec<u64> = t
        .iter()
        .map(|kv| u64::from_be_bytes(kv.unwrap().0.as_ref().try_into().unwrap()))
        .collect();
    println!(
        "iter: {} keys, first {:?} last {:?}",
        keys.len(),
        keys.first(),
        keys.last()
    );
    for w in keys.windows(2) {
        if w[1] != w[0] + 1 {
            println!("  iter jumps {} -> {}", w[0], w[1]);
        }
    }
    let (a, b) = (keys[0], *keys.last().unwrap());
    let missing: Vec<u64> = (a..=b).filter(|i| !keys.contains(i)).collect();
    let present_by_get = missing
        .iter()
        .filter(|i| t.get(i.to_be_bytes()).unwrap().is_some())
        .count();
    println!(
        "missing from iter: {}, of them found by get: {}",
        missing.len(),
        present_by_get
    );
    let back: Vec<u64> = t
        .iter()
        .rev()
        .map(|kv| u64::from_be_bytes(kv.unwrap().0.as_ref().try_into().unwrap()))
        .collect();
    println!("rev iter: {} keys", back.len());
}
