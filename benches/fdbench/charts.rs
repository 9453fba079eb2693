//! `fdbench charts DOC OUT_DIR`: docs/benchmarks.md's tables drawn as charts, each twice (SVG
//! and PNG, as `flightdeck report` draws): every speed-up against the 1.0 line, and the
//! all-reduce bus bandwidth against message size.
//!
//! The charts read the doc, not the drivers' results, so they always show what the tables say
//! and can be redrawn from a committed doc without rerunning the benchmarks.
use crate::tables::{self, Bandwidth, Speedup};
use anyhow::Context;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};

const WIDTH_PX: u32 = 960;
const MARGIN_PX: u32 = 12;
const BANDWIDTH_HEIGHT_PX: u32 = 420;
/// The ratios chart grows with its rows (one per bar or group heading) so that labels never
/// overlap: this many pixels each, plus the caption and the x axis.
const ROW_PX: u32 = 22;
const FRAME_PX: u32 = 110;
const AHEAD: RGBColor = RGBColor(44, 160, 44);
const BEHIND: RGBColor = RGBColor(214, 39, 40);
/// One colour per bandwidth column (ring, gloo, then any later one such as memcpy).
const SIDES: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];
const BAND: RGBColor = RGBColor(242, 242, 242);
const GRID: RGBColor = RGBColor(215, 215, 215);
/// A log axis has no 0: smaller ratios (parse-log's 0.00 against grep) are drawn at this, and
/// their label still says the table's value.
const FLOOR: f64 = 0.01;
/// The ratio axis's ticks, those inside its range.
const TICKS: [f64; 16] =
    [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// Reads `doc`'s tables and writes `ratios` and `allreduce_busbw` (`.svg`, `.png`) into `out`;
/// prints the files it wrote as one JSON line.
pub fn main(doc: &Path, out: &Path) -> anyhow::Result<()> {
    flightdeck::report::font().map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
    let tables = tables::parse(doc, &text)?;
    let speedups = tables::speedups(doc, &tables)?;
    let lines = tables::bandwidths(doc, &tables)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut files = ratios(&out.join("ratios"), &speedups)?;
    files.extend(bandwidth(&out.join("allreduce_busbw"), &lines, tables::measured(&text, "allreduce").as_deref())?);
    let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    println!("{}", serde_json::json!({ "charts": files, "speedups": speedups.len(), "busbw_lines": lines.len() }));
    Ok(())
}

type Drawing = Result<(), String>;

fn fail(path: &Path) -> impl Fn(String) -> anyhow::Error + '_ {
    move |why| anyhow::anyhow!("drawing {}: {why}", path.display())
}

/// `STEM.svg` and `STEM.png`, one bar per speed-up, grouped by benchmark.
pub fn ratios(stem: &Path, speedups: &[Speedup]) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(!speedups.is_empty(), "no bold speed-up in any table: nothing to chart");
    let rows = ratio_rows(speedups);
    let size = (WIDTH_PX, FRAME_PX + ROW_PX * rows.len() as u32);
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    draw_ratios(&SVGBackend::new(&svg, size).into_drawing_area(), &rows).map_err(fail(&svg))?;
    draw_ratios(&BitMapBackend::new(&png, size).into_drawing_area(), &rows).map_err(fail(&png))?;
    Ok(vec![svg, png])
}

/// `STEM.svg` and `STEM.png`: GB/s against message size, one line per (column, processes).
pub fn bandwidth(stem: &Path, lines: &[Bandwidth], measured: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let size = (WIDTH_PX, BANDWIDTH_HEIGHT_PX);
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    draw_bandwidth(&SVGBackend::new(&svg, size).into_drawing_area(), lines, measured).map_err(fail(&svg))?;
    draw_bandwidth(&BitMapBackend::new(&png, size).into_drawing_area(), lines, measured).map_err(fail(&png))?;
    Ok(vec![svg, png])
}

