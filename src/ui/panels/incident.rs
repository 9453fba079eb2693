//! The incident report viewer (`I`): the open run's newest incident report (verdict, timeline,
//! per-rank collectives, grouped stacks), as the server wrote it, in a scrollable overlay.
use crate::ui::action::Action;
use crate::ui::fmt;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Clear, Paragraph, Widget, Wrap};

/// What the viewer holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum IncidentState {
    #[default]
    Idle,
    /// Asked of the server; the answer fills it.
    Loading,
    /// The report file's path (None: kept in the history only) and its lines.
    Ready {
        path: Option<String>,
        lines: Vec<String>,
    },
    Failed(String),
}

/// The viewer: the report and how far it is scrolled.
#[derive(Clone, Debug, Default)]
pub struct IncidentView {
    pub state: IncidentState,
    pub scroll: usize,
}

impl IncidentView {
    pub fn start(&mut self) {
        *self = IncidentView { state: IncidentState::Loading, scroll: 0 };
    }

    /// The answer: a report's path and markdown, or why there is none.
    pub fn set(&mut self, result: Result<(Option<String>, String), String>) {
        self.state = match result {
            Ok((path, md)) => IncidentState::Ready { path, lines: md.lines().map(str::to_string).collect() },
            Err(e) => IncidentState::Failed(e),
        };
        self.scroll = 0;
    }

    fn len(&self) -> usize {
        match &self.state {
            IncidentState::Ready { lines, .. } => lines.len(),
            _ => 0,
        }
    }

    /// Scrolls by a movement action; false for any other action.
    pub fn on_action(&mut self, a: Action, page: usize) -> bool {
        match a.move_cursor(self.scroll, self.len(), page) {
            Some(s) => {
                self.scroll = s;
                true
            }
            None => false,
        }
    }
}

/// The viewer over most of `area`; `close_key` is the key that closes it. Report lines wider
/// than the viewer end in `…`; a message wraps.
pub fn render_overlay(view: &IncidentView, close_key: &str, area: Rect, buf: &mut Buffer) {
    let w = area.width.saturating_sub(4).max(area.width.min(20));
    let h = area.height.saturating_sub(2).max(area.height.min(5));
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    // What matters first, since a narrow title is cut: where in the report, the close key, the path.
    let title = match &view.state {
        IncidentState::Idle | IncidentState::Loading => format!("loading… · {close_key} close"),
        IncidentState::Failed(_) => format!("none · {close_key} close"),
        IncidentState::Ready { path, lines } => format!(
            "line {}/{} · {close_key} close · j/k PgUp/PgDn g/G scroll · {}",
            (view.scroll + 1).min(lines.len()),
            lines.len(),
            path.as_deref().unwrap_or("kept in the history")
        ),
    };
    let block = fmt::panel_block(fmt::title("incident report", title), true);
    let inner = block.inner(r);
    block.render(r, buf);
    let message =
        |text: &str, style: Style| Paragraph::new(Line::styled(text.to_string(), style)).wrap(Wrap { trim: true });
    match &view.state {
        IncidentState::Idle | IncidentState::Loading => {
            message("asking the server for the report…", fmt::dim()).render(inner, buf)
        }
        IncidentState::Failed(e) => message(e, Style::new().fg(Color::Red)).render(inner, buf),
        IncidentState::Ready { lines, .. } => {
            let width = inner.width as usize;
            let shown: Vec<Line> = lines.iter().skip(view.scroll).map(|l| Line::raw(fmt::truncate(l, width))).collect();
            Paragraph::new(shown).render(inner, buf);
        }
    }
}
