//! Where a GRPO step's time goes: one column per span of steps, stacked bottom to top by the
//! share of generation, scoring, the reference pass and the update (mean over ranks), with the
//! newest step's split in the title.
use crate::ui::fmt;
use crate::ui::model::RunModel;
use crate::ui::series::Agg;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

/// (metric, label, short label, fill, colour), bottom to top: readable by fill without colour.
const PARTS: [(&str, &str, &str, char, Color); 4] = [
    ("time/generate_ms", "generate", "gen", '█', Color::Cyan),
    ("time/score_ms", "score", "scr", '▓', Color::Yellow),
    ("time/reference_ms", "reference", "ref", '▒', Color::Magenta),
    ("time/update_ms", "update", "upd", '░', Color::Green),
];

pub fn render(model: Option<&RunModel>, focused: bool, area: Rect, buf: &mut Buffer) {
    let series: Vec<_> = PARTS.iter().map(|p| model.and_then(|m| m.metrics.get(p.0))).collect();
    let last: Vec<f64> = series.iter().map(|s| s.and_then(|s| s.cross.last()).map_or(0.0, Agg::mean)).collect();
    let total: f64 = last.iter().sum();
    let extra = match total > 0.0 {
        true => format!("{} per step", fmt::duration_ms(total.round() as u64)),
        false => String::new(),
    };
    let block = fmt::panel_block(fmt::title("time split", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(generate) = series[0] else {
        Paragraph::new(Line::styled("no rollouts yet (a grpo run's steps split their time here)", fmt::dim()))
            .render(inner, buf);
        return;
    };
    if inner.height < 2 || inner.width < 4 {
        return;
    }
    // The legend: each part's share of the newest step, as long as the width allows.
    let shares: Vec<f64> = last.iter().map(|v| if total > 0.0 { 100.0 * v / total } else { 0.0 }).collect();
    let legend = legend(&shares, inner.width as usize);
    let legend_row = Rect { y: inner.bottom() - 1, height: 1, ..inner };
    Paragraph::new(legend).render(legend_row, buf);
    let plot = Rect { height: inner.height - 1, ..inner };
    let entries = generate.cross.entries();
    let (Some(first), Some(newest)) = (entries.first(), entries.last()) else { return };
    let span = (newest.step.saturating_sub(first.first) + 1) as usize;
    let ncols = (plot.width as usize).min(span.max(1));
    let (x0, x1) = (first.first as f64, (newest.step as f64).max(first.first as f64 + 1.0));
    let x_of = |s: u64| s as f64;
    let columns: Vec<Vec<Option<Agg>>> =
        series.iter().map(|s| s.map_or(vec![None; ncols], |s| s.cross.columns(ncols, x0, x1, &x_of))).collect();
    // A span of steps per column when they outnumber the columns, else each step as wide as
    // the width allows: the bars always fill the panel.
    for x in 0..plot.width as usize {
        let c = x * ncols / plot.width as usize;
        let values: Vec<f64> = columns.iter().map(|col| col[c].map_or(0.0, |a| a.mean().max(0.0))).collect();
        let heights = stack(&values, plot.height);
        let mut y = plot.bottom();
        for (part, h) in PARTS.iter().zip(heights) {
            for _ in 0..h {
                y -= 1;
                buf[(plot.x + x as u16, y)].set_char(part.3).set_style(Style::new().fg(part.4));
            }
        }
    }
}

/// `██ generate 17%  ▓▓ score 0%  …`, with shorter labels, then none, where `width` is short.
fn legend(shares: &[f64], width: usize) -> Line<'static> {
    let tier = |t: usize| -> Vec<(String, String)> {
        PARTS
            .iter()
            .zip(shares)
            .map(|((_, label, short, fill, _), pct)| match t {
                0 => (format!("{fill}{fill}"), format!(" {label} {pct:.0}%  ")),
                1 => (fill.to_string(), format!(" {short} {pct:.0}% ")),
                _ => (fill.to_string(), format!("{pct:.0}% ")),
            })
            .collect()
    };
    let len = |t: &Vec<(String, String)>| t.iter().map(|(f, b)| f.chars().count() + b.chars().count()).sum::<usize>();
    let chosen = (0..3).map(tier).find(|t| len(t) <= width + 2).unwrap_or_else(|| tier(2));
    let spans: Vec<Span> = PARTS
        .iter()
        .zip(chosen)
        .flat_map(|(part, (fills, body))| [Span::styled(fills, Style::new().fg(part.4)), Span::raw(body)])
        .collect();
    Line::from(spans)
}

/// Whole-cell heights of `values`' shares of `rows`, largest remainders first, summing to
/// `rows` (nothing when every value is 0).
fn stack(values: &[f64], rows: u16) -> Vec<u16> {
    let total: f64 = values.iter().sum();
    if total <= 0.0 {
        return vec![0; values.len()];
    }
    let exact: Vec<f64> = values.iter().map(|v| v / total * f64::from(rows)).collect();
    let mut heights: Vec<u16> = exact.iter().map(|e| e.floor() as u16).collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let short = rows - heights.iter().sum::<u16>();
    for &i in order.iter().take(short as usize) {
        heights[i] += 1;
    }
    heights
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_become_whole_cells_that_fill_the_column() {
        assert_eq!(super::stack(&[3.0, 0.0, 1.0, 6.0], 10), vec![3, 0, 1, 6]);
        assert_eq!(super::stack(&[1.0, 1.0, 1.0], 10).iter().sum::<u16>(), 10);
        assert_eq!(super::stack(&[0.0, 0.0], 5), vec![0, 0]);
        // A sliver still shows when its remainder is the largest.
        assert_eq!(super::stack(&[0.4, 9.6], 10), vec![0, 10]);
        assert_eq!(super::stack(&[0.6, 9.4], 10), vec![1, 9]);
    }

    #[test]
    fn the_legend_shortens_to_fit_and_keeps_every_part() {
        let text = |w: usize| super::legend(&[17.0, 0.0, 18.0, 65.0], w).to_string();
        assert_eq!(text(80).trim_end(), "██ generate 17%  ▓▓ score 0%  ▒▒ reference 18%  ░░ update 65%");
        assert_eq!(text(40).trim_end(), "█ gen 17% ▓ scr 0% ▒ ref 18% ░ upd 65%");
        assert_eq!(text(24).trim_end(), "█17% ▓0% ▒18% ░65%");
    }
}