/// A row of the ratios chart, top to bottom.
enum Row<'a> {
    Group(&'a str),
    Bar(&'a Speedup),
}

fn ratio_rows(speedups: &[Speedup]) -> Vec<Row<'_>> {
    let mut rows = Vec::new();
    for (i, s) in speedups.iter().enumerate() {
        if i == 0 || speedups[i - 1].group != s.group {
            rows.push(Row::Group(&s.group));
        }
        rows.push(Row::Bar(s));
    }
    rows
}

/// The value beside a bar, as precise as the tables print it.
fn ratio_text(v: f64) -> String {
    match v {
        v if v >= 100.0 => format!("{v:.0}×"),
        v if v >= 10.0 => format!("{v:.1}×"),
        v => format!("{v:.2}×"),
    }
}

fn draw_ratios<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, rows: &[Row]) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let bars: Vec<&Speedup> = rows.iter().filter_map(|r| if let Row::Bar(s) = r { Some(*s) } else { None }).collect();
    let (mut lo, mut hi) = (1.0f64, 1.0f64);
    for s in &bars {
        (lo, hi) = (lo.min(s.ratio.max(FLOOR)), hi.max(s.ratio));
    }
    // Room on both sides of 1.0 for a bar's value, and at least 0.5–2 so 1.0 sits inside.
    let (lo, hi) = (lo.min(0.5) / 2.2, hi.max(2.0) * 2.2);
    let label = ("sans-serif", 13).into_font().color(&BLACK);
    let heading = ("sans-serif", 14).into_font().color(&RGBColor(40, 40, 40));
    // The label area holds the longest bar label, and the longest group heading (which starts
    // at the image's left edge, `MARGIN_PX` in) so that no text crosses the axis.
    let mut label_px = 0;
    for row in rows {
        let w = match row {
            Row::Group(name) => root.estimate_text_size(name, &heading).map_err(e)?.0.saturating_sub(MARGIN_PX),
            Row::Bar(s) => root.estimate_text_size(&s.label, &label).map_err(e)?.0,
        };
        label_px = label_px.max(w);
    }
    let n = rows.len() as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Speed-up against each benchmark's reference (green: Flightdeck ahead; red: behind)",
            ("sans-serif", 18),
        )
        .margin(MARGIN_PX)
        .x_label_area_size(44)
        .y_label_area_size(label_px + 16)
        .build_cartesian_2d((lo..hi).log_scale().with_key_points(TICKS.to_vec()), 0.0..n)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .bold_line_style(GRID)
        .x_desc("reference time ÷ Flightdeck time (log scale; right of 1×: Flightdeck ahead)")
        .x_label_formatter(&|x| format!("{x}×"))
        .draw()
        .map_err(e)?;
    // Row i from the top spans y = n-i-1 .. n-i; every other benchmark's rows on a grey band.
    let top = |i: usize| n - i as f64;
    let mut group = 0;
    for (i, row) in rows.iter().enumerate() {
        match row {
            Row::Group(_) => group += 1,
            Row::Bar(_) if group % 2 == 0 => {
                let band = Rectangle::new([(lo, top(i) - 1.0), (hi, top(i))], BAND.filled());
                chart.draw_series(std::iter::once(band)).map_err(e)?;
            }
            Row::Bar(_) => {}
        }
    }
    chart.draw_series(LineSeries::new([(1.0, 0.0), (1.0, n)], BLACK.stroke_width(2))).map_err(e)?;
    let (plot_left, _) = chart.backend_coord(&(lo, 0.0));
    for (i, row) in rows.iter().enumerate() {
        let mid = top(i) - 0.5;
        let (_, y) = chart.backend_coord(&(lo, mid));
        let s = match row {
            Row::Group(name) => {
                let style = heading.pos(Pos::new(HPos::Left, VPos::Center));
                root.draw(&Text::new(name.to_string(), (MARGIN_PX as i32, y), style)).map_err(e)?;
                continue;
            }
            Row::Bar(s) => s,
        };
        let to = s.ratio.max(FLOOR);
        let color = if s.ratio >= 1.0 { AHEAD } else { BEHIND };
        let bar = Rectangle::new([(1.0, mid - 0.32), (to, mid + 0.32)], color.filled());
        chart.draw_series(std::iter::once(bar)).map_err(e)?;
        let style = label.pos(Pos::new(HPos::Right, VPos::Center));
        root.draw(&Text::new(s.label.clone(), (plot_left - 8, y), style)).map_err(e)?;
        let text =
            if s.ratio < FLOOR { format!("{} (off the scale)", ratio_text(s.ratio)) } else { ratio_text(s.ratio) };
        // The value beyond the bar's end; inside it, in white, where the label area is too near.
        let (end, _) = chart.backend_coord(&(to, mid));
        let value = ("sans-serif", 12).into_font();
        let text_px = root.estimate_text_size(&text, &TextStyle::from(value.clone())).map_err(e)?.0 as i32;
        let (x, h, ink) = match s.ratio >= 1.0 {
            true => (end + 5, HPos::Left, RGBColor(60, 60, 60)),
            false if end - 5 - text_px > plot_left => (end - 5, HPos::Right, RGBColor(60, 60, 60)),
            false => (end + 5, HPos::Left, WHITE),
        };
        root.draw(&Text::new(text, (x, y), value.color(&ink).pos(Pos::new(h, VPos::Center)))).map_err(e)?;
    }
    root.present().map_err(e)
}

