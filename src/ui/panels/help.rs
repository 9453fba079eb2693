//! The help overlay, generated from the active keymap: every action with its keys.
use crate::ui::action::Action;
use crate::ui::fmt;
use crate::ui::keymap::Keymap;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Widget};

pub fn lines(keymap: &Keymap) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut layouts = Vec::new();
    for &a in Action::ALL {
        let keys = keymap.keys(a).join(" ");
        if a.layout_index().is_some() {
            layouts.push(keys);
            continue;
        }
        out.push(Line::from(vec![
            Span::styled(format!("{:<16}", fmt::truncate(&keys, 15)), Style::new().fg(Color::Cyan)),
            Span::raw(a.help()),
        ]));
    }
    out.push(Line::from(vec![
        Span::styled(format!("{:<16}", fmt::truncate(&layouts.join(" "), 15)), Style::new().fg(Color::Cyan)),
        Span::raw("layouts 1–9 (run: default, debug, gpu, then yours)"),
    ]));
    out.push(Line::from(vec![
        Span::styled(format!("{:<16}", "mouse"), Style::new().fg(Color::Cyan)),
        Span::raw("scroll a panel, click to focus it"),
    ]));
    out
}

pub fn render(keymap: &Keymap, scroll: usize, area: Rect, buf: &mut Buffer) {
    let all = lines(keymap);
    let w = area.width.min(72);
    let h = area.height.min(all.len() as u16 + 2);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    let title = Line::from(vec![
        Span::styled(" help ", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!("· keys from the keymap · {} close ", keymap.hint(Action::Back))),
    ]);
    let block = fmt::panel_block(title, true);
    let inner = block.inner(r);
    block.render(r, buf);
    let max_scroll = all.len().saturating_sub(inner.height as usize);
    let lines: Vec<Line> = all.into_iter().skip(scroll.min(max_scroll)).collect();
    Paragraph::new(lines).render(inner, buf);
}
