//! The collective progress matrix: ranks × recent sequence numbers, each cell one rank's state
//! in one collective (done, in flight, not entered, failed), so the rank that never entered or
//! is stuck stands out as a column's odd cell. For a torch job, `p` shows one process group at a
//! time (`ui::groups`): its members over its own sequence numbers.
use crate::protocol::CollectiveState;
use crate::ui::fmt;
use crate::ui::groups::GroupView;
use crate::ui::hang::RankRole;
use crate::ui::model::{CollectiveRow, RunModel};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

/// Width of the rank label column, then each cell's width (glyph and a space).
const LABEL_W: usize = 6;
const CELL_W: usize = 2;

/// One rank's state in one collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    Done,
    /// Entered (or queued) and not completed.
    InFlight,
    /// Peers entered it; this rank has not.
    NotEntered,
    /// Entered, and the rank died (or disagreed on the op or size) there.
    Failed,
    /// Outside what the cockpit kept of this rank.
    Unknown,
}

impl Cell {
    fn glyph(self) -> (&'static str, Style) {
        match self {
            Cell::Done => ("■", Style::new().fg(Color::Green)),
            Cell::InFlight => ("▶", Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)),
            Cell::NotEntered => ("○", Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
            Cell::Failed => ("✗", Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD)),
            Cell::Unknown => ("·", fmt::dim()),
        }
    }
}

/// The state of `rank` in collective `row`.
pub fn cell(m: &RunModel, row: &CollectiveRow, rank: usize) -> Cell {
    let r = &m.state.ranks[rank];
    let died = r.exit.as_ref().is_some_and(|e| !e.success());
    let mismatched = m.shown_verdict().is_some_and(|s| {
        s.verdict.kind == crate::protocol::VerdictKind::Mismatch
            && s.verdict.collective.as_ref().is_some_and(|c| c.seq == row.seq)
            && s.verdict.culprits.iter().any(|c| c.rank as usize == rank)
    });
    match row.ranks.get(rank).and_then(|x| x.as_ref()) {
        Some(_) if mismatched => Cell::Failed,
        Some(rec) if rec.state == CollectiveState::Completed => Cell::Done,
        Some(_) if died => Cell::Failed,
        Some(_) => Cell::InFlight,
        None if m.last_collective_of(rank as u32).is_some_and(|(seq, _, _)| seq >= row.seq) => Cell::Unknown,
        None => Cell::NotEntered,
    }
}

