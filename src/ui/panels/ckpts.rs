//! The Checkpoints screen: a run's checkpoints (step, loss, size, age, verification, LATEST)
//! with a cursor, and the resume confirmation that says exactly what will start.
use crate::ids::RunId;
use crate::store::checkpoints::Skipped;
use crate::store::{CheckpointRecord, RunRecord};
use crate::ui::action::Action;
use crate::ui::fmt::{self, fit_columns};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, StatefulWidget, Table, TableState, Widget, Wrap};

/// What the server lists for one run (`Reply::Checkpoints`).
#[derive(Clone, Debug, PartialEq)]
pub struct CkptList {
    pub run: RunId,
    pub dir: String,
    /// The step `LATEST` names.
    pub latest: Option<u64>,
    /// In step order, as the server sends them.
    pub checkpoints: Vec<CheckpointRecord>,
}

impl CkptList {
    /// The newest checkpoint the last check found whole: what a plain resume starts from.
    pub fn newest_verified(&self) -> Option<&CheckpointRecord> {
        self.checkpoints.iter().filter(|c| c.verified).max_by_key(|c| c.step)
    }
}

/// A child run started (`Reply::Resumed`).
#[derive(Clone, Debug, PartialEq)]
pub struct Resumed {
    pub run: RunId,
    pub parent: RunId,
    pub step: u64,
    pub path: String,
    /// Newer checkpoints passed over because they failed verification.
    pub skipped: Vec<Skipped>,
}

impl Resumed {
    /// The status line after a resume: what started, and what was skipped on the way.
    pub fn text(&self) -> String {
        let mut t = format!("run {}: resumed run {} from checkpoint step {}", self.run, self.parent, self.step);
        for s in &self.skipped {
            t.push_str(&format!("; skipped step {} ({})", s.step, s.reason));
        }
        t
    }
}

/// The Checkpoints screen's state: whose checkpoints, the list once loaded, the cursor.
#[derive(Clone, Debug, Default)]
pub struct CkptsView {
    /// The run whose checkpoints these are (from Home's list or the open run).
    pub record: Option<RunRecord>,
    pub list: Option<CkptList>,
    pub error: Option<String>,
    /// Row under the cursor; rows are newest first.
    pub cursor: usize,
    /// A `--verify` listing is on its way (reads every byte).
    pub verifying: bool,
    /// Back goes to the Run screen (else Home).
    pub from_run: bool,
}

impl CkptsView {
    pub fn open(record: RunRecord, from_run: bool) -> CkptsView {
        CkptsView { record: Some(record), from_run, ..CkptsView::default() }
    }

    pub fn run(&self) -> Option<&RunId> {
        self.record.as_ref().map(|r| &r.id)
    }

    /// Rows as drawn: newest first.
    pub fn rows(&self) -> Vec<&CheckpointRecord> {
        self.list.as_ref().map(|l| l.checkpoints.iter().rev().collect()).unwrap_or_default()
    }

    pub fn selected(&self) -> Option<&CheckpointRecord> {
        self.rows().get(self.cursor).copied()
    }

    /// A fresh list: the cursor starts on the newest verified checkpoint (the one a plain
    /// resume takes) and stays on the same step across reloads.
    pub fn set_list(&mut self, list: CkptList) {
        let keep = self.list.as_ref().and_then(|_| self.selected().map(|c| c.step));
        let target = keep.or_else(|| list.newest_verified().map(|c| c.step));
        self.cursor = target.and_then(|s| list.checkpoints.iter().rev().position(|c| c.step == s)).unwrap_or(0);
        self.list = Some(list);
        self.error = None;
        self.verifying = false;
    }

    pub fn on_action(&mut self, a: Action, page: usize) -> bool {
        let Some(to) = a.move_cursor(self.cursor, self.rows().len(), page) else { return false };
        self.cursor = to;
        true
    }
}

/// `yes (sha256)`, `NO: optim.bin is missing`.
fn verdict(c: &CheckpointRecord) -> String {
    match (&c.problem, c.verified) {
        (_, true) => format!("yes ({})", c.checked),
        (Some(p), false) => format!("NO: {p}"),
        (None, false) => "NO".into(),
    }
}

