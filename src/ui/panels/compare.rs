//! The Compare screen: several runs' mean loss on one step axis, with a legend and a table.
//! Opened on a sweep, the table has one row per point with its swept values, sortable (`o`)
//! by point, last loss, lowest loss or any swept key.
use super::chart::{draw_plot, Trace};
use crate::ids::RunId;
use crate::record::SweepStatus;
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
    /// The lineage's goodput (productive ÷ wall) once the run has ended and it is loaded.
    pub goodput: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct CompareView {
    pub runs: Vec<CompareRun>,
    pub log_y: bool,
    /// The sweep the screen was opened on (its keys and each point's values), once loaded.
    pub sweep: Option<SweepStatus>,
    pub sort: CompareSort,
    pub reverse: bool,
}

/// The table's order: as opened (a sweep's point order), by a loss, or by a swept key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompareSort {
    #[default]
    Opened,
    LastLoss,
    MinLoss,
    /// The sweep's key at this index.
    Key(usize),
}

impl CompareView {
    pub fn set_points(&mut self, run: &RunId, points: Vec<(u64, f64)>) {
        if let Some(r) = self.runs.iter_mut().find(|r| &r.record.id == run) {
            r.points = Some(points);
        }
    }

    pub fn set_goodput(&mut self, run: &RunId, ratio: Option<f64>) {
        if let Some(r) = self.runs.iter_mut().find(|r| &r.record.id == run) {
            r.goodput = ratio;
        }
    }

    /// `o`: the next column to sort by (the swept keys only on a sweep).
    pub fn next_sort(&mut self) {
        let keys = self.sweep.as_ref().map_or(0, |s| s.sweep.keys.len());
        self.sort = match self.sort {
            CompareSort::Opened => CompareSort::LastLoss,
            CompareSort::LastLoss => CompareSort::MinLoss,
            CompareSort::MinLoss if keys > 0 => CompareSort::Key(0),
            CompareSort::Key(k) if k + 1 < keys => CompareSort::Key(k + 1),
            _ => CompareSort::Opened,
        };
    }

    fn sort_name(&self) -> String {
        let name = match self.sort {
            CompareSort::Opened if self.sweep.is_none() && !self.reverse => return String::new(),
            CompareSort::Opened if self.sweep.is_none() => "marking order".to_string(),
            CompareSort::Opened => "point".to_string(),
            CompareSort::LastLoss => "last loss".to_string(),
            CompareSort::MinLoss => "min loss".to_string(),
            CompareSort::Key(k) => self.sweep.as_ref().and_then(|s| s.sweep.keys.get(k).cloned()).unwrap_or_default(),
        };
        format!("sorted by {name}{}", if self.reverse { " (reversed)" } else { "" })
    }

    /// Run `i`'s swept values (TOML text), when the screen shows a sweep.
    fn values(&self, i: usize) -> Option<&[String]> {
        let point = self.runs[i].record.sweep.as_ref()?.point as usize;
        Some(&self.sweep.as_ref()?.sweep.points.get(point)?.values)
    }

    /// Row order of the table (indices into `runs`, whose colours stay the chart's).
    pub fn order(&self) -> Vec<usize> {
        let last = |i: usize| self.runs[i].points.as_ref().and_then(|p| p.last()).map(|p| p.1);
        let min = |i: usize| self.runs[i].points.as_ref().and_then(|p| p.iter().map(|p| p.1).reduce(f64::min));
        // Missing losses sort last; a swept value sorts as a number when it reads as one.
        let num = |v: Option<f64>| v.filter(|v| v.is_finite()).unwrap_or(f64::INFINITY);
        let mut order: Vec<usize> = (0..self.runs.len()).collect();
        match self.sort {
            CompareSort::Opened => {}
            CompareSort::LastLoss => order.sort_by(|&a, &b| num(last(a)).total_cmp(&num(last(b)))),
            CompareSort::MinLoss => order.sort_by(|&a, &b| num(min(a)).total_cmp(&num(min(b)))),
            CompareSort::Key(k) => {
                let key = |i: usize| {
                    let text = self.values(i).and_then(|v| v.get(k)).cloned().unwrap_or_default();
                    (num(text.parse::<f64>().ok()), text)
                };
                order.sort_by(|&a, &b| {
                    let (ka, kb) = (key(a), key(b));
                    ka.0.total_cmp(&kb.0).then_with(|| ka.1.cmp(&kb.1))
                });
            }
        }
        if self.reverse {
            order.reverse();
        }
        order
    }
}

