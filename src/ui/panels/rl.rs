//! The RL signals side by side: the reward, the KL to the reference, the completion length and
//! the held-out exact match, then, as room allows, each reward function's mean, the reward's
//! spread, the entropy and the clipped ratios: each a chart of its own (mean over ranks, min–max
//! band) with the chart panel's toggles (ema, log-y, axis, per-rank). Which logged names those
//! are is one table, `NAMES`.
use crate::ui::model::RunModel;
use crate::ui::panels::chart::{self, ChartView};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};

/// A chart of the panel; the order is the reading order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Series {
    Reward,
    Kl,
    CompletionLength,
    ExactMatch,
    /// One chart per reward function.
    FunctionReward,
    RewardStd,
    Entropy,
    /// The share of completion tokens whose policy ratio was clipped.
    ClipRatio,
    /// The share of completions cut at the length limit.
    Truncated,
}

/// The logged names each chart reads, once for every framework that logs them: TRL's
/// `GRPOTrainer` and `RLOOTrainer` (0.17 → 1.16, `self._metrics[mode][NAME]` in
/// `trl/trainer/grpo_trainer.py`), whose names Flightdeck's own GRPO worker copies
/// (`src/worker/grpo.rs`), TRL 0.14–0.16 GRPO's older ones, and the worker's own. `*` is a
/// reward function's name (its `__name__`). A run with two names of one chart gets the first.
pub const NAMES: [(&str, Series); 11] = [
    ("reward", Series::Reward),
    ("kl", Series::Kl),
    ("completions/mean_length", Series::CompletionLength),
    ("completion_length", Series::CompletionLength),
    ("eval/exact_match", Series::ExactMatch),
    ("rewards/*/mean", Series::FunctionReward),
    ("reward_std", Series::RewardStd),
    ("entropy", Series::Entropy),
    ("clip_ratio/region_mean", Series::ClipRatio),
    ("clip_ratio", Series::ClipRatio),
    ("completions/clipped_ratio", Series::Truncated),
];

/// Charts shown before a run has logged any of `NAMES`: the first four series' first names.
const WAITING: usize = 4;
/// Below this width a chart is too narrow to read: the charts stack instead.
const MIN_CHART_COLS: u16 = 24;
/// A third column and more only where each keeps this width.
const MIN_MORE_COLS: u16 = 32;
/// Rows of charts beyond two (one column: four) only where each keeps this height.
const MIN_CHART_ROWS: u16 = 6;

pub fn render(model: Option<&RunModel>, view: &ChartView, focused: bool, area: Rect, buf: &mut Buffer) {
    let logged: Vec<&str> = model.map(|m| m.metrics.keys().map(String::as_str).collect()).unwrap_or_default();
    let charts = charts(&logged);
    for (metric, rect) in charts.iter().zip(cells(area, charts.len())) {
        chart::render_metric(model, view, metric, None, focused, rect, buf);
    }
}

/// The names to chart among a run's `logged` ones, in `Series` order: each series' first name
/// in `NAMES` that the run logged (every function's, for the per-function rewards); until the
/// run has logged any, the first `WAITING` series' first names.
pub fn charts(logged: &[&str]) -> Vec<String> {
    let mut out: Vec<(Series, String)> = Vec::new();
    for (pattern, series) in NAMES {
        if out.iter().any(|(s, _)| *s == series && series != Series::FunctionReward) {
            continue;
        }
        match pattern.split_once('*') {
            Some((head, tail)) => out.extend(
                logged
                    .iter()
                    .filter(|n| n.len() > head.len() + tail.len() && n.starts_with(head) && n.ends_with(tail))
                    .filter(|n| !n[head.len()..n.len() - tail.len()].contains('/'))
                    .map(|n| (series, n.to_string())),
            ),
            None if logged.contains(&pattern) => out.push((series, pattern.to_string())),
            None => {}
        }
    }
    if out.is_empty() {
        let mut first: Vec<(Series, &str)> = Vec::new();
        for (pattern, series) in NAMES {
            if !pattern.contains('*') && !first.iter().any(|(s, _)| *s == series) {
                first.push((series, pattern));
            }
        }
        return first.into_iter().take(WAITING).map(|(_, n)| n.to_string()).collect();
    }
    out.sort_by_key(|(s, _)| *s);
    out.into_iter().map(|(_, n)| n).collect()
}