pub fn render(view: &CkptsView, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let rows = view.rows();
    let mut extra = match &view.list {
        Some(l) => format!("{} · {}", rows.len(), l.dir),
        None => "loading…".into(),
    };
    if view.verifying {
        extra.push_str(" · verifying every byte…");
    }
    let block = fmt::panel_block(fmt::title("checkpoints", extra), true);
    let inner = block.inner(area);
    block.render(area, buf);
    if let Some(e) = &view.error {
        Paragraph::new(Line::styled(e.clone(), Style::new().fg(Color::Red)))
            .wrap(Wrap { trim: true })
            .render(inner, buf);
        return;
    }
    let Some(list) = &view.list else {
        Paragraph::new(Line::styled("listing checkpoints…", fmt::dim())).render(inner, buf);
        return;
    };
    if rows.is_empty() {
        // The run's own reason (stopped before its first save, every = 0, removed), as R would say it.
        let why = view.record.as_ref().and_then(|r| {
            let mut plan = ResumePlan::new(r, None);
            plan.resolve(list);
            plan.refusal()
        });
        let text = match why {
            Some(why) => format!("no checkpoints: {why}"),
            None => {
                "no checkpoints: set checkpoint.every in the recipe, or stop the run gracefully (it saves one)".into()
            }
        };
        Paragraph::new(Line::styled(text, fmt::dim())).wrap(Wrap { trim: true }).render(inner, buf);
        return;
    }
    // Two lines under the table: the selected checkpoint's path and what R does.
    let detail_h = 2.min(inner.height.saturating_sub(2));
    let table_area = Rect { height: inner.height - detail_h, ..inner };
    // (header, width, priority)
    let cols: [(&str, u16, u8); 8] = [
        ("STEP", 8, 0),
        ("", 6, 1),
        ("LOSS", 7, 3),
        ("SIZE", 10, 4),
        ("AGE", 6, 5),
        ("BLOCKED", 9, 6),
        ("WRITE", 8, 7),
        ("VERIFIED", 24, 2),
    ];
    let keep = fit_columns(&cols.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>(), table_area.width);
    let header = Row::new(cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Cell::from(c.0))).style(fmt::dim());
    let avail = table_area.height.saturating_sub(1) as usize;
    let cursor = view.cursor.min(rows.len() - 1);
    let offset = (cursor + 1).saturating_sub(avail.max(1));
    let body = rows.iter().skip(offset).take(avail).map(|c| {
        let saved = c.saved_ms > 0;
        let cells = [
            Cell::from(c.step.to_string()),
            Cell::from(if list.latest == Some(c.step) { "LATEST" } else { "" }).style(Style::new().fg(Color::Cyan)),
            Cell::from(fmt::opt_num(c.loss)),
            Cell::from(fmt::bytes(c.bytes)),
            Cell::from(if saved { fmt::duration_ms(now_ms.saturating_sub(c.saved_ms)) } else { "-".into() }),
            Cell::from(if saved { format!("{:.1}ms", c.blocking_ms) } else { "-".into() }),
            Cell::from(if saved { format!("{:.0}ms", c.write_ms) } else { "-".into() }),
            Cell::from(verdict(c)),
        ];
        let style = if c.verified { Style::new() } else { Style::new().fg(Color::Red) };
        Row::new(cells.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c)).style(style)
    });
    let widths: Vec<Constraint> =
        cols.iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| Constraint::Length(c.1)).collect();
    let table = Table::new(body, widths)
        .header(header)
        .row_highlight_style(Style::new().bg(Color::DarkGray).add_modifier(Modifier::BOLD));
    let mut state = TableState::default().with_selected(Some(cursor - offset));
    StatefulWidget::render(table, table_area, buf, &mut state);
    if detail_h == 0 {
        return;
    }
    let Some(sel) = rows.get(cursor) else { return };
    let mut lines = vec![Line::from(vec![Span::styled("path ", fmt::dim()), Span::raw(sel.path.clone())])];
    if let Some(p) = sel.problem.as_ref().filter(|_| !sel.verified) {
        lines.push(Line::styled(format!("not verified: {p}"), Style::new().fg(Color::Red)));
    }
    let detail = Rect { y: table_area.y + table_area.height, height: detail_h, ..inner };
    Paragraph::new(lines).render(detail, buf);
}

/// Where the resume confirmation is in its short life.
#[derive(Clone, Debug, PartialEq)]
pub enum ResumeState {
    Asking,
    /// Confirmed; the request is with the server.
    Sending,
    /// The server refused: its message, until a key closes the overlay.
    Failed(String),
}

