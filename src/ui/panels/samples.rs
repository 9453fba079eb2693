//! GRPO's newest sampled completions, newest first: the step, the reward (green when the answer
//! was right), the prompt's end and the completion. Read from the run's log lines
//! (`record::SampleLine`), so a finished run shows its last ones from the history.
use crate::record::SampleLine;
use crate::ui::fmt;
use crate::ui::model::RunModel;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

pub fn render(model: Option<&RunModel>, focused: bool, area: Rect, buf: &mut Buffer) {
    let rows = area.height.saturating_sub(2) as usize;
    let newest: Vec<SampleLine> = model
        .map(|m| m.logs.iter().rev().filter_map(|l| SampleLine::parse(&l.line)).take(rows).collect())
        .unwrap_or_default();
    let extra = newest.first().map(|s| format!("step {}", s.step)).unwrap_or_default();
    let block = fmt::panel_block(fmt::title("samples", extra), focused);
    let inner = block.inner(area);
    block.render(area, buf);
    if newest.is_empty() {
        Paragraph::new(Line::styled("no samples yet (grpo runs print grpo.samples completions a step)", fmt::dim()))
            .render(inner, buf);
        return;
    }
    let width = inner.width as usize;
    let lines: Vec<Line> = newest.iter().map(|s| line(s, width)).collect();
    Paragraph::new(lines).render(inner, buf);
}

/// `  12  1.0  …7*2= → 14;`: the prompt keeps its end (the question) in what the row leaves.
fn line(s: &SampleLine, width: usize) -> Line<'static> {
    let right = Style::new().fg(if s.reward >= 1.0 { Color::Green } else { Color::Red });
    let head = format!("{:>5} ", s.step);
    let reward = format!("{:>4} ", fmt::num(s.reward));
    let tail = format!(" → {}", s.completion);
    let room = width.saturating_sub(head.chars().count() + reward.chars().count() + tail.chars().count());
    let prompt = keep_end(&s.prompt, room);
    Line::from(vec![
        Span::styled(head, fmt::dim()),
        Span::styled(reward, right),
        Span::raw(prompt),
        Span::styled(tail, Style::new().fg(Color::Cyan)),
    ])
}

/// The last `n` characters of `s`, `…` first when cut.
fn keep_end(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n {
        return s.to_string();
    }
    if n == 0 {
        return String::new();
    }
    let kept: String = s.chars().skip(len + 1 - n).collect();
    format!("…{kept}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_prompt_keeps_its_question() {
        assert_eq!(super::keep_end("3+4=7;7*2=", 20), "3+4=7;7*2=");
        assert_eq!(super::keep_end("3+4=7;7*2=", 5), "…7*2=");
        assert_eq!(super::keep_end("3+4=7;7*2=", 1), "…");
        assert_eq!(super::keep_end("3+4=7;7*2=", 0), "");
    }
}
