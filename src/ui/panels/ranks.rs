//! The ranks table: host, pid, step, step time, phase, last collective, heartbeat age, and GPU
//! (util/mem/power/temp) or CPU/RSS. A rank silent for a while is dimmed with its age.
use crate::protocol::{CollectiveOp, CollectiveState};
use crate::store::RankInfo;
use crate::ui::action::Action;
use crate::ui::fmt::{self, fit_columns, STALE_MS};
use crate::ui::hang::RankRole;
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Cell, Row, StatefulWidget, Table, TableState, Widget};

#[derive(Clone, Debug, Default)]
pub struct RanksView {
    pub cursor: usize,
}

impl RanksView {
    pub fn on_action(&mut self, a: Action, n: usize, page: usize) -> bool {
        let Some(to) = a.move_cursor(self.cursor, n, page) else { return false };
        self.cursor = to;
        true
    }
}

fn phase_text(r: &RankInfo) -> String {
    match (&r.exit, r.phase) {
        (Some(crate::protocol::ExitStatus::Code(c)), _) => format!("exit {c}"),
        (Some(crate::protocol::ExitStatus::Signal(s)), _) => format!("sig {s}"),
        (None, Some(p)) => p.name().to_string(),
        (None, None) => "-".into(),
    }
}

fn collective_text(last: Option<(u64, CollectiveOp, CollectiveState)>) -> String {
    match last {
        Some((seq, op, state)) => {
            let mark = match state {
                CollectiveState::Scheduled => "queued",
                CollectiveState::Started => "in",
                CollectiveState::Completed => "ok",
            };
            format!("#{seq} {} {mark}", op.name())
        }
        None => "-".into(),
    }
}

pub fn render(model: Option<&RunModel>, view: &RanksView, focused: bool, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let n = model.map(|m| m.world()).unwrap_or(0);
    let alive = model.map(|m| m.state.ranks_alive()).unwrap_or(0);
    let block = fmt::panel_block(fmt::title("ranks", format!("{alive}/{n} alive")), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(model) = model else {
        return;
    };
    let has_gpu = !model.gpus.is_empty();
    let live = model.is_live();
    // (header, width, priority)
    let mut cols: Vec<(&str, u16, u8)> = vec![
        ("RANK", 4, 0),
        ("STEP", 6, 1),
        ("STEP MS", 8, 2),
        ("PHASE", 7, 3),
        ("AGE", 5, 4),
        ("LAST COLLECTIVE", 20, 5),
        ("HOST", 10, 7),
        ("PID", 7, 8),
    ];
    if has_gpu {
        cols.extend([("GPU", 3, 6), ("GPU%", 5, 6), ("MEM", 19, 6), ("W", 5, 9), ("°C", 4, 9)]);
    } else {
        cols.extend([("CPU%", 5, 6), ("RSS", 9, 6)]);
    }
    let keep = fit_columns(&cols.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>(), inner.width);
    let header = Row::new(cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c.0))).style(fmt::dim());
    let rows_avail = inner.height.saturating_sub(1) as usize;
    let cursor = view.cursor.min(n.saturating_sub(1));
    let offset = (cursor + 1).saturating_sub(rows_avail.max(1));
    let rows = model.state.ranks.iter().skip(offset).take(rows_avail).map(|r| {
        let age_ms = r.last_seen_ms.map(|t| now_ms.saturating_sub(t));
        let stale = live && r.exit.is_none() && age_ms.is_some_and(|a| a > STALE_MS);
        let mut cells: Vec<Cell> = vec![
            Cell::from(r.rank.to_string()),
            Cell::from(r.step.to_string()),
            Cell::from(fmt::opt_num(r.step_time_ms)),
            Cell::from(phase_text(r)),
            Cell::from(match (live, age_ms) {
                (true, Some(a)) if r.exit.is_none() => fmt::duration_ms(a),
                _ => "-".into(),
            })
            .style(if stale { Style::new().fg(Color::Yellow) } else { Style::new() }),
            Cell::from(collective_text(model.last_collective_of(r.rank))),
            Cell::from(fmt::truncate(&r.host, 10)),
            Cell::from(r.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into())),
        ];
        match model.gpu_of(r) {
            Some(g) if has_gpu => cells.extend([
                Cell::from(g.index.to_string()),
                Cell::from(format!("{:.0}", g.util_pct)),
                Cell::from(format!("{}/{}", fmt::bytes(g.mem_used_bytes), fmt::bytes(g.mem_total_bytes))),
                Cell::from(format!("{:.0}", g.power_w)),
                Cell::from(format!("{:.0}", g.temp_c)),
            ]),
            _ if has_gpu => cells.extend(["-", "-", "-", "-", "-"].map(Cell::from)),
            _ => cells.extend([
                Cell::from(r.cpu_pct.map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into())),
                Cell::from(r.rss_bytes.map(fmt::bytes).unwrap_or_else(|| "-".into())),
            ]),
        }
        let style = if r.exit.as_ref().is_some_and(|e| !e.success()) {
            Style::new().fg(Color::Red)
        } else if stale || r.exit.is_some() {
            fmt::dim()
        } else {
            Style::new()
        };
        // The verdict's culprits stand out even on a monochrome terminal; the ranks they hold
        // up are marked.
        let (cells, style) = match model.rank_role(r.rank) {
            RankRole::Culprit => {
                cells[0] = Cell::from(format!("{}!", r.rank));
                (cells, Style::new().fg(Color::Red).add_modifier(Modifier::REVERSED | Modifier::BOLD))
            }
            RankRole::Waiting => {
                cells[0] = Cell::from(format!("{}…", r.rank));
                (cells, style.fg(Color::Yellow))
            }
            RankRole::Bystander => (cells, style),
        };
        Row::new(cells.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c)).style(style)
    });
    let widths: Vec<Constraint> =
        cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Constraint::Length(c.1)).collect();
    let mut table = Table::new(rows, widths).header(header);
    if focused {
        table = table.row_highlight_style(Style::new().bg(Color::DarkGray).add_modifier(Modifier::BOLD));
    }
    let mut state = TableState::default().with_selected(Some(cursor - offset));
    StatefulWidget::render(table, inner, buf, &mut state);
}
