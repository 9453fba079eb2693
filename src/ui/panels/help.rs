//! The help overlay, generated from the active keymap: every action with its keys.
use crate::ui::action::Action;
use crate::ui::fmt;
use crate::ui::keymap::Keymap;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Widget};

/// Width of the keys column, its padding included.
const KEYS_COLUMN: usize = 16;

/// One line per action (the layouts on one), its text elided with `…` to fit `width` columns.
pub fn lines(keymap: &Keymap, width: usize) -> Vec<Line<'static>> {
    let text_width = width.saturating_sub(KEYS_COLUMN).max(1);
    let entry = |keys: &str, text: &str| {
        Line::from(vec![
            Span::styled(
                format!("{:<KEYS_COLUMN$}", fmt::truncate(keys, KEYS_COLUMN - 1)),
                Style::new().fg(Color::Cyan),
            ),
            Span::raw(fmt::truncate(text, text_width)),
        ])
    };
    let mut out = Vec::new();
    let mut layouts = Vec::new();
    for &a in Action::ALL {
        let keys = keymap.keys(a).join(" ");
        if a.layout_index().is_some() {
            layouts.push(keys);
            continue;
        }
        out.push(entry(&keys, a.help()));
    }
    out.push(entry(&layouts.join(" "), "layouts 1–9 (run: default, debug, gpu, then yours)"));
    out.push(entry("mouse", "scroll a panel, click to focus it"));
    out
}

/// Where the popup goes in `area`, and how many entries it shows at once (one row less than
/// its inside when they do not all fit: that row says how many more there are).
fn geometry(n: usize, area: Rect) -> (Rect, usize) {
    let w = area.width.min(72);
    let h = area.height.min(n as u16 + 2);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    let inside = h.saturating_sub(2) as usize;
    (r, if n > inside { inside.saturating_sub(1).max(1) } else { n })
}

/// How many entries `lines` makes: one per action but the layouts, theirs, and the mouse's.
fn entry_count() -> usize {
    Action::ALL.iter().filter(|a| a.layout_index().is_none()).count() + 2
}

/// The largest useful scroll offset in `area`: the last entry on the last row.
pub fn max_scroll(area: Rect) -> usize {
    let n = entry_count();
    n.saturating_sub(geometry(n, area).1)
}

pub fn render(keymap: &Keymap, scroll: usize, area: Rect, buf: &mut Buffer) {
    let n = entry_count();
    let (r, shown) = geometry(n, area);
    let all = lines(keymap, r.width.saturating_sub(2) as usize);
    Clear.render(r, buf);
    let title = Line::from(vec![
        Span::styled(" help ", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!("· keys from the keymap · {} close ", keymap.hint(Action::Back))),
    ]);
    let block = fmt::panel_block(title, true);
    let inner = block.inner(r);
    block.render(r, buf);
    let scroll = scroll.min(n.saturating_sub(shown));
    let mut lines: Vec<Line> = all.into_iter().skip(scroll).take(shown).collect();
    if shown < n {
        let (above, below) = (scroll, n - scroll - shown);
        let keys = format!("{}/{} scroll", keymap.hint(Action::PageDown), keymap.hint(Action::PageUp));
        let text = match (above, below) {
            (_, 0) => format!("end · {above} above · {keys}"),
            (0, _) => format!("{below} more below · {keys}"),
            _ => format!("{above} above · {below} more below · {keys}"),
        };
        let text = fmt::truncate(&text, inner.width as usize);
        lines.push(Line::styled(text, fmt::dim()));
    }
    Paragraph::new(lines).render(inner, buf);
}