/// Where `n` charts go, row by row: up to four two by two where each keeps `MIN_CHART_COLS`
/// (else one column of four); more take further columns of `MIN_MORE_COLS` and rows of
/// `MIN_CHART_ROWS` where the area has them. Fewer cells than `n` where it has not.
fn cells(area: Rect, n: usize) -> Vec<Rect> {
    let split = |r: Rect, k: u16, rows: bool| -> Vec<Rect> {
        let c = vec![Constraint::Ratio(1, u32::from(k)); usize::from(k)];
        let l = if rows { Layout::vertical(c) } else { Layout::horizontal(c) };
        l.split(r).to_vec()
    };
    let wide = area.width >= 2 * MIN_CHART_COLS;
    let (cols, rows) = if n <= WAITING {
        if wide {
            (2, 2)
        } else {
            (1, 4)
        }
    } else {
        let cols = if wide { (area.width / MIN_MORE_COLS).max(2) } else { 1 };
        let fit = (area.height / MIN_CHART_ROWS).max(if wide { 2 } else { 4 });
        let cols = cols.min(n as u16);
        (cols, fit.min((n as u16).div_ceil(cols)))
    };
    split(area, rows, true).into_iter().flat_map(|row| split(row, cols, false)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_charts_in_a_grid_when_wide_and_stacked_when_narrow() {
        let wide = cells(Rect::new(0, 0, 80, 20), 4);
        assert_eq!(wide.len(), 4);
        assert_eq!((wide[0].width, wide[0].height, wide[1].x), (40, 10, 40));
        let narrow = cells(Rect::new(0, 0, 40, 20), 4);
        // 48 columns still make two of 24.
        assert_eq!(cells(Rect::new(0, 0, 48, 20), 4)[1].x, 24);
        assert!(narrow.iter().all(|r| r.width == 40 && r.height == 5), "{narrow:?}");
    }

    #[test]
    fn more_charts_take_columns_and_rows_the_area_has_room_for() {
        // The rl layout's panel at 160×48 (96×20): three columns of 32, three rows of 6 or 7.
        let nine = cells(Rect::new(0, 0, 96, 20), 9);
        assert_eq!(nine.len(), 9);
        assert!(nine.iter().all(|r| r.width == 32 && (6..=7).contains(&r.height)), "{nine:?}");
        // Eight use the same grid; at 80×24 (48×10) only the first four have room.
        assert_eq!(cells(Rect::new(0, 0, 96, 20), 8).len(), 9);
        assert_eq!(cells(Rect::new(0, 0, 48, 10), 9).len(), 4);
        // Five in a wide, short area: one row of five.
        let five = cells(Rect::new(0, 0, 200, 14), 5);
        assert_eq!((five.len(), five[0].width, five[0].height), (5, 40, 14));
    }

    #[test]
    fn trls_names_become_the_panels_charts_once_each_in_reading_order() {
        // What TRL 1.16's GRPOTrainer logs with reward functions `correct` and `short`.
        let trl = [
            "clip_ratio/high_max",
            "clip_ratio/low_mean",
            "clip_ratio/region_mean",
            "completions/clipped_ratio",
            "completions/mean_length",
            "completions/mean_terminated_length",
            "entropy",
            "frac_reward_zero_std",
            "kl",
            "loss",
            "reward",
            "reward_std",
            "rewards/correct/mean",
            "rewards/correct/std",
            "rewards/short/mean",
        ];
        assert_eq!(
            charts(&trl),
            [
                "reward",
                "kl",
                "completions/mean_length",
                "rewards/correct/mean",
                "rewards/short/mean",
                "reward_std",
                "entropy",
                "clip_ratio/region_mean",
                "completions/clipped_ratio"
            ]
        );
        // Flightdeck's own GRPO worker: the held-out exact match fourth, its `clip_ratio`.
        let worker = ["clip_ratio", "completions/mean_length", "eval/exact_match", "kl", "reward", "reward_std"];
        assert_eq!(
            charts(&worker),
            ["reward", "kl", "completions/mean_length", "eval/exact_match", "reward_std", "clip_ratio"]
        );
        // TRL 0.14–0.16: `completion_length`; a name with a slash in the function's place is not one.
        assert_eq!(charts(&["completion_length", "reward", "rewards/a/b/mean"]), ["reward", "completion_length"]);
        // Before anything is logged, the four headline charts wait.
        assert_eq!(charts(&["loss"]), ["reward", "kl", "completions/mean_length", "eval/exact_match"]);
    }
}
