//! Events and alerts of the run: rank starts and exits, NaN losses, bad frames, notices, run end.
use crate::store::{EventKind, EventRecord};
use crate::ui::action::Action;
use crate::ui::fmt;
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

#[derive(Clone, Debug, Default)]
pub struct EventsView {
    /// Events scrolled back from the newest.
    pub back: usize,
}

impl EventsView {
    pub fn on_action(&mut self, a: Action, n: usize) -> bool {
        self.back = match a {
            Action::Up => (self.back + 1).min(n.saturating_sub(1)),
            Action::Down => self.back.saturating_sub(1),
            Action::Top => n.saturating_sub(1),
            Action::Bottom => 0,
            _ => return false,
        };
        true
    }
}

fn style(kind: EventKind) -> Style {
    match kind {
        EventKind::RankExited
        | EventKind::NanLoss
        | EventKind::BadFrame
        | EventKind::CheckpointFailed
        | EventKind::Refused
        | EventKind::Failure => Style::new().fg(Color::Red),
        EventKind::CheckpointSaved => Style::new().fg(Color::Green),
        EventKind::Verdict | EventKind::Incident => Style::new().fg(Color::Magenta),
        EventKind::RunEnded => Style::new().fg(Color::Cyan),
        EventKind::Notice => Style::new().fg(Color::Yellow),
        EventKind::RunStarted | EventKind::RankStarted => Style::new(),
    }
}

/// What the events panel counts as an alert (docs/cockpit.md): verdicts (hangs, deaths, lost
/// nodes, stragglers), failures a rank printed, NaN losses, failed saves, bad frames, refused
/// connections to the run's ports, and a rank that exited with an error or a signal. A clean
/// exit, a start, a save or a notice is not one.
pub fn is_alert(model: &RunModel, e: &EventRecord) -> bool {
    match e.kind {
        EventKind::Verdict
        | EventKind::Failure
        | EventKind::NanLoss
        | EventKind::CheckpointFailed
        | EventKind::Refused
        | EventKind::BadFrame => true,
        EventKind::RankExited => e
            .rank
            .and_then(|r| model.state.ranks.get(r as usize))
            .and_then(|info| info.exit.as_ref())
            .is_some_and(|exit| !exit.success()),
        EventKind::RunStarted
        | EventKind::RankStarted
        | EventKind::RunEnded
        | EventKind::Notice
        | EventKind::CheckpointSaved
        | EventKind::Incident => false,
    }
}

pub fn render(model: Option<&RunModel>, view: &EventsView, focused: bool, area: Rect, buf: &mut Buffer) {
    let n = model.map(|m| m.events.len()).unwrap_or(0);
    let alerts = model.map(|m| m.events.iter().filter(|e| is_alert(m, e)).count()).unwrap_or(0);
    let alerts = if alerts == 1 { "1 alert".to_string() } else { format!("{alerts} alerts") };
    let block = fmt::panel_block(fmt::title("events", format!("{n} · {alerts}")), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(model) = model else { return };
    let start_ms = model.state.record.created_ms;
    // Newest at the bottom, like a log; `back` scrolls toward older ones.
    let h = inner.height as usize;
    let end = model.events.len().saturating_sub(view.back);
    let from = end.saturating_sub(h);
    let lines: Vec<Line> = model
        .events
        .range(from..end)
        .map(|e| {
            let t = format!("+{:<6}", fmt::duration_ms(e.t_ms.saturating_sub(start_ms)));
            let spans = vec![Span::styled(t, fmt::dim()), Span::raw(" "), Span::styled(e.text.clone(), style(e.kind))];
            fmt::cut_spans(spans, inner.width as usize)
        })
        .collect();
    Paragraph::new(lines).render(inner, buf);
}
