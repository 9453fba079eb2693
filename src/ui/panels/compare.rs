//! The Compare screen: several runs' mean loss on one step axis, with a legend and a table.
use super::chart::{draw_plot, Trace};
use crate::ids::RunId;
use crate::store::RunRecord;
use crate::ui::fmt;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget};

const COLORS: [Color; 8] =
    [Color::Cyan, Color::Yellow, Color::Magenta, Color::Green, Color::LightRed, Color::Blue, Color::White, Color::Red];

#[derive(Clone, Debug)]
pub struct CompareRun {
    pub record: RunRecord,
    /// Mean loss over ranks per step; None until loaded.
    pub points: Option<Vec<(u64, f64)>>,
}

#[derive(Clone, Debug, Default)]
pub struct CompareView {
    pub runs: Vec<CompareRun>,
    pub log_y: bool,
}

impl CompareView {
    pub fn set_points(&mut self, run: &RunId, points: Vec<(u64, f64)>) {
        if let Some(r) = self.runs.iter_mut().find(|r| &r.record.id == run) {
            r.points = Some(points);
        }
    }
}

fn color(i: usize) -> Color {
    COLORS[i % COLORS.len()]
}

pub fn render_chart(view: &CompareView, focused: bool, area: Rect, buf: &mut Buffer) {
    let loaded = view.runs.iter().filter(|r| r.points.is_some()).count();
    let extra =
        format!("mean over ranks · {loaded}/{} runs{}", view.runs.len(), if view.log_y { " · log-y" } else { "" });
    let block = fmt::panel_block(fmt::title("loss", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    // Legend on the first line, the plot below.
    let legend: Vec<Span> = view
        .runs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            [
                Span::styled("━━ ", Style::new().fg(color(i))),
                Span::raw(format!("{}  ", fmt::truncate(&r.record.name, 16))),
            ]
        })
        .collect();
    Paragraph::new(Line::from(legend)).render(Rect { height: 1.min(inner.height), ..inner }, buf);
    let all = view.runs.iter().filter_map(|r| r.points.as_ref()).flatten();
    let ty = |v: f64| if view.log_y { (v > 0.0).then(|| v.log10()) } else { Some(v) };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(s, v) in all {
        let Some(y) = ty(v) else { continue };
        x0 = x0.min(s as f64);
        x1 = x1.max(s as f64);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let gutter = 8u16;
    if x0 > x1 || inner.height < 4 || inner.width <= gutter + 4 {
        return;
    }
    let plot = Rect { x: inner.x + gutter, y: inner.y + 1, width: inner.width - gutter, height: inner.height - 2 };
    let ncols = plot.width as usize * 2;
    let x1 = x1.max(x0 + 1.0);
    let traces: Vec<Trace> = view
        .runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let pts = r.points.as_ref()?;
            // One point per braille column: the column's last value (min/max would need a band).
            let mut cols: Vec<Option<(f64, f64)>> = vec![None; ncols];
            for &(s, v) in pts {
                let Some(y) = ty(v) else { continue };
                let c = (((s as f64 - x0) / (x1 - x0)) * ncols as f64).floor() as usize;
                cols[c.min(ncols - 1)] = Some((s as f64, y));
            }
            Some(Trace { points: cols.into_iter().flatten().collect(), color: color(i) })
        })
        .collect();
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    draw_plot(&[], &traces, [x0, x1], [y0 - pad, y1 + pad], plot, buf);
    let uy = |v: f64| if view.log_y { 10f64.powf(v) } else { v };
    buf.set_string(inner.x, plot.y, fmt::truncate(&fmt::num(uy(y1 + pad)), 7), fmt::dim());
    buf.set_string(inner.x, plot.y + plot.height - 1, fmt::truncate(&fmt::num(uy(y0 - pad)), 7), fmt::dim());
    let by = inner.y + inner.height - 1;
    buf.set_string(plot.x, by, format!("step {}", x0), fmt::dim());
    let right = format!("{x1}");
    buf.set_string((plot.x + plot.width).saturating_sub(right.len() as u16), by, right, fmt::dim());
}

pub fn render_table(view: &CompareView, focused: bool, area: Rect, buf: &mut Buffer) {
    let block = fmt::panel_block(fmt::title("runs", String::new()), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let header =
        Row::new(["", "NAME", "STATUS", "STEP", "LAST LOSS", "MIN LOSS", "ID"].map(Cell::from)).style(fmt::dim());
    let rows = view.runs.iter().enumerate().map(|(i, r)| {
        let last = r.points.as_ref().and_then(|p| p.last()).map(|p| p.1);
        let min = r.points.as_ref().and_then(|p| p.iter().map(|p| p.1).reduce(f64::min));
        Row::new([
            Cell::from("━━").style(Style::new().fg(color(i))),
            Cell::from(fmt::truncate(&r.record.name, 14)),
            Cell::from(r.record.status.name()).style(fmt::status_style(r.record.status)),
            Cell::from(format!("{}/{}", r.record.step, r.record.steps_planned)),
            Cell::from(if r.points.is_some() { fmt::opt_num(last) } else { "loading".into() }),
            Cell::from(fmt::opt_num(min)),
            Cell::from(r.record.id.to_string()),
        ])
    });
    let widths = [2, 14, 11, 11, 10, 10, 20].map(Constraint::Length);
    Table::new(rows, widths).header(header).render(inner, buf);
}
