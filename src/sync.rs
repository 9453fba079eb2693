//! Small helpers for state shared between threads.
use std::sync::{Mutex, MutexGuard};

/// Locks `m`, carrying on past a poisoned lock: a panic while holding it leaves plain data
/// behind (counters, queues, maps), never a half-made invariant the next holder relies on.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
