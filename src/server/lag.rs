//! How far the store is behind the agents: each frame's lag from its agent's stamp (`t_ms`, the
//! moment the agent made it) to the batch that made it durable, summarised every
//! [`WINDOW`] into the server log. A lag that grows from window to window is an ingest that
//! does not keep up. The stamps are the nodes' clocks: skew between hosts adds to it.
use std::time::{Duration, Instant};

pub const WINDOW: Duration = Duration::from_secs(10);

pub struct IngestLag {
    window_start: Instant,
    lags_ms: Vec<u64>,
}

/// One window's frames and their lag.
#[derive(Debug, PartialEq)]
pub struct LagWindow {
    pub secs: f64,
    pub frames: usize,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

impl IngestLag {
    pub fn new(now: Instant) -> IngestLag {
        IngestLag { window_start: now, lags_ms: Vec::new() }
    }

    /// A frame stamped `t_ms` by its agent became durable at `now_ms` (both unix ms).
    pub fn durable(&mut self, now_ms: u64, t_ms: u64) {
        self.lags_ms.push(now_ms.saturating_sub(t_ms));
    }

    /// The window's summary once it is [`WINDOW`] old and saw frames; a new window starts.
    pub fn take_window(&mut self, now: Instant) -> Option<LagWindow> {
        let secs = now.saturating_duration_since(self.window_start);
        if secs < WINDOW || self.lags_ms.is_empty() {
            return None;
        }
        self.window_start = now;
        let mut lags = std::mem::take(&mut self.lags_ms);
        lags.sort_unstable();
        let at = |p: f64| crate::analysis::nearest_rank(&lags, p).unwrap_or(0);
        Some(LagWindow {
            secs: secs.as_secs_f64(),
            frames: lags.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        })
    }
}

impl std::fmt::Display for LagWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ingest over {:.1} s: {} frames ({:.0}/s), agent-to-store lag p50 {} ms, p99 {} ms, max {} ms",
            self.secs,
            self.frames,
            self.frames as f64 / self.secs.max(1e-9),
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_summarises_the_lags_it_saw_once_it_is_old_enough() {
        let t0 = Instant::now();
        let mut lag = IngestLag::new(t0);
        for ms in 1..=100 {
            lag.durable(1_000 + ms, 1_000);
        }
        assert_eq!(lag.take_window(t0 + WINDOW / 2), None, "not before the window ends");
        let w = lag.take_window(t0 + WINDOW).expect("a window");
        assert_eq!((w.frames, w.p50_ms, w.p99_ms, w.max_ms), (100, 51, 99, 100));
        assert_eq!(
            w.to_string(),
            "ingest over 10.0 s: 100 frames (10/s), agent-to-store lag p50 51 ms, p99 99 ms, max 100 ms"
        );
        // A clock behind the agent's counts as no lag, and an empty window says nothing.
        lag.durable(5, 10);
        assert_eq!(lag.take_window(t0 + WINDOW * 2).map(|w| w.max_ms), Some(0));
        assert_eq!(lag.take_window(t0 + WINDOW * 4), None);
    }
}
