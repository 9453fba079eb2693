//! Rank logs: merged or one rank at a time, following the tail or scrolled back, with search.
use crate::ui::action::Action;
use crate::ui::fmt;
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

#[derive(Clone, Debug)]
pub struct LogsView {
    /// None = every rank merged.
    pub rank: Option<u32>,
    pub follow: bool,
    /// Lines scrolled back from the tail (when not following).
    pub back: usize,
    /// Only lines containing this (case-insensitive) are shown.
    pub search: String,
}

impl Default for LogsView {
    fn default() -> LogsView {
        LogsView { rank: None, follow: true, back: 0, search: String::new() }
    }
}

impl LogsView {
    pub fn on_action(&mut self, a: Action, world: usize, page: usize) -> bool {
        match a {
            Action::Up => self.scroll_back(1),
            Action::PageUp => self.scroll_back(page),
            Action::Down => self.scroll_fwd(1),
            Action::PageDown => self.scroll_fwd(page),
            Action::Top => self.scroll_back(usize::MAX / 2),
            Action::Bottom => {
                self.back = 0;
                self.follow = true;
            }
            Action::Follow => {
                self.follow = !self.follow;
                if self.follow {
                    self.back = 0;
                }
            }
            Action::NextLogRank => {
                self.rank = match self.rank {
                    None if world > 0 => Some(0),
                    Some(r) if (r as usize) + 1 < world => Some(r + 1),
                    _ => None,
                };
            }
            Action::PrevLogRank => {
                self.rank = match self.rank {
                    None => world.checked_sub(1).map(|r| r as u32),
                    Some(0) => None,
                    Some(r) => Some(r - 1),
                };
            }
            _ => return false,
        }
        true
    }

    fn scroll_back(&mut self, n: usize) {
        self.follow = false;
        self.back = self.back.saturating_add(n);
    }

    fn scroll_fwd(&mut self, n: usize) {
        self.back = self.back.saturating_sub(n);
        if self.back == 0 {
            self.follow = true;
        }
    }
}

pub fn render(model: Option<&RunModel>, view: &LogsView, focused: bool, area: Rect, buf: &mut Buffer) {
    let who = view.rank.map(|r| format!("rank {r}")).unwrap_or_else(|| "merged".into());
    let mut extra = format!("{who} · {}", if view.follow { "follow" } else { "paused" });
    if !view.search.is_empty() {
        extra.push_str(&format!(" · /{}", view.search));
    }
    let block = fmt::panel_block(fmt::title("logs", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(model) = model else { return };
    let needle = view.search.to_lowercase();
    let lines: Vec<_> = model
        .logs
        .iter()
        .filter(|l| view.rank.is_none_or(|r| r == l.rank))
        .filter(|l| needle.is_empty() || l.line.to_lowercase().contains(&needle))
        .collect();
    if lines.is_empty() {
        let why = match (view.search.as_str(), view.rank) {
            ("", None) => "no log lines".to_string(),
            ("", Some(r)) => format!("no log lines from rank {r}"),
            (s, None) => format!("no match for \"{s}\""),
            (s, Some(r)) => format!("no match for \"{s}\" in rank {r}"),
        };
        Paragraph::new(Line::styled(why, fmt::dim())).render(inner, buf);
        return;
    }
    let h = inner.height as usize;
    let back = if view.follow { 0 } else { view.back.min(lines.len().saturating_sub(h)) };
    let end = lines.len() - back;
    let start = end.saturating_sub(h);
    let text: Vec<Line> = lines[start..end]
        .iter()
        .map(|l| {
            let tag = Span::styled(format!("{:>3} ", l.rank), Style::new().fg(Color::DarkGray));
            let body = if needle.is_empty() {
                Span::raw(l.line.clone())
            } else {
                Span::styled(l.line.clone(), Style::new().add_modifier(Modifier::BOLD))
            };
            fmt::cut_spans(vec![tag, body], inner.width as usize)
        })
        .collect();
    Paragraph::new(text).render(inner, buf);
}
