//! Rank × time heatmap of step time: one row per rank (or per group of ranks, showing the
//! group's slowest), one column per span of steps. A slow rank stands out as a row.
use crate::ui::fmt;
use crate::ui::model::{RunModel, STEP_TIME};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Widget};

/// Shades from fast to slow, by character (readable without colour) and colour.
const SHADES: [(char, Color); 5] =
    [('·', Color::Blue), ('░', Color::Cyan), ('▒', Color::Green), ('▓', Color::Yellow), ('█', Color::Red)];

pub fn render(model: Option<&RunModel>, focused: bool, area: Rect, buf: &mut Buffer) {
    let series = model.and_then(|m| m.metrics.get(STEP_TIME));
    let block = fmt::panel_block(fmt::title("step time", String::new()), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let (Some(model), Some(series)) = (model, series) else {
        Paragraph::new(Line::styled("no step times yet", fmt::dim())).render(inner, buf);
        return;
    };
    let (Some(first), Some(last)) = (series.cross.entries().first(), series.cross.entries().last()) else {
        return;
    };
    let grid = &model.step_grid;
    let label_w = 6u16;
    if inner.width <= label_w + 2 || inner.height < 2 || grid.used() == 0 {
        return;
    }
    let rows = inner.height as usize - 1; // the last line is the legend
                                          // One column per bucket (a bucket per step while the run is short) when the buckets fit,
                                          // drawn `cell_w` wide; else each column spans several buckets.
    let used = grid.used();
    let ncols = ((inner.width - label_w) as usize).min(used);
    let cell_w = ((inner.width - label_w) as usize / ncols).max(1);
    let world = grid.ranks().max(1);
    let group = world.div_ceil(rows.max(1));
    // cells[row][col]: the slowest mean step time of the row's ranks in that column, read from
    // the grid the model keeps as points arrive (not from every rank's series each frame).
    let buckets = |c: usize| c * used / ncols..(c + 1) * used / ncols;
    let cells: Vec<Vec<Option<f64>>> = (0..world)
        .step_by(group)
        .map(|a| {
            (0..ncols)
                .map(|c| (a..(a + group).min(world)).filter_map(|r| grid.mean(r, buckets(c))).reduce(f64::max))
                .collect()
        })
        .collect();
    let vals = cells.iter().flatten().flatten();
    let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    for (i, row) in cells.iter().enumerate().take(rows) {
        let y = inner.y + i as u16;
        let (a, b) = (i * group, ((i + 1) * group).min(world) - 1);
        let label = if a == b { format!("r{a}") } else { format!("{a}-{b}") };
        buf.set_string(inner.x, y, fmt::truncate(&label, label_w as usize - 1), fmt::dim());
        for (c, v) in row.iter().enumerate() {
            let Some(v) = v else { continue };
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
            let (ch, color) = SHADES[((t * (SHADES.len() - 1) as f64).round() as usize).min(SHADES.len() - 1)];
            for dx in 0..cell_w {
                if let Some(cell) = buf.cell_mut((inner.x + label_w + (c * cell_w + dx) as u16, y)) {
                    cell.set_char(ch).set_style(Style::new().fg(color));
                }
            }
        }
    }
    if lo <= hi {
        let legend =
            format!("{} ms {} {} ms · steps {}–{}", fmt::num(lo), shades(), fmt::num(hi), first.first, last.step);
        let y = inner.y + inner.height - 1;
        buf.set_string(inner.x, y, fmt::truncate(&legend, inner.width as usize), fmt::dim());
    }
}

fn shades() -> String {
    SHADES.iter().map(|s| s.0).collect()
}
