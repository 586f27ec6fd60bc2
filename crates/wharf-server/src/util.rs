//! Small helpers at the edge of the pure logic: the wall clock lives here.

/// Milliseconds since the Unix epoch. Only leaders call this, and stamp the
/// value into the commands they propose, so replicas never read a clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
