//! The report's charts, each drawn twice by the same code: SVG (exact, for the web) and PNG
//! (for anything that shows images). Text needs a TrueType font: DejaVu Sans from Debian's
//! fonts-dejavu-core (`scripts/install-deps.sh`), or the file `FLIGHTDECK_FONT` names.
use super::{across_ranks, bandwidth::Bandwidth, Options, ReportError, RunData, Series, Spread};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where a TrueType font is looked for, in order (after `FLIGHTDECK_FONT`).
const FONTS: [&str; 2] = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];
const SIZE: (u32, u32) = (960, 420);
/// Most columns the heatmap draws: steps are bucketed beyond this.
const HEATMAP_COLUMNS: usize = 160;
/// Nodes drawn as a line each on the GPU charts; past this, their mean with the min–max band.
const NODE_LINES: usize = 8;
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One chart the report embeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    pub title: String,
    /// The file stem: `STEM.svg` and `STEM.png`.
    pub stem: String,
}

/// What `draw_all` made, or why it made nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Charts {
    pub dir: PathBuf,
    pub drawn: Vec<Drawn>,
    pub missing_font: Option<String>,
}

impl Charts {
    pub fn files(&self) -> Vec<PathBuf> {
        self.drawn.iter().flat_map(|d| ["svg", "png"].map(|e| self.dir.join(format!("{}.{e}", d.stem)))).collect()
    }
}