/// `4096` → `4 KiB`.
fn size_text(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let (mut v, mut u) = (bytes, 0);
    while v >= 1024.0 && u + 1 < units.len() {
        (v, u) = (v / 1024.0, u + 1);
    }
    format!("{v:.0} {}", units[u])
}

fn draw_bandwidth<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    lines: &[Bandwidth],
    measured: Option<&str>,
) -> Drawing
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut sizes: Vec<u64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let (Some(&first), Some(&last)) = (sizes.first(), sizes.last()) else {
        return Err("the all-reduce table has no rows".into());
    };
    // A log y axis: busbw spans four decades (gloo at 4 KiB to memcpy at 64 MiB), and on a
    // linear one the memcpy line flattens every other line against the floor.
    let values = || lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).filter(|v| *v > 0.0);
    let top = values().fold(0.0, f64::max).max(0.01) * 1.5;
    let bottom = values().fold(f64::INFINITY, f64::min).min(top / 10.0) / 1.5;
    let mut sides: Vec<&str> = Vec::new();
    let mut worlds: Vec<u32> = Vec::new();
    for l in lines {
        if !sides.contains(&l.side.as_str()) {
            sides.push(&l.side);
        }
        if !worlds.contains(&l.processes) {
            worlds.push(l.processes);
        }
    }
    let when = measured.map_or(String::new(), |m| format!(", measured {m}"));
    let ticks: Vec<f64> = sizes.iter().map(|&b| b as f64).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(format!("All-reduce bus bandwidth: {}{when}", sides.join(" against ")), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (first as f64 / 1.4..last as f64 * 1.4).log_scale().with_key_points(ticks),
            (bottom..top).log_scale(),
        )
        .map_err(e)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .x_desc("message size, float32 (log scale)")
        .y_desc("busbw GB/s (nccl-tests' definition, log scale)")
        .x_label_formatter(&|b| size_text(*b))
        .draw()
        .map_err(e)?;
    for l in lines {
        let color = SIDES[sides.iter().position(|s| *s == l.side).unwrap_or(0) % SIDES.len()];
        let world = worlds.iter().position(|w| *w == l.processes).unwrap_or(0);
        let style = color.stroke_width(2);
        let points: Vec<(f64, f64)> = l.points.iter().filter(|p| p.1 > 0.0).map(|&(b, v)| (b as f64, v)).collect();
        let name = format!("{}, {} processes", l.side, l.processes);
        // The first world size solid with dots, the others dashed with triangles.
        if world == 0 {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(e)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
        } else {
            let dash = 6 + 3 * world as i32;
            chart
                .draw_series(DashedLineSeries::new(points.clone(), dash, 5, style))
                .map_err(e)?
                .label(name)
                .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], dash, 5, style));
            chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, 4, color.filled()))).map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Only `#[test]` items here: fdbench itself is built with cfg(test) but without libtest, which
