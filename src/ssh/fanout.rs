//! Parallel fan-out over hosts: bounded worker threads, each making and owning its sessions.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// At most this many hosts are worked on at once: each holds a thread, a socket and a libssh2
/// session, and a few hundred of those are cheap, while thousands would hit descriptor limits.
pub const MAX_PARALLEL: usize = 256;

/// Runs `f(i)` for every `i` in `0..n` on up to `MAX_PARALLEL` threads; results in order.
pub fn each<T: Send, F: Fn(usize) -> T + Sync>(n: usize, f: F) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..n.min(MAX_PARALLEL) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                let r = f(i);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    // Every index was taken by exactly one thread, and scope joined them all.
    results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_their_order() {
        let out = super::each(1000, |i| i * 2);
        assert_eq!(out, (0..1000).map(|i| i * 2).collect::<Vec<_>>());
        assert!(super::each(0, |i| i).is_empty());
    }
}
