//! The metric chart: mean over ranks with the min–max band across ranks, optional per-rank
//! lines, EMA smoothing, log-y, and a step or wall-clock axis. Min/max per column plus the last
//! value, so a spike stays visible at any zoom.
use crate::ui::action::Action;
use crate::ui::fmt;
use crate::ui::model::{wall_of, RunModel};
use crate::ui::series::Agg;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::canvas::{Canvas, Line as CLine};
use ratatui::widgets::{Paragraph, Widget};

/// Per-rank lines drawn at most (the first ranks); more would be noise.
const MAX_RANK_LINES: usize = 8;
const RANK_COLORS: [Color; 8] = [
    Color::Yellow,
    Color::Magenta,
    Color::Green,
    Color::Blue,
    Color::LightRed,
    Color::LightCyan,
    Color::White,
    Color::Red,
];
/// EMA weight of each new point (W&B-style, debiased at the start).
const EMA_ALPHA: f64 = 0.2;

#[derive(Clone, Debug, Default)]
pub struct ChartView {
    pub metric: usize,
    pub ema: bool,
    pub log_y: bool,
    pub wall: bool,
    pub per_rank: bool,
}

impl ChartView {
    pub fn on_action(&mut self, a: Action, model: Option<&RunModel>) -> bool {
        match a {
            Action::ToggleEma => self.ema = !self.ema,
            Action::ToggleLogY => self.log_y = !self.log_y,
            Action::ToggleAxis => self.wall = !self.wall,
            Action::TogglePerRank => self.per_rank = !self.per_rank,
            Action::NextMetric => {
                let n = model.map(|m| m.metrics.len()).unwrap_or(1).max(1);
                self.metric = (self.metric + 1) % n;
            }
            _ => return false,
        }
        true
    }

    fn flags(&self) -> String {
        let mut f = Vec::new();
        if self.ema {
            f.push("ema");
        }
        if self.log_y {
            f.push("log-y");
        }
        f.push(if self.wall { "x: wall s" } else { "x: step" });
        if self.per_rank {
            f.push("per-rank");
        }
        f.join(" ")
    }
}

/// A resumed run's lineage before it: the mean loss over ranks of its parent up to the resume
/// step, and of each earlier attempt up to the step its child resumed from, drawn before the
/// child's own steps on the same step axis, with every resume step marked.
#[derive(Clone, Debug, PartialEq)]
pub struct ParentLoss {
    pub parent: crate::ids::RunId,
    /// The checkpoint step the child started from (it trains `step + 1` onwards).
    pub step: u64,
    pub points: Vec<(u64, f64)>,
    /// Every resume (or restart) step of the lineage, ascending; `step` is the last.
    pub marks: Vec<u64>,
}

/// The lineage's line and the resume markers.
const PARENT_COLOR: Color = Color::LightMagenta;
const RESUME_COLOR: Color = Color::Yellow;

/// One line of the plot: points (x, y) already transformed.
pub struct Trace {
    pub points: Vec<(f64, f64)>,
    pub color: Color,
}

pub fn render(
    model: Option<&RunModel>,
    view: &ChartView,
    parent: Option<&ParentLoss>,
    focused: bool,
    area: Rect,
    buf: &mut Buffer,
) {
    let names = model.map(|m| m.metric_names()).unwrap_or_default();
    let metric = names.get(view.metric % names.len().max(1)).cloned().unwrap_or_else(|| "loss".into());
    render_metric(model, view, &metric, parent, focused, area, buf);
}