/// What one chart shows.
enum Chart<'a> {
    /// Mean over ranks with the min–max band, and the step a resumed run started from; each
    /// rank's own line too when `per_rank`.
    Loss { run: &'a RunData, per_rank: bool },
    /// Ranks × steps, coloured by step time against the run's median.
    StepTimes(&'a RunData),
    /// Tokens per second over all ranks.
    Throughput(&'a RunData),
    /// One post-training metric's rank mean.
    Metric(&'a str, &'a Series),
    /// Each run's mean loss on one axis.
    CompareLoss(&'a [RunData]),
    /// Bus bandwidth against message size, a line per op.
    Bandwidth(&'a [Bandwidth]),
    /// GPU utilisation (`memory` false) or memory per node.
    Gpu { run: &'a RunData, memory: bool },
}

/// Registers the font once per process (the benchmark charts use it too); Err says what is
/// missing.
pub fn font() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let wanted: Vec<PathBuf> =
                std::env::var_os("FLIGHTDECK_FONT").map(PathBuf::from).into_iter().chain(FONTS.map(PathBuf::from)).collect();
            let Some(bytes) = wanted.iter().find_map(|p| std::fs::read(p).ok()) else {
                return Err(format!(
                    "no TrueType font for the charts' text (looked for {}; install fonts-dejavu-core or set FLIGHTDECK_FONT)",
                    wanted.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ));
            };
            // plotters keeps registered fonts for the process's life.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| "the font file is not a TrueType font".to_string())
        })
        .clone()
}

/// Every chart that `runs` have data for, into `dir`.
pub fn draw_all(dir: &Path, runs: &[RunData], options: Options) -> Result<Charts, ReportError> {
    let mut charts = Charts { dir: dir.to_path_buf(), ..Charts::default() };
    if let Err(why) = font() {
        charts.missing_font = Some(why);
        return Ok(charts);
    }
    let mut todo: Vec<(String, String, Chart)> = Vec::new();
    if runs.len() > 1 {
        todo.push(("Loss of each run (mean over ranks)".into(), "compare_loss".into(), Chart::CompareLoss(runs)));
    }
    for (i, run) in runs.iter().enumerate() {
        let tag = if runs.len() > 1 { format!("_{i}") } else { String::new() };
        let who = if runs.len() > 1 { format!(" ({})", run.name()) } else { String::new() };
        if run.loss.iter().any(|s| !s.is_empty()) {
            let chart = Chart::Loss { run, per_rank: options.per_rank };
            let thin = if options.per_rank { " (thin lines: each rank)" } else { "" };
            todo.push((format!("Loss{who}{thin}"), format!("loss{tag}"), chart));
        }
        if run.step_time_ms.iter().any(|s| !s.is_empty()) {
            todo.push((format!("Step time per rank{who}"), format!("step_time{tag}"), Chart::StepTimes(run)));
        }
        if run.tokens.iter().any(|s| !s.is_empty()) && run.step_time_ms.iter().any(|s| !s.is_empty()) {
            todo.push((format!("Throughput{who}"), format!("throughput{tag}"), Chart::Throughput(run)));
        }
        for (metric, series) in &run.extra {
            let stem = format!("{}{tag}", metric.replace(['/', ' '], "_"));
            todo.push((format!("{metric}{who}"), stem, Chart::Metric(metric, series)));
        }
        if !run.bandwidth.is_empty() {
            let title = format!("Collective bus bandwidth by size{who}");
            todo.push((title, format!("bandwidth{tag}"), Chart::Bandwidth(&run.bandwidth)));
        }
        if !run.gpu.is_empty() {
            todo.push((
                format!("GPU utilisation per node{who}"),
                format!("gpu_util{tag}"),
                Chart::Gpu { run, memory: false },
            ));
            todo.push((
                format!("GPU memory per node{who}"),
                format!("gpu_memory{tag}"),
                Chart::Gpu { run, memory: true },
            ));
        }
    }
    for (title, stem, chart) in todo {
        let svg = dir.join(format!("{stem}.svg"));
        let png = dir.join(format!("{stem}.png"));
        let fail = |path: &Path, e: String| ReportError::Draw { path: path.display().to_string(), reason: e };
        draw(&SVGBackend::new(&svg, SIZE).into_drawing_area(), &title, &chart).map_err(|e| fail(&svg, e))?;
        draw(&BitMapBackend::new(&png, SIZE).into_drawing_area(), &title, &chart).map_err(|e| fail(&png, e))?;
        charts.drawn.push(Drawn { title, stem });
    }
    Ok(charts)
}

/// An incident's picture: each rank's collective sequence number over the seconds before the
/// verdict (a step line, held flat to the verdict from its last entry), the culprits red and
/// thick: the rank whose line stopped first stands out. Writes `STEM.svg` and `STEM.png`.
pub fn progress(
    stem: &Path,
    title: &str,
    ranks: &[(u32, Vec<(f64, u64)>)],
    culprits: &[u32],
) -> Result<(), ReportError> {
    font().map_err(|why| ReportError::Draw { path: stem.display().to_string(), reason: why })?;
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    let fail = |path: &Path, e: String| ReportError::Draw { path: path.display().to_string(), reason: e };
    draw_progress(&SVGBackend::new(&svg, SIZE).into_drawing_area(), title, ranks, culprits)
        .map_err(|e| fail(&svg, e))?;
    let drawn = draw_progress(&BitMapBackend::new(&png, SIZE).into_drawing_area(), title, ranks, culprits);
    drawn.map_err(|e| fail(&png, e))
}

fn draw_progress<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    ranks: &[(u32, Vec<(f64, u64)>)],
    culprits: &[u32],
) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let points = ranks.iter().flat_map(|r| r.1.iter());
    let (mut t0, mut s0, mut s1) = (0f64, u64::MAX, 0u64);
    for &(t, s) in points {
        (t0, s0, s1) = (t0.min(t), s0.min(s), s1.max(s));
    }
    if s0 > s1 {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(t0.min(-1.0) * 1.05..0.5, s0.saturating_sub(1) as f64..(s1 + 1) as f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("seconds before the verdict")
        .y_desc("collective seq entered")
        .y_label_formatter(&|y| whole(*y))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    for (i, (rank, pts)) in ranks.iter().enumerate() {
        let culprit = culprits.contains(rank);
        let style = if culprit { RED.stroke_width(3) } else { PALETTE[i % PALETTE.len()].mix(0.8).stroke_width(1) };
        // A step line: each seq held until the next is entered, the last until the verdict.
        let mut line: Vec<(f64, f64)> = Vec::new();
        for (j, &(t, seq)) in pts.iter().enumerate() {
            line.push((t, seq as f64));
            let until = pts.get(j + 1).map_or(0.0, |p| p.0);
            line.push((until, seq as f64));
        }
        let label = if culprit { format!("rank {rank} (culprit)") } else { format!("rank {rank}") };
        chart
            .draw_series(LineSeries::new(line, style))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

type Drawing = Result<(), String>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, chart: &Chart) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    match chart {
        Chart::Loss { run, per_rank } => {
            let thin = if *per_rank { run.loss.as_slice() } else { &[] };
            let mean = [(run.name(), across_ranks(&run.loss))];
            lines(root, title, "loss", &mean, resume_step(run), thin)?
        }
        Chart::Throughput(run) => {
            let t = throughput(run);
            lines(root, title, "tokens/s", &[(run.name(), t)], None, &[])?;
        }
        Chart::Metric(metric, series) => {
            lines(root, title, metric, &[(metric.to_string(), flat(series))], None, &[])?;
        }
        Chart::CompareLoss(runs) => {
            let all: Vec<_> =
                runs.iter().map(|r| (format!("{} {}", r.name(), r.id()), across_ranks(&r.loss))).collect();
            lines(root, title, "loss", &all, None, &[])?;
        }
        Chart::StepTimes(run) => heatmap(root, title, &run.step_time_ms)?,
        Chart::Bandwidth(rows) => bandwidth(root, title, rows)?,
        Chart::Gpu { run, memory } => {
            let pick = |n: &super::NodeGpu| -> Series {
                if *memory {
                    n.mem_bytes.iter().map(|&(s, b)| (s, b / f64::from(1u32 << 30))).collect()
                } else {
                    n.util_pct.clone()
                }
            };
            let per_node: Vec<(String, Spread)> = if run.gpu.len() <= NODE_LINES {
                run.gpu.iter().map(|n| (n.host.clone(), flat(&pick(n)))).collect()
            } else {
                let all: Vec<Series> = run.gpu.iter().map(pick).collect();
                vec![(format!("mean of {} nodes (band: min–max)", run.gpu.len()), across_ranks(&all))]
            };
            let y = if *memory { "GiB used (fullest GPU)" } else { "utilisation % (mean of GPUs)" };
            lines(root, title, y, &per_node, None, &[])?;
        }
    }
    root.present().map_err(e)
}

/// An axis label for a whole number (steps, ranks): no `.0`.
fn whole(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        format!("{v:.1}")
    }
}

/// Where a resumed run started, to mark on its loss chart.
fn resume_step(run: &RunData) -> Option<u64> {
    run.detail.as_ref()?.run.resumed_from.as_ref().map(|r| r.step)
}

/// Tokens per second at each step: the ranks' tokens over the mean step time.
fn throughput(run: &RunData) -> Spread {
    let tokens = across_ranks(&run.tokens);
    let times: std::collections::BTreeMap<u64, f64> =
        across_ranks(&run.step_time_ms).into_iter().map(|p| (p.0, p.1)).collect();
    let ranks = run.tokens.iter().filter(|s| !s.is_empty()).count() as f64;
    tokens
        .into_iter()
        .filter_map(|(step, mean, _, _)| {
            let ms = *times.get(&step)?;
            let v = mean * ranks / (ms / 1000.0);
            (ms > 0.0).then_some((step, v, v, v))
        })
        .collect()
}

/// A series as a spread without a band.
fn flat(series: &Series) -> Spread {
    series.iter().map(|&(s, v)| (s, v, v, v)).collect()
}

/// One or more (label, [(step, mean, min, max)]) as lines with their min–max bands, over `thin`
/// lines without a legend (each rank's own).
fn lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    series: &[(String, Spread)],
    mark: Option<u64>,
    thin: &[Series],
) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let points = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (u64::MAX, 0u64, f64::INFINITY, f64::NEG_INFINITY);
    for &(s, _, lo, hi) in points {
        (x0, x1, y0, y1) = (x0.min(s), x1.max(s), y0.min(lo), y1.max(hi));
    }
    if x0 > x1 {
        return Ok(());
    }
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x0 as f64..(x1.max(x0 + 1)) as f64, (y0 - pad)..(y1 + pad))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .x_label_formatter(&|x| whole(*x))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    for (i, s) in thin.iter().enumerate() {
        let color = PALETTE[(i + 1) % PALETTE.len()].mix(0.45);
        let line = s.iter().filter(|p| p.1.is_finite()).map(|&(st, v)| (st as f64, v));
        chart.draw_series(LineSeries::new(line, color.stroke_width(1))).map_err(e)?;
    }
    for (i, (label, s)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if s.iter().any(|p| p.2 < p.3) {
            let band: Vec<(f64, f64)> =
                s.iter().map(|p| (p.0 as f64, p.3)).chain(s.iter().rev().map(|p| (p.0 as f64, p.2))).collect();
            chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.2)))).map_err(e)?;
        }
        let line = s.iter().map(|p| (p.0 as f64, p.1));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(e)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if let Some(step) = mark {
        let at = step as f64;
        let dashed = (0..20).map(|k| {
            let a = (y0 - pad) + (y1 - y0 + 2.0 * pad) * f64::from(k) / 20.0;
            PathElement::new(vec![(at, a), (at, a + (y1 - y0 + 2.0 * pad) / 40.0)], BLACK.stroke_width(1))
        });
        chart.draw_series(dashed).map_err(e)?.label(format!("resumed from step {step}"));
    }
    if series.len() > 1 || mark.is_some() {
        chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(e)?;
    }
    Ok(())
}

