//! The Home screen's runs table: sort, filter, marks for compare, and the selected run.
use crate::ids::RunId;
use crate::store::RunRecord;
use crate::ui::action::Action;
use crate::ui::fmt::{self, fit_columns};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, StatefulWidget, Table, TableState, Widget};
use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Started,
    Status,
    Name,
    Step,
    Loss,
    Duration,
}

impl SortKey {
    const ORDER: [SortKey; 6] =
        [SortKey::Started, SortKey::Status, SortKey::Name, SortKey::Step, SortKey::Loss, SortKey::Duration];
    fn next(self) -> SortKey {
        let i = SortKey::ORDER.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ORDER[(i + 1) % SortKey::ORDER.len()]
    }
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Started => "started",
            SortKey::Status => "status",
            SortKey::Name => "name",
            SortKey::Step => "step",
            SortKey::Loss => "loss",
            SortKey::Duration => "duration",
        }
    }
}

#[derive(Debug)]
pub struct HomeView {
    pub runs: Vec<RunRecord>,
    pub loaded: bool,
    pub cursor: usize,
    pub sort: SortKey,
    /// Newest first by default.
    pub descending: bool,
    pub filter: String,
    pub marked: BTreeSet<RunId>,
}

impl Default for HomeView {
    fn default() -> HomeView {
        HomeView {
            runs: Vec::new(),
            loaded: false,
            cursor: 0,
            sort: SortKey::Started,
            descending: true,
            filter: String::new(),
            marked: BTreeSet::new(),
        }
    }
}

fn duration(r: &RunRecord, now_ms: u64) -> u64 {
    r.ended_ms.unwrap_or(now_ms).saturating_sub(r.created_ms)
}

impl HomeView {
    /// The runs shown: filtered by the `/` text (id, name, recipe, status), then sorted.
    pub fn visible(&self, now_ms: u64) -> Vec<&RunRecord> {
        let f = self.filter.to_lowercase();
        let mut v: Vec<&RunRecord> = self
            .runs
            .iter()
            .filter(|r| {
                f.is_empty()
                    || [r.id.as_str(), &r.name, &r.recipe_name, r.status.name()]
                        .iter()
                        .any(|s| s.to_lowercase().contains(&f))
            })
            .collect();
        v.sort_by(|a, b| {
            let o = match self.sort {
                SortKey::Started => a.id.cmp(&b.id),
                SortKey::Status => a.status.name().cmp(b.status.name()),
                SortKey::Name => a.name.cmp(&b.name),
                SortKey::Step => a.step.cmp(&b.step),
                SortKey::Loss => a.last_loss.unwrap_or(f64::MAX).total_cmp(&b.last_loss.unwrap_or(f64::MAX)),
                SortKey::Duration => duration(a, now_ms).cmp(&duration(b, now_ms)),
            };
            if self.descending {
                o.reverse()
            } else {
                o
            }
        });
        v
    }

    pub fn selected(&self, now_ms: u64) -> Option<&RunRecord> {
        self.visible(now_ms).get(self.cursor).copied()
    }

    pub fn on_action(&mut self, a: Action, now_ms: u64, page: usize) {
        let n = self.visible(now_ms).len();
        if let Some(to) = a.move_cursor(self.cursor, n, page) {
            self.cursor = to;
            return;
        }
        match a {
            Action::Sort => self.sort = self.sort.next(),
            Action::SortReverse => self.descending = !self.descending,
            Action::Select => {
                if let Some(id) = self.selected(now_ms).map(|r| r.id.clone()) {
                    if !self.marked.remove(&id) {
                        self.marked.insert(id);
                    }
                    self.cursor = (self.cursor + 1).min(n.saturating_sub(1));
                }
            }
            _ => {}
        }
    }

    /// `↳ NAME@STEP` (or the parent's id when it is not listed) for a resumed run, `from
    /// NAME@STEP` for a run started from its weights.
    fn lineage(&self, r: &RunRecord) -> String {
        let Some(p) = &r.parent else { return "-".into() };
        let who = match self.runs.iter().find(|x| &x.id == p) {
            Some(x) => x.name.clone(),
            None => p.to_string(),
        };
        match (&r.resumed_from, &r.init_from) {
            // Restarted by recovery: the cause first, since the name is the same as its parent's.
            (Some(from), _) if r.restart.is_some() => {
                let cause = r.restart.as_ref().map_or("", |x| x.cause.name());
                fmt::truncate(&format!("↻ {cause} {who}@{}", from.step), 20)
            }
            (Some(from), _) => fmt::truncate(&format!("↳ {who}@{}", from.step), 20),
            // Started from the parent's weights (`[init] from`): a new stage of a chain.
            (None, Some(init)) => fmt::truncate(&format!("from {who}@{}", init.step), 20),
            (None, None) => fmt::truncate(&format!("↳ {who}"), 20),
        }
    }

