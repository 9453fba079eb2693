//! Recent collectives across ranks: op, size, p50/max latency, algbw and busbw (nccl-tests'
//! factors), and arrival skew (first to last rank entering).
use crate::protocol::{CollectiveOp, CollectiveState};
use crate::ui::fmt::{self, fit_columns};
use crate::ui::model::{CollectiveRow, RunModel};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget};

/// nccl-tests' bus bandwidth factor for `n` ranks (DESIGN §9).
pub fn busbw_factor(op: CollectiveOp, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match op {
        CollectiveOp::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveOp::ReduceScatter | CollectiveOp::AllGather => (n - 1.0) / n,
        CollectiveOp::Broadcast => 1.0,
        CollectiveOp::Barrier => 0.0,
    }
}

/// One collective's numbers over the ranks that reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveStats {
    pub done: usize,
    pub entered: usize,
    pub p50_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    pub skew_ms: Option<f64>,
}

pub fn stats(row: &CollectiveRow, world: usize) -> CollectiveStats {
    let recs: Vec<_> = row.ranks.iter().flatten().collect();
    let mut lat_ms: Vec<f64> = recs
        .iter()
        .filter(|r| r.state == CollectiveState::Completed)
        .filter_map(|r| Some(r.end_us?.saturating_sub(r.start_us?) as f64 / 1000.0))
        .collect();
    lat_ms.sort_by(f64::total_cmp);
    // The lower median: with two ranks, the faster one (the slower is the max).
    let p50 = (!lat_ms.is_empty()).then(|| lat_ms[(lat_ms.len() - 1) / 2]);
    let enq: Vec<u64> = recs.iter().map(|r| r.enqueue_us).collect();
    let skew = match (enq.iter().min(), enq.iter().max()) {
        (Some(a), Some(b)) if enq.len() > 1 => Some((b - a) as f64 / 1000.0),
        _ => None,
    };
    // algbw = bytes / time (GB/s = 1e9 B/s), over the median rank's time.
    let algbw = p50.filter(|t| *t > 0.0 && row.bytes > 0).map(|t| row.bytes as f64 / (t / 1000.0) / 1e9);
    CollectiveStats {
        done: lat_ms.len(),
        entered: recs.len(),
        p50_ms: p50,
        max_ms: lat_ms.last().copied(),
        algbw_gbps: algbw,
        busbw_gbps: algbw.map(|a| a * busbw_factor(row.op, world)),
        skew_ms: skew,
    }
}

pub fn render(model: Option<&RunModel>, focused: bool, area: Rect, buf: &mut Buffer) {
    let n = model.map(|m| m.collectives.len()).unwrap_or(0);
    let block = fmt::panel_block(fmt::title("collectives", format!("{n} recent")), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(model) = model.filter(|m| !m.collectives.is_empty()) else {
        Paragraph::new(Line::styled("no collectives recorded", fmt::dim())).render(inner, buf);
        return;
    };
    let world = model.world();
    let cols: [(&str, u16, u8); 10] = [
        ("SEQ", 5, 0),
        ("OP", 10, 1),
        ("SIZE", 9, 7),
        ("DONE", 5, 4),
        ("P50 MS", 7, 2),
        ("MAX MS", 7, 5),
        ("SKEW MS", 7, 3),
        ("BUSBW GB/s", 10, 6),
        ("ALGBW GB/s", 10, 8),
        ("STEP", 5, 9),
    ];
    let keep = fit_columns(&cols.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>(), inner.width);
    let header = Row::new(cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c.0))).style(fmt::dim());
    let rows_avail = inner.height.saturating_sub(1) as usize;
    let rows = model.collectives.values().rev().take(rows_avail).map(|row| {
        let s = stats(row, world);
        let gb = |v: Option<f64>| v.map(|g| format!("{g:.2}")).unwrap_or_else(|| "-".into());
        let cells = [
            row.seq.to_string(),
            fmt::truncate(row.op.name(), 10),
            fmt::bytes(row.bytes),
            format!("{}/{}", s.done, world),
            fmt::opt_num(s.p50_ms),
            fmt::opt_num(s.max_ms),
            fmt::opt_num(s.skew_ms),
            gb(s.busbw_gbps),
            gb(s.algbw_gbps),
            row.step.to_string(),
        ];
        let style = if s.done < world { Style::new().fg(Color::Yellow) } else { Style::new() };
        Row::new(cells.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c))).style(style)
    });
    let widths: Vec<Constraint> =
        cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Constraint::Length(c.1)).collect();
    Table::new(rows, widths).header(header).render(inner, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        assert_eq!(busbw_factor(CollectiveOp::AllReduce, 8), 1.75);
        assert_eq!(busbw_factor(CollectiveOp::AllGather, 4), 0.75);
        assert_eq!(busbw_factor(CollectiveOp::Broadcast, 4), 1.0);
        assert_eq!(busbw_factor(CollectiveOp::AllReduce, 1), 0.0);
    }
}