/// The newest run of each point of sweep `id` among `runs`, in point order.
pub fn sweep_runs(runs: &[RunRecord], id: &str) -> Vec<RunRecord> {
    let mut newest: std::collections::BTreeMap<u32, &RunRecord> = Default::default();
    for r in runs {
        let Some(p) = r.sweep.as_ref().filter(|p| p.sweep == id) else { continue };
        let slot = newest.entry(p.point).or_insert(r);
        if (r.created_ms, &r.id) > (slot.created_ms, &slot.id) {
            *slot = r;
        }
    }
    newest.into_values().cloned().collect()
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
    let (title, keys) = match &view.sweep {
        Some(s) => (format!("sweep {}", s.sweep.name), s.sweep.keys.clone()),
        None => ("runs".to_string(), Vec::new()),
    };
    let block = fmt::panel_block(fmt::title(&title, view.sort_name()), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let key_width = |k: usize| -> u16 {
        let widest = (0..view.runs.len()).filter_map(|i| view.values(i).and_then(|v| v.get(k)).map(String::len)).max();
        widest.unwrap_or(0).max(keys[k].len()).clamp(4, 16) as u16
    };
    let mut header = vec!["".to_string(), "NAME".to_string()];
    header.extend(keys.iter().map(|k| fmt::truncate(k, 16)));
    header.extend(["STATUS", "STEP", "LAST LOSS", "MIN LOSS", "GOODPUT", "ID"].map(String::from));
    let rows = view.order().into_iter().map(|i| {
        let r = &view.runs[i];
        let last = r.points.as_ref().and_then(|p| p.last()).map(|p| p.1);
        let min = r.points.as_ref().and_then(|p| p.iter().map(|p| p.1).reduce(f64::min));
        let mut cells =
            vec![Cell::from("━━").style(Style::new().fg(color(i))), Cell::from(fmt::truncate(&r.record.name, 14))];
        for k in 0..keys.len() {
            let v = view.values(i).and_then(|v| v.get(k)).map_or("-".to_string(), |v| fmt::truncate(v, 16));
            cells.push(Cell::from(v));
        }
        cells.extend([
            Cell::from(r.record.status.name()).style(fmt::status_style(r.record.status)),
            Cell::from(format!("{}/{}", r.record.step, r.record.steps_planned)),
            Cell::from(if r.points.is_some() { fmt::opt_num(last) } else { "loading".into() }),
            Cell::from(fmt::opt_num(min)),
            Cell::from(r.goodput.map_or("-".to_string(), goodput_bar)),
            Cell::from(r.record.id.to_string()),
        ]);
        Row::new(cells)
    });
    let mut widths = vec![Constraint::Length(2), Constraint::Length(14)];
    widths.extend((0..keys.len()).map(|k| Constraint::Length(key_width(k))));
    widths.extend([11, 11, 10, 10, 12, 20].map(Constraint::Length));
    Table::new(rows, widths).header(Row::new(header.into_iter().map(Cell::from)).style(fmt::dim())).render(inner, buf);
}

/// `██████░░ 78%`: goodput as an 8-cell bar and its percentage.
fn goodput_bar(ratio: f64) -> String {
    let r = ratio.clamp(0.0, 1.0);
    let full = (r * 8.0).round() as usize;
    format!("{}{} {:.0}%", "█".repeat(full), "░".repeat(8 - full), 100.0 * r)
}
