//! The verdict banner (one line above every Run layout while a verdict holds, or after a run
//! that ended hung) and the `verdict` panel with the whole of it: every culprit, the collective,
//! the ranks waiting, how long.
use crate::protocol::{Verdict, VerdictKind};
use crate::ui::fmt;
use crate::ui::hang::Shown;
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget, Wrap};

fn style(kind: VerdictKind) -> Style {
    match kind {
        VerdictKind::Straggler => Style::new().fg(Color::Black).bg(Color::Yellow),
        _ => Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

/// `rank 1 (local, pid 4242)`, `ranks 0,1,2`, or `all 3 ranks`.
pub fn culprits_text(v: &Verdict, world: usize) -> String {
    match v.culprits.as_slice() {
        [] => "no rank named".into(),
        [c] => match c.pid {
            Some(pid) => format!("rank {} ({}, pid {pid})", c.rank, c.host),
            None => format!("rank {} ({})", c.rank, c.host),
        },
        many if many.len() == world && world > 1 => format!("all {world} ranks"),
        many => {
            let ranks: Vec<String> = many.iter().map(|c| c.rank.to_string()).collect();
            format!("ranks {}", ranks.join(","))
        }
    }
}

fn collective_text(v: &Verdict) -> Option<String> {
    let c = v.collective.as_ref()?;
    Some(format!("{} #{} {} step {}", c.op.name(), c.seq, fmt::bytes(c.bytes), c.step.0))
}

/// How long the condition has held (live) or held until the run ended.
fn held_ms(m: &RunModel, v: &Verdict, live: bool, now_ms: u64) -> u64 {
    let until = if live { now_ms } else { m.state.record.ended_ms.unwrap_or(v.detected_ms) };
    until.max(v.detected_ms).saturating_sub(v.since_ms)
}

/// The one-line banner text in `width` cells: what, how long and who stay longest; the
/// waiting ranks, then the collective, go first when narrow.
pub fn banner_text(m: &RunModel, shown: Shown<'_>, now_ms: u64, width: usize) -> String {
    let v = shown.verdict;
    let head = match (v.kind, v.kind.is_hang(), shown.live) {
        (VerdictKind::Failure, _, true) => "FAILURE",
        (VerdictKind::Failure, _, false) => "LAST FAILURE",
        (_, true, true) => "HANG",
        (_, true, false) => "LAST HANG",
        (_, false, _) => "SLOW",
    };
    let held = fmt::duration_ms(held_ms(m, v, shown.live, now_ms));
    let mut parts = vec![(format!("{head} {}", v.kind.name()), 0), (culprits_text(v, m.world()), 2)];
    parts.extend(collective_text(v).map(|c| (c, 3)));
    parts.push((if shown.live { format!("for {held}") } else { format!("lasted {held}") }, 1));
    if !v.waiting.is_empty() {
        let w: Vec<String> = v.waiting.iter().map(u32::to_string).collect();
        parts.push((format!("waiting: {}", w.join(",")), 4));
    }
    // Each part is followed by " · " (3 cells), and the line has a space at each end.
    let kept = fmt::fit_parts(parts, width.saturating_sub(2), |p: &String| p.chars().count() + 3);
    fmt::truncate(&format!(" {} ", kept.join(" · ")), width)
}

pub fn render_banner(m: &RunModel, shown: Shown<'_>, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let text = banner_text(m, shown, now_ms, area.width as usize);
    let st = style(shown.verdict.kind);
    buf.set_style(area, st);
    Paragraph::new(Line::styled(text, st)).render(area, buf);
}

/// The `verdict` panel: the verdict on screen in full, then any other verdict that holds now.
pub fn render_panel(m: Option<&RunModel>, focused: bool, now_ms: u64, area: Rect, buf: &mut Buffer) {
    let shown = m.and_then(|m| m.shown_verdict().map(|s| (m, s)));
    let extra = shown.map(|(_, s)| s.verdict.kind.name().to_string()).unwrap_or_default();
    let block = fmt::panel_block(fmt::title("verdict", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let Some((m, shown)) = shown else {
        let text = match m {
            Some(m) if m.is_live() && m.live_verdicts.is_none() => "waiting for the analysis…",
            Some(m) if m.is_live() => "no verdict: the ranks are progressing",
            Some(_) => "no hang in this run",
            None => "",
        };
        Paragraph::new(Line::styled(text, fmt::dim())).render(inner, buf);
        return;
    };
    let v = shown.verdict;
    let key = Style::new().fg(Color::Cyan);
    let mut lines = vec![Line::from(vec![
        Span::styled(format!(" {} ", v.kind.name()), style(v.kind)),
        Span::raw(" "),
        Span::raw(v.summary.clone()),
    ])];
    for c in &v.culprits {
        let pid = c.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
        let phase = c.phase.map(|p| format!(", phase {}", p.name())).unwrap_or_default();
        lines.push(Line::from(vec![
            Span::styled(format!("rank {}", c.rank), Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
            Span::raw(format!(" ({}{pid}{phase}, step {}, last seq {}): {}", c.host, c.step, c.last_seq, c.detail)),
        ]));
    }
    if let Some(c) = &v.collective {
        let text = format!(
            "{} #{} · {} elements · {} · step {}",
            c.op.name(),
            c.seq,
            c.elements,
            fmt::bytes(c.bytes),
            c.step.0
        );
        lines.push(Line::from(vec![Span::styled("collective ", key), Span::raw(text)]));
    }
    if !v.waiting.is_empty() {
        let w: Vec<String> = v.waiting.iter().map(u32::to_string).collect();
        lines.push(Line::from(vec![Span::styled("waiting ", key), Span::raw(format!("ranks {}", w.join(",")))]));
    }
    let held = fmt::duration_ms(held_ms(m, v, shown.live, now_ms));
    let after = fmt::duration_ms(v.duration_ms());
    let when = if shown.live {
        format!("holds for {held}; detected after {after}")
    } else {
        format!("lasted {held}; detected after {after}")
    };
    lines.push(Line::from(vec![Span::styled("time ", key), Span::raw(when)]));
    let others = m.live_verdicts.iter().flatten().filter(|o| !std::ptr::eq(*o, v));
    for o in others {
        lines.push(Line::from(vec![Span::styled(format!("{} ", o.kind.name()), key), Span::raw(o.summary.clone())]));
    }
    Paragraph::new(lines).wrap(Wrap { trim: false }).render(inner, buf);
}