/// Bus bandwidth (GB/s) against message size on a log axis, a line with markers per op.
fn bandwidth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, rows: &[Bandwidth]) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (Some(lo), Some(hi)) = (rows.iter().map(|r| r.bytes).min(), rows.iter().map(|r| r.bytes).max()) else {
        return Ok(());
    };
    let positive = rows.iter().map(|r| r.busbw_gbps).filter(|b| *b > 0.0);
    let (y0, y1) = positive.fold((f64::INFINITY, 0f64), |(lo, hi), b| (lo.min(b), hi.max(b)));
    if y1 <= 0.0 {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(root)
        .caption(format!("{title} (median over ranks and steps)"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d((lo as f64 / 2.0..hi as f64 * 2.0).log_scale(), (y0 / 2.0..y1 * 2.0).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("bus bandwidth GB/s")
        .x_label_formatter(&|x| si_bytes(*x))
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    let mut ops: Vec<crate::record::CollectiveOp> = rows.iter().map(|r| r.op).collect();
    ops.dedup();
    for (i, op) in ops.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> =
            rows.iter().filter(|r| r.op == *op).map(|r| (r.bytes as f64, r.busbw_gbps)).collect();
        chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2))).map_err(e)?;
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(e)?
            .label(op.name())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(e)?;
    Ok(())
}

