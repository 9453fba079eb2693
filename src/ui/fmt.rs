//! Formatting and styling shared by the panels: numbers, sizes, ages, column fitting, blocks.
use crate::store::RunStatus;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders};

/// Data older than this on a live run is drawn dimmed with its age.
pub const STALE_MS: u64 = 5_000;

/// Four significant digits, switching to exponent form for very large or small values.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.2e}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

pub fn opt_num(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "-".into())
}

/// Sizes and durations are written one way everywhere (`crate::units`).
pub use crate::units::{bytes, duration_ms};

/// A metric's value: a size metric (`mem_rss_bytes`) in binary units, anything else by `num`.
pub fn metric_value(metric: &str, v: f64) -> String {
    if crate::units::is_size_metric(metric) {
        crate::units::bytes_f(v)
    } else {
        num(v)
    }
}

pub fn status_style(s: RunStatus) -> Style {
    match s {
        RunStatus::Starting | RunStatus::Running => Style::new().fg(Color::Green),
        RunStatus::Hung => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        RunStatus::Succeeded => Style::new().fg(Color::Cyan),
        RunStatus::Failed => Style::new().fg(Color::Red),
        RunStatus::Killed | RunStatus::Stopped => Style::new().fg(Color::Magenta),
        RunStatus::Interrupted => Style::new().fg(Color::Yellow),
    }
}

/// `step 42/200`, or `step 42` for a run with no planned total (a command's program decides
/// when it is done: `step 1505/0` read as a bug).
pub fn step_of(step: u64, planned: u64) -> String {
    if planned == 0 {
        format!("step {step}")
    } else {
        format!("step {step}/{planned}")
    }
}

pub fn dim() -> Style {
    Style::new().add_modifier(Modifier::DIM)
}

/// A panel's frame: its title, and a bright border when it has the focus.
pub fn panel_block<'a>(title: Line<'a>, focused: bool) -> Block<'a> {
    let border = if focused { Style::new().fg(Color::Cyan) } else { Style::new().fg(Color::DarkGray) };
    Block::new()
        .borders(Borders::ALL)
        .border_type(if focused { BorderType::Thick } else { BorderType::Plain })
        .border_style(border)
        .title(title)
}

pub fn title<'a>(name: &'a str, extra: String) -> Line<'a> {
    let mut spans = vec![Span::styled(format!(" {name} "), Style::new().add_modifier(Modifier::BOLD))];
    if !extra.is_empty() {
        spans.push(Span::raw(format!("{extra} ")));
    }
    Line::from(spans)
}

/// Which columns fit in `width`: columns are (width, priority: lower = more important); one
/// space separates them. Returns a keep-flag per column.
pub fn fit_columns(cols: &[(u16, u8)], width: u16) -> Vec<bool> {
    let mut keep = vec![false; cols.len()];
    let mut order: Vec<usize> = (0..cols.len()).collect();
    order.sort_by_key(|&i| cols[i].1);
    let mut used: u16 = 0;
    for i in order {
        let need = cols[i].0 + u16::from(used > 0);
        if used + need <= width {
            used += need;
            keep[i] = true;
        }
    }
    keep
}

/// The parts of one line that fit in `width` cells: the parts with the highest priority number
/// go first (0 is kept longest), the rest keep their order. `len` is a part's width.
pub fn fit_parts<T>(parts: Vec<(T, u8)>, width: usize, len: impl Fn(&T) -> usize) -> Vec<T> {
    let mut keep: Vec<bool> = vec![true; parts.len()];
    let total = |keep: &[bool]| parts.iter().zip(keep).filter(|(_, k)| **k).map(|(p, _)| len(&p.0)).sum::<usize>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(parts[i].1));
    for i in order {
        if total(&keep) <= width || parts[i].1 == 0 {
            break;
        }
        keep[i] = false;
    }
    parts.into_iter().zip(keep).filter(|(_, k)| *k).map(|(p, _)| p.0).collect()
}

/// A line's spans cut to `width` cells, the last shown ending in `…` where text was cut.
pub fn cut_spans(spans: Vec<Span<'static>>, width: usize) -> Line<'static> {
    let mut out = Vec::new();
    let mut used = 0;
    for s in spans {
        let w = s.content.chars().count();
        if used + w <= width {
            used += w;
            out.push(s);
            continue;
        }
        let room = width.saturating_sub(used);
        if room > 0 {
            out.push(Span::styled(truncate(&s.content, room), s.style));
        } else if let Some(last) = out.pop() {
            let n = last.content.chars().count();
            out.push(Span::styled(truncate(&format!("{}…", last.content), n), last.style));
        }
        break;
    }
    Line::from(out)
}

/// Cuts text to at most `n` characters, marking the cut with `…`.
pub fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod step_tests {
    #[test]
    fn a_run_without_a_planned_total_shows_its_step_alone() {
        assert_eq!(super::step_of(42, 200), "step 42/200");
        assert_eq!(super::step_of(1505, 0), "step 1505", "a command's run plans no total");
    }
}
