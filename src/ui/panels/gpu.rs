//! The GPUs panel: one row per GPU with its node, utilisation, SM and tensor activity where the
//! GPU reports them (GPM), memory, power, temperature, clocks and throttle reasons (the ones
//! that slow training flagged), and the ranks on it; plus the run's MFU for the header.
use crate::protocol::GpuSample;
use crate::ui::fmt::{self, fit_columns};
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget, Wrap};

/// Temperatures from here on are drawn yellow: most data-centre GPUs start slowing near 85 °C.
const HOT_C: f64 = 83.0;

/// Ranks on a GPU: the processes NVML names as ours, else the ranks whose local rank is its
/// index (NVML cannot see pids across PID namespaces).
fn ranks_on(m: &RunModel, g: &GpuSample) -> Vec<u32> {
    let mut by_pid: Vec<u32> = g.processes.iter().filter_map(|p| p.rank.map(|r| r.0)).collect();
    if by_pid.is_empty() {
        by_pid = m.state.ranks.iter().filter(|r| m.local_rank_of(r) == Some(g.index)).map(|r| r.rank).collect();
    }
    by_pid.sort_unstable();
    by_pid.dedup();
    by_pid
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}%")).unwrap_or_else(|| "-".into())
}

/// `1.2G/s` of both directions summed, for NVLink and PCIe.
fn rate(rx: Option<u64>, tx: Option<u64>) -> String {
    match (rx, tx) {
        (None, None) => "-".into(),
        (a, b) => format!("{}/s", fmt::bytes(a.unwrap_or(0) + b.unwrap_or(0))),
    }
}

pub fn render(model: Option<&RunModel>, focused: bool, area: Rect, buf: &mut Buffer) {
    let n = model.map(|m| m.gpus.len()).unwrap_or(0);
    let throttled = model.map(|m| m.gpus.values().filter(|g| g.throttle.iter().any(|r| r.is_alarming())).count());
    let extra = match throttled {
        Some(t) if t > 0 => format!("{n} · {t} slowed"),
        _ => n.to_string(),
    };
    let block = fmt::panel_block(fmt::title("gpus", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(m) = model.filter(|m| !m.gpus.is_empty()) else {
        let text = "no GPU samples: CPU ranks, or no NVML on the node (the ranks table shows CPU % and RSS)";
        Paragraph::new(Line::styled(text, fmt::dim())).wrap(Wrap { trim: true }).render(inner, buf);
        return;
    };
    // (header, width, priority)
    let cols: [(&str, u16, u8); 14] = [
        ("GPU", 3, 0),
        ("UTIL", 4, 1),
        ("SM", 4, 3),
        ("TC", 4, 10),
        ("MEM", 19, 2),
        ("W", 4, 4),
        ("°C", 3, 5),
        ("MHZ", 5, 11),
        ("THROTTLE", 24, 6),
        ("NODE", 10, 7),
        ("RANKS", 6, 8),
        ("NAME", 14, 9),
        ("NVLINK", 12, 12),
        ("PCIE", 12, 13),
    ];
    let keep = fit_columns(&cols.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>(), inner.width);
    let header = Row::new(cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c.0))).style(fmt::dim());
    let rows = m.gpus.values().take(inner.height.saturating_sub(1) as usize).map(|g| {
        let ranks = ranks_on(m, g);
        let node =
            ranks.iter().find_map(|r| m.state.ranks.get(*r as usize)).map(|r| r.host.clone()).unwrap_or_default();
        let throttle: Vec<Span> = if g.throttle.is_empty() {
            vec![Span::styled("-", fmt::dim())]
        } else {
            g.throttle
                .iter()
                .map(|r| {
                    let st = if r.is_alarming() { Style::new().fg(Color::Red) } else { Style::new().fg(Color::Yellow) };
                    Span::styled(format!("{} ", r.name()), st)
                })
                .collect()
        };
        let temp_style = if g.temp_c >= HOT_C { Style::new().fg(Color::Yellow) } else { Style::new() };
        let cells = [
            Cell::from(g.index.to_string()),
            Cell::from(format!("{:.0}%", g.util_pct)),
            Cell::from(pct(g.sm_active_pct)),
            Cell::from(pct(g.tensor_active_pct)),
            Cell::from(format!("{}/{}", fmt::bytes(g.mem_used_bytes), fmt::bytes(g.mem_total_bytes))),
            Cell::from(format!("{:.0}", g.power_w)),
            Cell::from(format!("{:.0}", g.temp_c)).style(temp_style),
            Cell::from(g.sm_clock_mhz.map(|c| c.to_string()).unwrap_or_else(|| "-".into())),
            Cell::from(Line::from(throttle)),
            Cell::from(fmt::truncate(if node.is_empty() { "-" } else { &node }, 10)),
            Cell::from(if ranks.is_empty() {
                "-".into()
            } else {
                fmt::truncate(&ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","), 6)
            }),
            Cell::from(fmt::truncate(g.name.trim_start_matches("NVIDIA "), 14)),
            Cell::from(rate(g.nvlink_rx_bytes_per_s, g.nvlink_tx_bytes_per_s)),
            Cell::from(rate(g.pcie_rx_bytes_per_s, g.pcie_tx_bytes_per_s)),
        ];
        Row::new(cells.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c))
    });
    let widths: Vec<Constraint> =
        cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Constraint::Length(c.1)).collect();
    Table::new(rows, widths).header(header).render(inner, buf);
}

/// Model FLOPs utilisation per GPU (`src/mfu.rs`) from the latest step time and tokens per rank
/// step, against the first GPU's known dense bf16 peak; None without GPU data, tokens or a
/// known peak.
pub fn mfu(m: &RunModel) -> Option<f64> {
    let gpu = m.gpus.values().next()?;
    let peak = crate::mfu::peak_tflops(crate::mfu::configured_peak_tflops(), &gpu.name)?;
    let tokens = m.metrics.get("tokens")?.cross.last()?.mean();
    let step_ms = m.metrics.get("step_time_ms")?.cross.last()?.mean();
    if tokens <= 0.0 || step_ms <= 0.0 {
        return None;
    }
    // The recipe is small JSON; parsing it per frame costs microseconds at 30 frames a second.
    let recipe: crate::recipe::Recipe = serde_json::from_str(&m.state.record.recipe_json).ok()?;
    Some(crate::mfu::mfu(&recipe.model, tokens / (step_ms / 1e3), peak))
}

/// ` · MFU 41.3%` for the Run header (nothing when it cannot be known).
pub fn mfu_spans(m: &RunModel) -> Vec<Span<'static>> {
    match mfu(m) {
        Some(f) if f < 0.001 => vec![Span::raw(" · MFU <0.1%")],
        Some(f) => vec![Span::raw(format!(" · MFU {:.1}%", f * 100.0))],
        None => Vec::new(),
    }
}
