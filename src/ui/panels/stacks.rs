//! The stacks viewer: `s` dumps the selected rank's stacks, `S` every rank's, off the UI task.
//! Groups of ranks with identical main threads, largest first, the odd one out marked; the
//! main thread's frames, then the other threads one line each. A `stacks` panel when the
//! layout has one, else an overlay.
use crate::protocol::{StackGroup, StackReport, ThreadStack};
use crate::ui::action::Action;
use crate::ui::fmt;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Widget};

/// What the viewer holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum StacksState {
    #[default]
    Empty,
    /// A dump is under way (it can take seconds: each rank is stopped and unwound).
    Dumping {
        rank: Option<u32>,
        since_ms: u64,
    },
    Ready {
        rank: Option<u32>,
        report: Box<StackReport>,
    },
    Failed {
        rank: Option<u32>,
        error: String,
    },
}

#[derive(Clone, Debug, Default)]
pub struct StacksView {
    pub state: StacksState,
    pub scroll: usize,
}

fn whom(rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("rank {r}"),
        None => "all ranks".into(),
    }
}

impl StacksView {
    pub fn start(&mut self, rank: Option<u32>, now_ms: u64) {
        self.state = StacksState::Dumping { rank, since_ms: now_ms };
        self.scroll = 0;
    }

    pub fn dumping(&self) -> bool {
        matches!(self.state, StacksState::Dumping { .. })
    }

    /// Scroll keys; true when taken.
    pub fn on_action(&mut self, a: Action, page: usize) -> bool {
        self.scroll = match a {
            Action::Up => self.scroll.saturating_sub(1),
            Action::Down => self.scroll + 1,
            Action::PageUp => self.scroll.saturating_sub(page),
            Action::PageDown => self.scroll + page,
            Action::Top => 0,
            Action::Bottom => usize::MAX / 2,
            _ => return false,
        };
        true
    }

    pub fn title(&self) -> String {
        match &self.state {
            StacksState::Empty => String::new(),
            StacksState::Dumping { rank, .. } => format!("{} · dumping…", whom(*rank)),
            StacksState::Ready { rank, report } => format!("{} · {} group(s)", whom(*rank), report.groups.len()),
            StacksState::Failed { rank, .. } => format!("{} · failed", whom(*rank)),
        }
    }

    pub fn lines(&self, now_ms: u64) -> Vec<Line<'static>> {
        match &self.state {
            StacksState::Empty => vec![Line::styled("s: stacks of the selected rank · S: of all ranks", fmt::dim())],
            StacksState::Dumping { rank, since_ms } => {
                let t = fmt::duration_ms(now_ms.saturating_sub(*since_ms));
                vec![Line::styled(format!("dumping stacks of {}… ({t})", whom(*rank)), Style::new().fg(Color::Yellow))]
            }
            StacksState::Failed { rank, error } => {
                vec![Line::styled(format!("no stacks of {}: {error}", whom(*rank)), Style::new().fg(Color::Red))]
            }
            StacksState::Ready { report, .. } => report_lines(report),
        }
    }
}

/// The main (training) thread: tid = the rank's pid, else the first.
fn main_thread<'a>(g: &'a StackGroup, report: &StackReport) -> Option<&'a ThreadStack> {
    let pid = g.ranks.first().and_then(|r| report.timings.iter().find(|t| t.0 == *r)).map(|t| t.1);
    g.threads.iter().find(|t| Some(t.tid) == pid).or_else(|| g.threads.first())
}

fn thread_name(t: &ThreadStack) -> String {
    format!("thread {}{}", t.tid, t.name.as_ref().map(|n| format!(" \"{n}\"")).unwrap_or_default())
}

pub fn report_lines(report: &StackReport) -> Vec<Line<'static>> {
    let mut groups: Vec<&StackGroup> = report.groups.iter().collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.ranks.len()));
    let largest = groups.first().map(|g| g.ranks.len()).unwrap_or(0);
    let total: usize = groups.iter().map(|g| g.ranks.len()).sum();
    let timings: Vec<String> = report
        .timings
        .iter()
        .map(|(rank, _, tool, ms)| format!("{rank}: {} {}", tool.map_or("-", |t| t.name()), fmt::duration_ms(*ms)))
        .collect();
    let mut out = vec![Line::styled(
        format!("{} group(s) of {total} rank(s) · {}", groups.len(), timings.join(", ")),
        fmt::dim(),
    )];
    let bold = Style::new().add_modifier(Modifier::BOLD);
    for (i, g) in groups.iter().enumerate() {
        let ranks: Vec<String> = g.ranks.iter().map(u32::to_string).collect();
        let noun = if g.ranks.len() == 1 { "rank" } else { "ranks" };
        // A lone rank beside a group of identical ones is the one to look at.
        let odd = i > 0 && g.ranks.len() < largest;
        let mut head = vec![Span::styled(format!("── {noun} {} ", ranks.join(",")), bold.fg(Color::Cyan))];
        head.push(Span::styled(format!("({} of {total}) ", g.ranks.len()), fmt::dim()));
        if odd {
            let st = Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD);
            head.push(Span::styled(" ◀ odd one out: its main thread differs ", st));
        }
        out.push(Line::from(head));
        let main = main_thread(g, report);
        if let Some(t) = main {
            out.push(Line::styled(format!("  main {}", thread_name(t)), bold));
            for (n, f) in t.frames.iter().enumerate() {
                let at = f.location.as_ref().map(|l| format!("  at {l}")).unwrap_or_default();
                out.push(Line::raw(format!("    #{n:<2} {}{at}", f.function)));
            }
        }
        let others: Vec<&ThreadStack> =
            g.threads.iter().filter(|t| !main.is_some_and(|m| std::ptr::eq(m, *t))).collect();
        if !others.is_empty() {
            out.push(Line::styled(format!("  {} other thread(s), innermost frame:", others.len()), fmt::dim()));
            for t in others {
                let top = t.frames.first().map(|f| f.function.as_str()).unwrap_or("-");
                out.push(Line::styled(format!("    {}: {top}", thread_name(t)), fmt::dim()));
            }
        }
    }
    for (rank, why) in &report.failures {
        out.push(Line::styled(format!("rank {rank}: no stacks: {why}"), Style::new().fg(Color::Red)));
    }
    out
}

fn draw(view: &StacksView, now_ms: u64, inner: Rect, buf: &mut Buffer) {
    let all = view.lines(now_ms);
    let max_scroll = all.len().saturating_sub(inner.height as usize);
    let lines: Vec<Line> = all.into_iter().skip(view.scroll.min(max_scroll)).collect();
    // Frames stay one per line (cut at the edge); a message wraps so it is read whole.
    let p = Paragraph::new(lines);
    match view.state {
        StacksState::Ready { .. } => p.render(inner, buf),
        _ => p.wrap(ratatui::widgets::Wrap { trim: false }).render(inner, buf),
    }
}

/// As a panel of the layout.
pub fn render(view: &StacksView, focused: bool, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let block = fmt::panel_block(fmt::title("stacks", view.title()), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    draw(view, now_ms, inner, buf);
}

/// As an overlay over most of the screen.
pub fn render_overlay(view: &StacksView, close_key: &str, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let w = area.width.saturating_sub(4).max(area.width.min(20));
    let h = area.height.saturating_sub(2).max(area.height.min(5));
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    let title = format!("{} · j/k scroll · {close_key} close", view.title());
    let block = fmt::panel_block(fmt::title("stacks", title), true);
    let inner = block.inner(r);
    block.render(r, buf);
    draw(view, now_ms, inner, buf);
}
