//! What drawing costs on a live run: with `FLIGHTDECK_FRAME_STATS=FILE` the cockpit times every
//! frame it draws and samples its data queue at each tick, and writes the summary to FILE as one
//! JSON object when it quits. For measuring the cockpit on a real run (`bench-ui` replays a
//! synthetic one); off, it costs nothing.
use std::path::PathBuf;
use std::time::Duration;

/// The environment variable naming the summary's file.
pub const ENV: &str = "FLIGHTDECK_FRAME_STATS";

#[derive(Default)]
pub struct FrameStats {
    /// Each drawn frame's wall time, ms.
    pub frame_ms: Vec<f64>,
    /// Batches waiting in the data queue at each tick.
    pub backlog: Vec<usize>,
}

impl FrameStats {
    pub fn frame(&mut self, took: Duration) {
        self.frame_ms.push(took.as_secs_f64() * 1000.0);
    }

    pub fn queued(&mut self, batches: usize) {
        self.backlog.push(batches);
    }

    /// frames, p50/p99/max ms, and the backlog's mean in each half and its max: a backlog whose
    /// second half is above its first is falling behind.
    pub fn summary(&self) -> serde_json::Value {
        let mut ms = self.frame_ms.clone();
        ms.sort_by(f64::total_cmp);
        let half = self.backlog.len() / 2;
        let mean = |xs: &[usize]| xs.iter().sum::<usize>() as f64 / xs.len().max(1) as f64;
        serde_json::json!({
            "frames": ms.len(),
            "p50_ms": percentile(&ms, 0.5),
            "p99_ms": percentile(&ms, 0.99),
            "max_ms": ms.last().copied().unwrap_or(0.0),
            "backlog_first_half": mean(&self.backlog[..half]),
            "backlog_second_half": mean(&self.backlog[half..]),
            "backlog_max": self.backlog.iter().max().copied().unwrap_or(0),
        })
    }
}

/// The file to write at exit, when asked for.
pub fn requested() -> Option<PathBuf> {
    std::env::var_os(ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The value at fraction `p` of sorted `xs` (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    crate::analysis::nearest_rank(sorted, p).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_has_percentiles_and_both_halves_of_the_backlog() {
        let mut s = FrameStats::default();
        for ms in 1..=100 {
            s.frame(Duration::from_millis(ms));
        }
        for b in [0, 0, 2, 4] {
            s.queued(b);
        }
        let j = s.summary();
        assert_eq!(j["frames"], 100);
        assert_eq!(
            (j["p50_ms"].as_f64(), j["p99_ms"].as_f64(), j["max_ms"].as_f64()),
            (Some(51.0), Some(99.0), Some(100.0))
        );
        assert_eq!((j["backlog_first_half"].as_f64(), j["backlog_second_half"].as_f64()), (Some(0.0), Some(3.0)));
        assert_eq!(FrameStats::default().summary()["p99_ms"], 0.0);
    }
}