/// What `R` will start, shown before it is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct ResumePlan {
    pub parent: RunId,
    pub parent_name: String,
    pub recipe: String,
    pub world: u32,
    pub steps_planned: u64,
    /// The step the parent reached, and its `checkpoint.every`: why it may have no checkpoint.
    pub stopped_at: u64,
    pub every: Option<u64>,
    /// The checkpoint asked for; None: the newest that verifies, chosen (and checked again) by
    /// the server, which skips corrupt ones and says so.
    pub step: Option<u64>,
    /// The checkpoint the listing names for it (step, path, verified); None while listing.
    pub expect: Option<(u64, String, bool)>,
    /// The listing came back without a verified checkpoint: (its directory, any listed at all).
    pub none_verified: Option<(String, bool)>,
    /// The run is live (hung, say): kill it first, then restart from its newest verified
    /// checkpoint (issue 6's one-key restart).
    pub kill_first: bool,
    pub state: ResumeState,
}

/// The keys every confirmation ends with.
pub const CONFIRM_KEYS: &str = "y confirm · esc cancel";

impl ResumePlan {
    pub fn new(r: &RunRecord, pick: Option<&CheckpointRecord>) -> ResumePlan {
        let recipe = serde_json::from_str::<serde_json::Value>(&r.recipe_json).ok();
        ResumePlan {
            parent: r.id.clone(),
            parent_name: r.name.clone(),
            recipe: r.recipe_name.clone(),
            world: r.world_size,
            steps_planned: r.steps_planned,
            stopped_at: r.step,
            every: recipe.and_then(|v| v.pointer("/checkpoint/every").and_then(|e| e.as_u64())),
            step: pick.map(|c| c.step),
            expect: pick.map(|c| (c.step, c.path.clone(), c.verified)),
            none_verified: None,
            kill_first: r.status.is_live(),
            state: ResumeState::Asking,
        }
    }

    /// Fills in the newest verified checkpoint once the listing arrives.
    pub fn resolve(&mut self, list: &CkptList) {
        if self.step.is_none() && self.expect.is_none() && list.run == self.parent {
            match list.newest_verified() {
                Some(c) => self.expect = Some((c.step, c.path.clone(), true)),
                None => self.none_verified = Some((list.dir.clone(), !list.checkpoints.is_empty())),
            }
        }
    }

    /// Why this resume cannot start, known before asking the server: no checkpoint verifies,
    /// or the one chosen is the run's last step.
    pub fn refusal(&self) -> Option<String> {
        if let Some((dir, any)) = &self.none_verified {
            return Some(match (any, self.every) {
                (true, _) => format!("no checkpoint in {dir} verifies (C lists them, v verifies every byte)"),
                (false, Some(every)) if self.kill_first && every > self.stopped_at => format!(
                    "it is at step {}, before its first save at step {every} (checkpoint.every = {every})",
                    self.stopped_at
                ),
                (false, Some(every)) => crate::store::checkpoints::why_none(self.stopped_at, every, dir),
                (false, None) => format!("there are no checkpoints in {dir}"),
            });
        }
        match self.expect.as_ref().map(|e| e.0) {
            Some(s) if s >= self.steps_planned => Some(format!(
                "checkpoint step {s} is the run's last (train.steps = {}): nothing remains to train; pick an \
                 earlier one, or `flightdeck resume {} --set train.steps=N`",
                self.steps_planned, self.parent
            )),
            _ => None,
        }
    }

    /// `y` may send it: nothing refuses it, and a kill waits for the listing to name the
    /// checkpoint (killing a run that has none to restart from would only lose it).
    pub fn ready(&self) -> bool {
        self.refusal().is_none() && !(self.kill_first && self.expect.is_none())
    }

