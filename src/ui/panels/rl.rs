//! The RL signals side by side: the reward, the KL to the reference, the completion length and
//! the held-out exact match, each a chart of its own (mean over ranks, min–max band) with the
//! chart panel's toggles (ema, log-y, axis, per-rank).
use crate::ui::model::RunModel;
use crate::ui::panels::chart::{self, ChartView};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};

/// What a GRPO run is watched by, in reading order.
pub const METRICS: [&str; 4] = ["reward", "kl", "completions/mean_length", "eval/exact_match"];
/// Below this width a chart is too narrow to read: the charts stack instead.
const MIN_CHART_COLS: u16 = 24;

pub fn render(model: Option<&RunModel>, view: &ChartView, focused: bool, area: Rect, buf: &mut Buffer) {
    for (metric, rect) in METRICS.iter().zip(cells(area)) {
        chart::render_metric(model, view, metric, None, focused, rect, buf);
    }
}

/// Two by two where each chart keeps `MIN_CHART_COLS`, else one column of four.
fn cells(area: Rect) -> Vec<Rect> {
    let halves = |r: Rect, dir_rows: bool| -> Vec<Rect> {
        let c = [Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)];
        let l = if dir_rows { Layout::vertical(c) } else { Layout::horizontal(c) };
        l.split(r).to_vec()
    };
    if area.width >= 2 * MIN_CHART_COLS {
        halves(area, true).into_iter().flat_map(|row| halves(row, false)).collect()
    } else {
        Layout::vertical([Constraint::Ratio(1, 4); 4]).split(area).to_vec()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn four_charts_in_a_grid_when_wide_and_stacked_when_narrow() {
        let wide = super::cells(ratatui::layout::Rect::new(0, 0, 80, 20));
        assert_eq!(wide.len(), 4);
        assert_eq!((wide[0].width, wide[0].height, wide[1].x), (40, 10, 40));
        let narrow = super::cells(ratatui::layout::Rect::new(0, 0, 40, 20));
        // 48 columns still make two of 24.
        assert_eq!(super::cells(ratatui::layout::Rect::new(0, 0, 48, 20))[1].x, 24);
        assert!(narrow.iter().all(|r| r.width == 40 && r.height == 5), "{narrow:?}");
    }
}