    /// Keeps the cursor on a row after the list changed.
    pub fn clamp(&mut self, now_ms: u64) {
        self.cursor = self.cursor.min(self.visible(now_ms).len().saturating_sub(1));
    }

    pub fn render(&self, now_ms: u64, area: Rect, buf: &mut Buffer) {
        let runs = self.visible(now_ms);
        let arrow = if self.descending { "↓" } else { "↑" };
        let mut extra = format!("{} of {} · sort {} {arrow}", runs.len(), self.runs.len(), self.sort.name());
        if !self.filter.is_empty() {
            extra.push_str(&format!(" · filter {:?}", self.filter));
        }
        if !self.marked.is_empty() {
            let hidden = self.marked.iter().filter(|id| !runs.iter().any(|r| &r.id == *id)).count();
            extra.push_str(&format!(" · {} marked", self.marked.len() - hidden));
            if hidden > 0 {
                extra.push_str(&format!(" ({hidden} more hidden by the filter: c leaves them out)"));
            }
        }
        let block = fmt::panel_block(fmt::title("runs", extra), true);
        let inner = block.inner(area);
        block.render(area, buf);
        if runs.is_empty() {
            let text = if !self.loaded {
                "loading runs…".to_string()
            } else if self.runs.is_empty() {
                "no runs yet: press n to pick a recipe, or type :run recipes/tiny-gpt.toml".to_string()
            } else {
                "no run matches the filter (/ to change it)".to_string()
            };
            Paragraph::new(Line::styled(text, fmt::dim())).render(inner, buf);
            return;
        }
        // (header, width, priority): when narrow, the id stays (to copy it) before the numbers.
        let cols: [(&str, u16, u8); 10] = [
            ("STATUS", 12, 0),
            ("NAME", 14, 1),
            ("STEP", 11, 3),
            ("LOSS", 7, 4),
            ("TIME", 6, 5),
            ("STARTED", 9, 6),
            ("WORLD", 5, 7),
            ("ID", 20, 2),
            ("RECIPE", 14, 8),
            ("PARENT", 20, 9),
        ];
        let keep = fit_columns(&cols.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>(), inner.width);
        let header =
            Row::new(cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c.0))).style(fmt::dim());
        let rows_avail = inner.height.saturating_sub(1) as usize;
        let offset = (self.cursor + 1).saturating_sub(rows_avail.max(1));
        let rows = runs.iter().skip(offset).take(rows_avail).map(|r| {
            let mark = if self.marked.contains(&r.id) { "● " } else { "  " };
            let cells: [Cell; 10] = [
                Cell::from(format!("{mark}{}", r.status.name())).style(fmt::status_style(r.status)),
                Cell::from(if r.parent.is_some() {
                    format!("↳ {}", fmt::truncate(&r.name, 12))
                } else {
                    fmt::truncate(&r.name, 14)
                }),
                Cell::from(format!("{}/{}", r.step, r.steps_planned)),
                Cell::from(fmt::opt_num(r.last_loss)),
                Cell::from(fmt::duration_ms(duration(r, now_ms))),
                Cell::from(format!("{} ago", fmt::duration_ms(now_ms.saturating_sub(r.created_ms)))),
                Cell::from(r.world_size.to_string()),
                Cell::from(r.id.to_string()),
                Cell::from(fmt::truncate(&r.recipe_name, 14)),
                Cell::from(self.lineage(r)),
            ];
            Row::new(cells.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c))
        });
        let widths: Vec<Constraint> =
            cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Constraint::Length(c.1)).collect();
        let table = Table::new(rows, widths)
            .header(header)
            .row_highlight_style(Style::new().bg(Color::DarkGray).add_modifier(Modifier::BOLD));
        let mut state = TableState::default().with_selected(Some(self.cursor - offset));
        StatefulWidget::render(table, inner, buf, &mut state);
    }
}