/// A log axis's tick as decimal bytes: `10 B`, `1 kB`, `100 MB` (the ticks fall on powers of
/// ten, which binary units would print as `97.7 KiB`).
fn si_bytes(x: f64) -> String {
    let (v, unit) = match x {
        x if x >= 1e9 => (x / 1e9, "GB"),
        x if x >= 1e6 => (x / 1e6, "MB"),
        x if x >= 1e3 => (x / 1e3, "kB"),
        x => (x, "B"),
    };
    format!("{} {unit}", if v >= 10.0 || v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") })
}

/// Ranks down, steps across (bucketed to `HEATMAP_COLUMNS`), each cell's colour its mean step
/// time against the run's median: blue at or under it, red at 1.5× and beyond.
fn heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, per_rank: &[Series]) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut all: Vec<f64> = per_rank.iter().flatten().map(|p| p.1).filter(|v| v.is_finite()).collect();
    let (Some(first), Some(last)) =
        (per_rank.iter().flatten().map(|p| p.0).min(), per_rank.iter().flatten().map(|p| p.0).max())
    else {
        return Ok(());
    };
    all.sort_by(f64::total_cmp);
    let median = all.get(all.len() / 2).copied().unwrap_or(1.0).max(1e-9);
    let span = last - first + 1;
    let cols = (span as usize).min(HEATMAP_COLUMNS) as u64;
    let ranks = per_rank.len() as u32;
    let mut chart = ChartBuilder::on(root)
        .caption(format!("{title} (median {median:.1} ms; red = 1.5x the median)"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(first as f64..(last + 1) as f64, -0.5..f64::from(ranks) - 0.5)
        .map_err(e)?;
    // Rank 0 on top, as in the cockpit: row y holds rank ranks - 1 - y, labelled at its centre.
    let top = f64::from(ranks) - 1.0;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("step")
        .y_desc("rank")
        .x_label_formatter(&|x| whole(*x))
        .y_labels((ranks as usize).clamp(2, 17))
        .y_label_formatter(&|y| if y.fract() == 0.0 { whole(top - y) } else { String::new() })
        .draw()
        .map_err(e)?;
    for (rank, s) in per_rank.iter().enumerate() {
        let mut buckets = vec![(0.0, 0u32); cols as usize];
        for &(step, v) in s.iter().filter(|p| p.1.is_finite()) {
            let b = ((step - first) * cols / span) as usize;
            buckets[b.min(cols as usize - 1)].0 += v;
            buckets[b.min(cols as usize - 1)].1 += 1;
        }
        let cells = buckets.iter().enumerate().filter(|(_, b)| b.1 > 0).map(|(b, &(sum, n))| {
            let x0 = first as f64 + b as f64 * span as f64 / cols as f64;
            let x1 = first as f64 + (b + 1) as f64 * span as f64 / cols as f64;
            let ratio = sum / f64::from(n) / median;
            let t = ((ratio - 1.0) / 0.5).clamp(0.0, 1.0);
            let color = HSLColor(0.6 * (1.0 - t), 0.75, 0.5);
            let y = top - rank as f64;
            Rectangle::new([(x0, y - 0.5), (x1, y + 0.5)], color.filled())
        });
        chart.draw_series(cells).map_err(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of 2 ranks × 40 steps: rank 1 slower from step 20, with a resume at 10.
    fn run() -> RunData {
        let loss = |r: u32| (1..=40).map(|s| (s, 3.0 / f64::from(s as u32) + 0.01 * f64::from(r))).collect();
        let time = |r: u32| (1..=40).map(|s| (s, if r == 1 && s >= 20 { 90.0 } else { 50.0 })).collect();
        RunData {
            loss: vec![loss(0), loss(1)],
            step_time_ms: vec![time(0), time(1)],
            tokens: vec![(1..=40).map(|s| (s, 1024.0)).collect(); 2],
            extra: vec![("reward".into(), (1..=40).map(|s| (s, f64::from(s as u32) / 40.0)).collect())],
            bandwidth: [(4096, 0.4), (1 << 20, 2.0), (64 << 20, 3.0)]
                .map(|(bytes, busbw_gbps)| Bandwidth {
                    op: crate::record::CollectiveOp::AllReduce,
                    bytes,
                    count: 80,
                    median_us: 1.0,
                    p90_us: 2.0,
                    algbw_gbps: busbw_gbps,
                    busbw_gbps,
                })
                .to_vec(),
            gpu: ["node-a", "node-b"]
                .iter()
                .enumerate()
                .map(|(i, host)| super::super::NodeGpu {
                    host: host.to_string(),
                    util_pct: (1..=40).map(|s| (s, 90.0 - 20.0 * i as f64)).collect(),
                    mem_bytes: (1..=40).map(|s| (s, f64::from(s as u32) * 1e9)).collect(),
                })
                .collect(),
            ..RunData::default()
        }
    }

    /// The SVG's element names in order, runs of one name counted: its structure, without the
    /// coordinates a renderer change would move.
    fn structure(svg: &str) -> String {
        let mut out: Vec<(String, u32)> = Vec::new();
        for tag in svg.split('<').skip(1).filter(|t| !t.starts_with('/')) {
            let name: String = tag.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            match out.last_mut() {
                Some((n, count)) if *n == name => *count += 1,
                _ => out.push((name, 1)),
            }
        }
        out.iter().map(|(n, c)| format!("{n} ×{c}")).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn each_chart_kind_draws_its_svg_and_a_png_that_is_not_blank() {
        if let Err(why) = font() {
            eprintln!("SKIPPED each_chart_kind_draws_its_svg_and_a_png_that_is_not_blank: {why}");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = [run(), run()];
        let charts = draw_all(dir.path(), &runs[..1], Options { per_rank: true }).expect("drawn");
        let stems: Vec<&str> = charts.drawn.iter().map(|d| d.stem.as_str()).collect();
        assert_eq!(stems, ["loss", "step_time", "throughput", "reward", "bandwidth", "gpu_util", "gpu_memory"]);
        std::fs::create_dir(dir.path().join("cmp")).expect("mkdir");
        let compare = draw_all(&dir.path().join("cmp"), &runs, Options::default()).expect("drawn");
        assert_eq!(compare.drawn[0].stem, "compare_loss");
        let kinds = [
            (&charts.dir, "loss"),
            (&charts.dir, "step_time"),
            (&charts.dir, "bandwidth"),
            (&charts.dir, "gpu_util"),
            (&compare.dir, "compare_loss"),
        ];
        for (d, name) in kinds {
            let svg = std::fs::read_to_string(d.join(format!("{name}.svg"))).expect("svg");
            insta::assert_snapshot!(format!("chart_{name}"), structure(&svg));
            let png = std::fs::read(d.join(format!("{name}.png"))).expect("png");
            assert_eq!(&png[1..4], b"PNG", "{name}.png");
        }
    }
}