/// The chart of one named metric (the `rl` panel's fixed charts), with `view`'s toggles.
pub fn render_metric(
    model: Option<&RunModel>,
    view: &ChartView,
    metric: &str,
    parent: Option<&ParentLoss>,
    focused: bool,
    area: Rect,
    buf: &mut Buffer,
) {
    let metric = metric.to_string();
    let series = model.and_then(|m| m.metrics.get(&metric));
    let last = series.and_then(|s| s.cross.last()).copied();
    let mut extra = match last {
        Some(a) => format!("mean {} · step {} · {}", fmt::metric_value(&metric, a.mean()), a.step, view.flags()),
        None => view.flags(),
    };
    // The parent's loss shares the step axis only (its wall times are another run's).
    let parent = parent.filter(|p| metric == "loss" && !view.wall && !p.points.is_empty());
    if let Some(p) = parent {
        extra.push_str(&format!(" · ↳ resumed {}@{}", p.parent, p.step));
        if p.marks.len() > 1 {
            extra.push_str(&format!(" · {} resumes", p.marks.len()));
        }
    }
    let block = fmt::panel_block(fmt::title(&metric, extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let (Some(model), Some(series)) = (model, series) else {
        Paragraph::new(Line::styled("waiting for the first step…", fmt::dim())).render(inner, buf);
        return;
    };
    let table = if view.wall { model.wall_axis() } else { Vec::new() };
    let x_of = |s: u64| if view.wall { wall_of(&table, s) } else { s as f64 };
    let entries = series.cross.entries();
    let (Some(first), Some(lastp)) = (entries.first(), entries.last()) else {
        return;
    };
    let start = parent.and_then(|p| p.points.first()).map_or(x_of(first.first), |p| x_of(first.first).min(p.0 as f64));
    let (x0, x1) = (start, x_of(lastp.step).max(start + 1.0));
    // A size's labels (`177.4 MiB`) need a wider gutter than a plain number's.
    let gutter = if crate::units::is_size_metric(&metric) { 11u16 } else { 8u16 };
    if inner.width <= gutter + 4 || inner.height < 3 {
        Paragraph::new(format!("{} {}", metric, fmt::metric_value(&metric, lastp.mean()))).render(inner, buf);
        return;
    }
    let plot = Rect { x: inner.x + gutter, y: inner.y, width: inner.width - gutter, height: inner.height - 1 };
    // Braille: two dots per cell across.
    let ncols = plot.width as usize * 2;
    let ty = |v: f64| if view.log_y { (v > 0.0).then(|| v.log10()) } else { Some(v) };
    let cols = series.cross.columns(ncols, x0, x1, &x_of);
    let col_x = |i: usize| x0 + (x1 - x0) * (i as f64 + 0.5) / ncols as f64;
    let band: Vec<(f64, f64, f64)> =
        cols.iter().enumerate().filter_map(|(i, c)| c.and_then(|a| Some((col_x(i), ty(a.min)?, ty(a.max)?)))).collect();
    let mut mean: Vec<(f64, f64)> =
        cols.iter().enumerate().filter_map(|(i, c)| c.and_then(|a: Agg| Some((col_x(i), ty(a.mean())?)))).collect();
    if view.ema {
        ema(&mut mean);
    }
    let mut traces = Vec::new();
    if view.per_rank {
        for (r, s) in series.per_rank.iter().take(MAX_RANK_LINES).enumerate() {
            let c = s.columns(ncols, x0, x1, &x_of);
            let mut pts: Vec<(f64, f64)> =
                c.iter().enumerate().filter_map(|(i, c)| c.and_then(|a| Some((col_x(i), ty(a.mean())?)))).collect();
            if view.ema {
                ema(&mut pts);
            }
            traces.push(Trace { points: pts, color: RANK_COLORS[r % RANK_COLORS.len()] });
        }
    }
    if let Some(p) = parent {
        // One point per braille column: the column's last value.
        let mut cols: Vec<Option<(f64, f64)>> = vec![None; ncols];
        for &(s, v) in &p.points {
            let Some(y) = ty(v) else { continue };
            let c = (((s as f64 - x0) / (x1 - x0)) * ncols as f64).floor().max(0.0) as usize;
            cols[c.min(ncols - 1)] = Some((s as f64, y));
        }
        traces.push(Trace { points: cols.into_iter().flatten().collect(), color: PARENT_COLOR });
    }
    let ys = band.iter().flat_map(|b| [b.1, b.2]).chain(traces.iter().flat_map(|t| t.points.iter().map(|p| p.1)));
    let (mut y0, mut y1) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if y0 > y1 {
        return;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    y0 -= pad;
    y1 += pad;
    if let Some(p) = parent {
        let direct = (!p.marks.contains(&p.step)).then_some(p.step);
        for step in p.marks.iter().copied().chain(direct) {
            let x = step as f64;
            traces.insert(0, Trace { points: vec![(x, y0), (x, y1)], color: RESUME_COLOR });
        }
    }
    traces.push(Trace { points: mean, color: Color::Cyan });
    draw_plot(&band, &traces, [x0, x1], [y0, y1], plot, buf);
    // Axis labels: y at top and bottom of the gutter, x below the plot.
    let uy = |v: f64| if view.log_y { 10f64.powf(v) } else { v };
    let label = |s: String| fmt::truncate(&s, gutter as usize - 1);
    buf.set_string(inner.x, plot.y, label(fmt::metric_value(&metric, uy(y1))), fmt::dim());
    buf.set_string(inner.x, plot.y + plot.height - 1, label(fmt::metric_value(&metric, uy(y0))), fmt::dim());
    let unit = if view.wall { "s" } else { "" };
    let x_label = |x: f64| if view.wall { format!("{}{unit}", fmt::num(x)) } else { format!("{}", x.round() as u64) };
    let (left, right) = (x_label(x0), x_label(x1));
    let by = inner.y + inner.height - 1;
    buf.set_string(plot.x, by, &left, fmt::dim());
    let rx = (plot.x + plot.width).saturating_sub(right.chars().count() as u16);
    if rx > plot.x + left.chars().count() as u16 {
        buf.set_string(rx, by, &right, fmt::dim());
    }
    if let Some(p) = parent {
        // Each resume step of the lineage, oldest first, so the newest (the run's own) is on top
        // where labels would overlap.
        let direct = (!p.marks.contains(&p.step)).then_some(p.step);
        for step in p.marks.iter().copied().chain(direct) {
            let at = ((step as f64 - x0) / (x1 - x0) * f64::from(plot.width)) as u16;
            let label = format!("↳{step}");
            let lx = (plot.x + at.min(plot.width.saturating_sub(1)))
                .min((plot.x + plot.width).saturating_sub(label.chars().count() as u16));
            buf.set_string(lx, by, &label, ratatui::style::Style::new().fg(RESUME_COLOR));
        }
    }
}

/// Smooths a line in place (exponential moving average, debiased).
fn ema(points: &mut [(f64, f64)]) {
    let mut acc = 0.0;
    let mut weight = 0.0;
    for p in points.iter_mut() {
        acc = acc * (1.0 - EMA_ALPHA) + p.1 * EMA_ALPHA;
        weight = weight * (1.0 - EMA_ALPHA) + EMA_ALPHA;
        p.1 = acc / weight;
    }
}

/// Draws a min–max band (dim vertical strokes) and lines on a braille canvas.
pub fn draw_plot(band: &[(f64, f64, f64)], traces: &[Trace], xb: [f64; 2], yb: [f64; 2], area: Rect, buf: &mut Buffer) {
    Canvas::default()
        .marker(Marker::Braille)
        .x_bounds(xb)
        .y_bounds(yb)
        .paint(|ctx| {
            for &(x, lo, hi) in band {
                ctx.draw(&CLine { x1: x, y1: lo, x2: x, y2: hi, color: Color::DarkGray });
            }
            ctx.layer();
            for t in traces {
                for w in t.points.windows(2) {
                    ctx.draw(&CLine { x1: w[0].0, y1: w[0].1, x2: w[1].0, y2: w[1].1, color: t.color });
                }
                if let [only] = t.points.as_slice() {
                    ctx.draw(&CLine { x1: only.0, y1: only.1, x2: only.0, y2: only.1, color: t.color });
                }
            }
        })
        .render(area, buf);
}