pub fn render(
    model: Option<&RunModel>,
    cursor: usize,
    group: Option<&str>,
    focused: bool,
    area: Rect,
    buf: &mut Buffer,
) {
    let shown = group.and_then(|name| model?.process_groups().into_iter().find(|g| g.name == name));
    let title = match &shown {
        Some(g) => format!("{} × seq · p next", g.label()),
        None => "ranks × collective seq".into(),
    };
    let block = fmt::panel_block(fmt::title("matrix", title), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(m) = model else { return };
    let cols = (inner.width as usize).saturating_sub(LABEL_W) / CELL_W;
    if cols == 0 || inner.height < 3 {
        return;
    }
    let grid = match &shown {
        Some(g) => group_grid(g, cols),
        None if m.collectives.is_empty() => {
            Paragraph::new(Line::styled("no collectives recorded", fmt::dim())).render(inner, buf);
            return;
        }
        None => rank_grid(m, cols),
    };
    let hot = m.shown_verdict().and_then(|s| s.verdict.collective.as_ref().map(|c| c.seq));
    let mut lines = vec![header(&grid.seqs, hot, inner.width as usize)];
    // Header and legend take two lines; the ranks scroll with the ranks table's cursor.
    let avail = (inner.height as usize).saturating_sub(2).max(1);
    let at = grid.ranks.iter().position(|&r| r as usize >= cursor).unwrap_or(grid.ranks.len().saturating_sub(1));
    let offset = (at + 1).saturating_sub(avail);
    for (rank, cells) in grid.ranks.iter().zip(&grid.cells).skip(offset).take(avail) {
        let label_st = match m.rank_role(*rank) {
            RankRole::Culprit => Style::new().fg(Color::Red).add_modifier(Modifier::REVERSED | Modifier::BOLD),
            RankRole::Waiting => Style::new().fg(Color::Yellow),
            RankRole::Bystander => fmt::dim(),
        };
        let mut spans =
            vec![Span::styled(format!("{:<w$}", format!("r{rank}"), w = LABEL_W - 1), label_st), Span::raw(" ")];
        for c in cells {
            let (g, st) = c.glyph();
            spans.push(Span::styled(g, st));
            spans.push(Span::raw(" "));
        }
        lines.push(Line::from(spans));
    }
    let legend: Vec<Span> = [
        (Cell::Done, "done"),
        (Cell::InFlight, "in flight"),
        (Cell::NotEntered, "not entered"),
        (Cell::Failed, "failed"),
    ]
    .into_iter()
    .flat_map(|(c, what)| {
        let (g, st) = c.glyph();
        [Span::styled(g, st), Span::styled(format!(" {what}  "), fmt::dim())]
    })
    .collect();
    let legend_y = inner.y + inner.height - 1;
    Paragraph::new(lines).render(Rect { height: inner.height - 1, ..inner }, buf);
    Paragraph::new(Line::from(legend)).render(Rect { y: legend_y, height: 1, ..inner }, buf);
}

/// What the matrix draws: its ranks (rows), sequence numbers (columns) and cells.
struct Grid {
    ranks: Vec<u32>,
    seqs: Vec<u64>,
    cells: Vec<Vec<Cell>>,
}

/// Every rank over the newest `cols` collectives it reported.
fn rank_grid(m: &RunModel, cols: usize) -> Grid {
    let mut rows: Vec<&CollectiveRow> = m.collectives.values().rev().take(cols).collect();
    rows.reverse();
    let ranks: Vec<u32> = (0..m.world() as u32).collect();
    let cells = ranks.iter().map(|&r| rows.iter().map(|row| cell(m, row, r as usize)).collect()).collect();
    Grid { ranks, seqs: rows.iter().map(|r| r.seq).collect(), cells }
}

/// One process group's members over its newest `cols` sequence numbers.
fn group_grid(g: &GroupView, cols: usize) -> Grid {
    let skip = g.seqs.len().saturating_sub(cols);
    Grid {
        ranks: g.ranks.clone(),
        seqs: g.seqs[skip..].to_vec(),
        cells: g.cells.iter().map(|row| row[skip..].to_vec()).collect(),
    }
}

/// Sequence numbers over their cells, every fifth where they fit; the verdict's in red.
fn header(seqs: &[u64], hot: Option<u64>, width: usize) -> Line<'static> {
    let mut text: Vec<char> = format!("{:<w$}", "seq", w = LABEL_W).chars().collect();
    text.resize(width, ' ');
    let mut hot_at = None;
    let mut free_from = LABEL_W;
    for (i, &seq) in seqs.iter().enumerate() {
        let x = LABEL_W + i * CELL_W;
        let label = seq.to_string();
        let is_hot = hot == Some(seq);
        if (seq % 5 == 0 || is_hot || i == 0) && x >= free_from && x + label.len() <= width {
            for (k, ch) in label.chars().enumerate() {
                text[x + k] = ch;
            }
            free_from = x + label.len() + 1;
            if is_hot {
                hot_at = Some((x, label.len()));
            }
        }
    }
    let s: String = text.into_iter().collect();
    match hot_at {
        Some((x, n)) => {
            let (a, rest) = s.split_at(x.min(s.len()));
            let (b, c) = rest.split_at(n.min(rest.len()));
            Line::from(vec![
                Span::styled(a.to_string(), fmt::dim()),
                Span::styled(b.to_string(), Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
                Span::styled(c.to_string(), fmt::dim()),
            ])
        }
        None => Line::styled(s, fmt::dim()),
    }
}