    /// The overlay's lines, above its keys.
    pub fn lines(&self) -> Vec<Line<'static>> {
        let key = |k: &str| Span::styled(format!("{k:<9}"), fmt::dim());
        let red = Style::new().fg(Color::Red);
        let refusal = self.refusal();
        let mut out = Vec::new();
        match (self.kill_first, &refusal) {
            (true, Some(_)) => out.push(Line::styled(
                format!("Run {} is live and has nothing to restart from: y would only kill it", self.parent),
                red.add_modifier(Modifier::BOLD),
            )),
            (true, None) => out.push(Line::styled(
                format!("Kill run {} first (every rank: SIGTERM, then SIGKILL), then", self.parent),
                red.add_modifier(Modifier::BOLD),
            )),
            (false, _) => {}
        }
        out.push(Line::from(vec![
            Span::raw("Start a child run of "),
            Span::styled(self.parent_name.clone(), Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(" ({})", self.parent)),
        ]));
        let which = if self.step.is_some() { "selected" } else { "newest verified" };
        let step = match &self.expect {
            Some((s, _, _)) => format!("{s} ({which})"),
            None if self.none_verified.is_some() => "none: no checkpoint of this run verifies".into(),
            None => "newest verified (listing…)".into(),
        };
        out.push(Line::from(vec![key("step"), Span::raw(step)]));
        if let Some((_, path, _)) = &self.expect {
            out.push(Line::from(vec![key("path"), Span::raw(path.clone())]));
        }
        out.push(Line::from(vec![key("recipe"), Span::raw(self.recipe.clone())]));
        out.push(Line::from(vec![key("world"), Span::raw(format!("{} ranks (as saved)", self.world))]));
        if let (Some((s, _, _)), None) = (&self.expect, &refusal) {
            out.push(Line::from(vec![key("trains"), Span::raw(format!("steps {}–{}", s + 1, self.steps_planned))]));
        }
        if let Some((_, _, false)) = &self.expect {
            out.push(Line::styled("not verified: the server checks it again and refuses it if it is corrupt", red));
        }
        match (&self.state, refusal) {
            (ResumeState::Failed(m), _) => out.push(Line::styled(format!("resume refused: {m}"), red)),
            (_, Some(why)) => out.push(Line::styled(format!("cannot resume: {why}"), red)),
            (ResumeState::Sending, None) => out.push(Line::styled("resuming…", Style::new().fg(Color::Yellow))),
            (ResumeState::Asking, None) => {}
        }
        out
    }

    /// The keys on the overlay's last row; `kill` is the key that kills instead.
    pub fn keys(&self, kill: &str) -> String {
        match &self.state {
            ResumeState::Failed(_) => "any key: close".into(),
            ResumeState::Sending => "esc hide (the child run still opens)".into(),
            ResumeState::Asking if self.refusal().is_some() && self.kill_first => format!("{kill} kill it · esc close"),
            ResumeState::Asking if self.refusal().is_some() => "esc close".into(),
            ResumeState::Asking if !self.ready() => "waiting for the checkpoint listing… · esc cancel".into(),
            ResumeState::Asking => CONFIRM_KEYS.into(),
        }
    }
}

/// The header line's text on this screen: whose checkpoints.
pub fn header(view: &CkptsView) -> Vec<Span<'static>> {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut out = vec![Span::styled("checkpoints", bold)];
    if let Some(r) = &view.record {
        out.push(Span::raw(format!(" · {} ", r.name)));
        out.push(Span::styled(r.status.name(), fmt::status_style(r.status)));
        out.push(Span::raw(format!(" · {}", fmt::step_of(r.step, r.steps_planned))));
        out.extend(lineage_spans(r));
        out.push(Span::styled(format!(" · {}", r.id), fmt::dim()));
    }
    out
}

/// ` · ↳ PARENT@STEP` for a resumed run, with `restart N after a CAUSE` when recovery started it
/// (nothing for a fresh one).
pub fn lineage_spans(r: &RunRecord) -> Vec<Span<'static>> {
    let restart = r.restart.as_ref().map(|x| format!(" (restart {} after a {})", x.attempt, x.cause.name()));
    match (&r.parent, &r.resumed_from) {
        (Some(p), Some(from)) => vec![Span::styled(
            format!(" · ↳ {p}@{}{}", from.step, restart.unwrap_or_default()),
            Style::new().fg(Color::Yellow),
        )],
        (Some(p), None) => vec![Span::styled(format!(" · ↳ {p}"), Style::new().fg(Color::Yellow))],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{Cause, Lineage, Restart, ResumePoint, RunMeta, RunRecord};

    fn child(restart: Option<Restart>) -> RunRecord {
        let meta = RunMeta {
            name: "r".into(),
            recipe_name: "r".into(),
            recipe_path: "r.toml".into(),
            recipe_json: "{}".into(),
            world_size: 2,
            steps_planned: 40,
        };
        let parent = crate::ids::RunId("20261206T000000-abcd".into());
        let lineage = Lineage { parent, from: ResumePoint { step: 20, path: "p".into() }, restart };
        RunRecord::starting(crate::ids::RunId::new_now(), meta, vec!["local".into()], vec![], Some(lineage))
    }

    fn text(r: &RunRecord) -> String {
        super::lineage_spans(r).iter().map(|s| s.content.to_string()).collect()
    }

    #[test]
    fn a_run_recovery_restarted_says_which_restart_and_why() {
        assert_eq!(text(&child(None)), " · ↳ 20261206T000000-abcd@20");
        let restarted = child(Some(Restart { attempt: 2, cause: Cause::Hang }));
        assert_eq!(text(&restarted), " · ↳ 20261206T000000-abcd@20 (restart 2 after a hang)");
    }
}