/// strips them, so anything else in this module would be dead code there.
#[cfg(test)]
mod tests {
    #[test]
    fn the_sample_doc_draws_both_charts_and_neither_png_is_blank() {
        use super::*;
        // Pixels of exactly `color` in the PNG.
        let count = |png: &Path, color: RGBColor| {
            let img = image::open(png).expect("decoded").to_rgb8();
            img.pixels().filter(|p| p.0 == [color.0, color.1, color.2]).count()
        };
        if let Err(why) = flightdeck::report::font() {
            eprintln!("SKIPPED the_sample_doc_draws_both_charts_and_neither_png_is_blank: {why}");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let doc = dir.path().join("benchmarks.md");
        std::fs::write(&doc, include_str!("sample_benchmarks.md")).expect("written");
        let out = dir.path().join("charts");
        main(&doc, &out).expect("drawn");
        for stem in ["ratios", "allreduce_busbw"] {
            let png = out.join(format!("{stem}.png"));
            let img = image::open(&png).expect("decoded").to_rgb8();
            let inked = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
            assert!(inked * 50 > img.pixels().len(), "{stem}.png is nearly blank: {inked} pixels drawn");
            assert!(std::fs::read_to_string(out.join(format!("{stem}.svg"))).expect("svg").contains("<text"));
        }
        let ratios = out.join("ratios.png");
        assert!(count(&ratios, AHEAD) > 100 && count(&ratios, BEHIND) > 100, "both ahead and behind bars");
        // 2 bars of training, 4 of all-reduce, 2 of history, 1 of fan-out, and 4 group headings.
        let (_, height) = image::image_dimensions(&ratios).expect("size");
        assert_eq!(height, FRAME_PX + ROW_PX * 13);
        let busbw = out.join("allreduce_busbw.png");
        assert!(count(&busbw, SIDES[0]) > 100 && count(&busbw, SIDES[1]) > 100, "ring and gloo lines");
        let svg = std::fs::read_to_string(out.join("allreduce_busbw.svg")).expect("svg");
        for name in ["ring, 2 processes", "gloo, 4 processes", "4 KiB", "1 MiB", "measured 2026-12-02 12:32"] {
            assert!(svg.contains(name), "{name:?} missing from the bandwidth chart");
        }
    }

    #[test]
    fn a_missing_doc_or_a_broken_table_is_an_error_that_says_where() {
        use super::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.md");
        let err = main(&missing, dir.path()).map_err(|e| format!("{e:#}"));
        if flightdeck::report::font().is_ok() {
            assert!(err.as_ref().is_err_and(|e| e.starts_with(&format!("reading {}: ", missing.display()))), "{err:?}");
            let broken = dir.path().join("broken.md");
            std::fs::write(&broken, include_str!("sample_benchmarks.md").replace("**2.83**", "**?**"))
                .expect("written");
            let err = main(&broken, dir.path()).map_err(|e| e.to_string());
            let want = format!("{}:22: section bench:allreduce: expected a bold number", broken.display());
            assert!(err.as_ref().is_err_and(|e| e.starts_with(&want)), "{err:?}");
        }
    }

    #[test]
    fn values_and_sizes_print_as_the_tables_do() {
        use super::*;
        assert_eq!(ratio_text(0.0), "0.00×");
        assert_eq!(ratio_text(12.76), "12.8×");
        assert_eq!(ratio_text(1234.4), "1234×");
        assert_eq!(size_text(4096.0), "4 KiB");
        assert_eq!(size_text(64.0 * 1024.0 * 1024.0), "64 MiB");
        assert_eq!(size_text(512.0), "512 B");
    }
}
