//! Drawing the whole cockpit from `&App`: header, the current screen, footer, overlays.
//! Rendering only reads state.
use super::action::Action;
use super::app::{App, Input, Overlay, Screen};
use super::fmt::{self, STALE_MS};
use super::layout::PanelKind;
use super::panels::{
    banner, chart, ckpts, collectives, compare, events, gpu, heatmap, help, incident, logs, matrix, phases, ranks, rl,
    samples, stacks,
};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Widget, Wrap};

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height < 3 || area.width < 10 {
            Paragraph::new("flightdeck: terminal too small").render(area, buf);
            return;
        }
        self.header(Rect { height: 1, ..area }, buf);
        let body = self.body();
        if let (true, Some(m)) = (self.banner_shown() && body.y > area.y + 1, self.run.model.as_ref()) {
            if let Some(shown) = m.shown_verdict() {
                banner::render_banner(m, shown, self.now_ms(), Rect { y: area.y + 1, height: 1, ..area }, buf);
            }
        }
        match self.screen {
            Screen::Home => self.home.render(self.now_ms(), body, buf),
            Screen::Run | Screen::Compare => self.panels(buf),
            Screen::Checkpoints => ckpts::render(&self.ckpts, self.now_ms(), body, buf),
        }
        self.footer(Rect { y: area.y + area.height - 1, height: 1, ..area }, buf);
        match &self.overlay {
            Some(Overlay::Help { scroll }) => help::render(&self.keymap, *scroll, body, buf),
            Some(Overlay::Stacks) => {
                stacks::render_overlay(&self.run.stacks, self.keymap.hint(Action::Back), self.now_ms(), body, buf)
            }
            Some(Overlay::Incident) => {
                incident::render_overlay(&self.run.incident, self.keymap.hint(Action::Back), body, buf)
            }
            Some(Overlay::ConfirmKill { run, name }) => {
                let text = format!("Kill run {name} ({run})? Every rank gets SIGKILL; nothing is saved.");
                let lines = vec![Line::styled(text, Style::new().fg(Color::Red))];
                popup(" kill ", lines, ckpts::CONFIRM_KEYS, body, buf);
            }
            Some(Overlay::ConfirmResume(plan)) => {
                let keys = plan.keys(self.keymap.hint(Action::Kill));
                popup(" resume · a child run ", plan.lines(), &keys, body, buf)
            }
            Some(Overlay::ExportFormat { run }) => {
                let text = format!("Export run {} ({}) into ./{}-{}-FORMAT as:", run.name, run.id, run.name, run.id);
                let choices: Vec<String> =
                    super::results::FORMAT_KEYS.iter().map(|(key, f)| format!("{key} {}", f.name())).collect();
                let lines = vec![Line::raw(text), Line::styled(choices.join(" · "), Style::new().fg(Color::Cyan))];
                popup(" export ", lines, "a letter picks · any other key cancels", body, buf);
            }
            Some(Overlay::ConfirmStop { run, name, command }) => {
                let text = if *command {
                    format!(
                        "Stop run {name} ({run})? Its ranks get SIGTERM, then SIGKILL after a grace. \
                         Flightdeck cannot checkpoint a program it only runs: what survives is what the \
                         program saves itself on SIGTERM."
                    )
                } else {
                    format!(
                        "Stop run {name} ({run}) gracefully? Every rank stops at its next step boundary and \
                         the run saves a checkpoint (SIGUSR1; SIGTERM if the save overruns its grace, then \
                         SIGKILL)."
                    )
                };
                let lines = vec![Line::styled(text, Style::new().fg(Color::Yellow))];
                popup(" stop ", lines, ckpts::CONFIRM_KEYS, body, buf);
            }
            Some(Overlay::Picker { recipes, cursor }) => {
                let lines: Vec<Line> = match recipes {
                    None => vec![Line::styled("listing recipes/…", fmt::dim())],
                    Some(r) if r.is_empty() => vec![Line::styled("no recipes/*.toml here", fmt::dim())],
                    Some(r) => r
                        .iter()
                        .enumerate()
                        .map(|(i, r)| {
                            let st = if i == *cursor { Style::new().bg(Color::DarkGray) } else { Style::new() };
                            let mut spans = vec![Span::styled(r.path.clone(), st)];
                            if r.no_gpu_here {
                                spans.push(Span::styled("  needs CUDA: no NVIDIA driver here", fmt::dim()));
                            }
                            Line::from(spans)
                        })
                        .collect(),
                };
                let keys =
                    format!("enter launch · {} add k=v overrides · esc cancel", self.keymap.hint(Action::Command));
                popup(" launch a recipe ", lines, &keys, body, buf);
            }
            None => {}
        }
    }
}

/// A confirmation (or the recipe list) in the middle of `area`: `lines` wrapped to its width,
/// and `keys` always on its last row. Lines that do not fit are cut, the last shown ending in `…`.
fn popup(title: &str, lines: Vec<Line>, keys: &str, area: Rect, buf: &mut Buffer) {
    let w = area.width.min(76);
    let text = Paragraph::new(lines).wrap(Wrap { trim: true });
    let rows = text.line_count(w.saturating_sub(2)) as u16;
    let h = (rows + 3).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    Clear.render(r, buf);
    let block = fmt::panel_block(Line::from(title.to_string()), true);
    let inner = block.inner(r);
    block.render(r, buf);
    if inner.height == 0 {
        return;
    }
    let text_area = Rect { height: inner.height - 1, ..inner };
    text.render(text_area, buf);
    if rows > text_area.height && text_area.height > 0 && text_area.width > 0 {
        let (x, y) = (text_area.right() - 1, text_area.bottom() - 1);
        buf[(x, y)].set_symbol("…");
    }
    let keys_row = Rect { y: inner.bottom() - 1, height: 1, ..inner };
    Paragraph::new(Line::styled(fmt::truncate(keys, inner.width as usize), fmt::dim())).render(keys_row, buf);
}

impl App {
    fn header(&self, area: Rect, buf: &mut Buffer) {
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let mut spans = vec![Span::styled(" flightdeck ", bold.fg(Color::Black).bg(Color::Cyan)), Span::raw(" ")];
        match self.screen {
            Screen::Home => spans.push(Span::styled("home", bold)),
            Screen::Compare => spans.push(Span::styled(format!("compare · {} runs", self.compare.runs.len()), bold)),
            Screen::Checkpoints => spans.extend(ckpts::header(&self.ckpts)),
            Screen::Run => match &self.run.model {
                None => spans.push(Span::raw(format!("opening {}…", self.run.query))),
                Some(m) => {
                    // (spans, priority): when narrow, the name, status and id stay longest.
                    let r = &m.state.record;
                    let mut parts: Vec<(Vec<Span>, u8)> = vec![
                        (vec![Span::styled(r.name.clone(), bold)], 0),
                        (vec![Span::raw(" "), Span::styled(r.status.name(), fmt::status_style(r.status))], 0),
                        (vec![Span::raw(format!(" · {}", fmt::step_of(r.step, r.steps_planned)))], 2),
                        (vec![Span::raw(format!(" · {} ranks", m.world()))], 6),
                        (ckpts::lineage_spans(r), 4),
                        (gpu::mfu_spans(m), 3),
                    ];
                    if let Some(g) = m.goodput.as_ref().filter(|_| !m.is_live()) {
                        parts.push((vec![Span::raw(format!(" · goodput {:.0}%", 100.0 * g.ratio))], 5));
                    }
                    if let (true, Some(t)) = (m.is_live(), m.last_data_ms) {
                        let age = self.now_ms().saturating_sub(t);
                        let st = if age > STALE_MS { Style::new().fg(Color::Yellow) } else { fmt::dim() };
                        parts.push((vec![Span::styled(format!(" · data {} ago", fmt::duration_ms(age)), st)], 5));
                    }
                    let layout = self.run_layouts().get(self.run.layout).map(|l| l.name.clone()).unwrap_or_default();
                    let pinned = if self.layout_pin.is_some() { " (pinned)" } else { "" };
                    parts.push((vec![Span::styled(format!(" · layout {layout}{pinned}"), fmt::dim())], 7));
                    parts.push((vec![Span::styled(format!(" · {}", r.id), fmt::dim())], 1));
                    let used: usize = spans.iter().map(|s| s.width()).sum();
                    let room = (area.width as usize).saturating_sub(used);
                    let width = |p: &Vec<Span>| p.iter().map(|s| s.width()).sum::<usize>();
                    spans.extend(fmt::fit_parts(parts, room, width).into_iter().flatten());
                }
            },
        }
        Paragraph::new(Line::from(spans)).render(area, buf);
    }

    fn footer(&self, area: Rect, buf: &mut Buffer) {
        let line = match (&self.input, &self.status) {
            (Some(Input::Command(t)), _) => Line::from(vec![Span::raw(":"), Span::raw(t.clone()), Span::raw("█")]),
            (Some(Input::Filter(t)), _) => Line::from(vec![
                Span::raw("/"),
                Span::raw(t.clone()),
                Span::raw("█"),
                Span::styled("  enter: keep · esc: clear", fmt::dim()),
            ]),
            (None, Some(s)) => {
                let st = if s.error { Style::new().fg(Color::Red) } else { Style::new().fg(Color::Green) };
                Line::styled(s.text.clone(), st)
            }
            (None, None) => Line::styled(self.hints(), fmt::dim()),
        };
        Paragraph::new(line).render(area, buf);
    }

    /// Whether the run whose checkpoints are listed is live, by the runs list when it has the
    /// run (polled), else by the record the screen was opened with.
    fn ckpts_run_live(&self) -> bool {
        let Some(r) = &self.ckpts.record else { return false };
        self.home.runs.iter().find(|h| h.id == r.id).map_or(r.status, |h| h.status).is_live()
    }

    fn hints(&self) -> String {
        let k = |a: Action| self.keymap.hint(a).to_string();
        let pairs: Vec<(String, &str)> = match self.screen {
            Screen::Home => vec![
                (k(Action::Help), "help"),
                (k(Action::Open), "open"),
                (k(Action::RecipePicker), "new run"),
                (k(Action::Command), "command"),
                (k(Action::Filter), "filter"),
                (k(Action::Select), "mark"),
                (k(Action::Compare), "compare"),
                (k(Action::Checkpoints), "ckpts"),
                (k(Action::Sort), "sort"),
                (k(Action::Back), "quit"),
            ],
            Screen::Run => vec![
                (k(Action::Help), "help"),
                (k(Action::FocusNext), "focus"),
                (k(Action::Zoom), "zoom"),
                ("1-9".into(), "layout"),
                (k(Action::ToggleEma), "ema"),
                (k(Action::ToggleLogY), "log-y"),
                (k(Action::ToggleAxis), "axis"),
                (k(Action::TogglePerRank), "ranks"),
                (k(Action::Checkpoints), "ckpts"),
                (k(Action::Resume), "resume"),
                (k(Action::Stop), "stop"),
                (k(Action::Kill), "kill"),
                (k(Action::Stacks), "stacks"),
                (k(Action::Back), "back"),
            ],
            Screen::Compare => {
                vec![(k(Action::Sort), "sort"), (k(Action::ToggleLogY), "log-y"), (k(Action::Back), "back")]
            }
            Screen::Checkpoints => {
                let mut pairs = vec![
                    (k(Action::Help), "help"),
                    (k(Action::Down), "select"),
                    (k(Action::Resume), "resume from selected"),
                    (k(Action::Verify), "verify"),
                ];
                // Stopping is offered only while there is something to stop.
                if self.ckpts_run_live() {
                    pairs.push((k(Action::Stop), "stop run"));
                }
                pairs.push((k(Action::Back), "back"));
                pairs
            }
        };
        // When narrow, the help key and the way out (the last pair) stay; the middle goes first.
        let last = pairs.len().saturating_sub(1);
        let parts: Vec<(String, u8)> = pairs
            .iter()
            .enumerate()
            .map(|(i, (key, what))| (format!("{key} {what}"), if i == 0 || i == last { 0 } else { i as u8 }))
            .collect();
        let width = self.area.width as usize;
        fmt::fit_parts(parts, width, |p: &String| p.chars().count() + 3).join(" · ")
    }

    fn panels(&self, buf: &mut Buffer) {
        if self.screen == Screen::Run && self.run.model.is_none() {
            let text = match &self.run.error {
                Some(e) => Line::styled(e.clone(), Style::new().fg(Color::Red)),
                None => Line::styled(format!("opening run {}…", self.run.query), fmt::dim()),
            };
            Paragraph::new(text).render(self.body(), buf);
            return;
        }
        let placed = self.placed();
        let focus = self.focused_panel();
        if let Some(tabs) = placed.tabs {
            let spans: Vec<Span> = placed
                .all
                .iter()
                .map(|p| {
                    let st = if Some(*p) == focus && self.screen == Screen::Run {
                        Style::new().fg(Color::Black).bg(Color::Cyan)
                    } else {
                        fmt::dim()
                    };
                    Span::styled(format!(" {} ", p.name()), st)
                })
                .collect();
            Paragraph::new(Line::from(spans)).render(tabs, buf);
        }
        for (kind, rect) in &placed.panels {
            let focused = self.screen == Screen::Run && Some(*kind) == focus;
            self.panel(*kind, *rect, focused, buf);
        }
    }

    fn panel(&self, kind: PanelKind, area: Rect, focused: bool, buf: &mut Buffer) {
        let m = self.run.model.as_ref();
        match kind {
            PanelKind::Chart => chart::render(m, &self.run.chart, self.run.parent_loss.as_ref(), focused, area, buf),
            PanelKind::Ranks => ranks::render(m, &self.run.ranks, focused, self.now_ms(), area, buf),
            PanelKind::Heatmap => heatmap::render(m, focused, area, buf),
            PanelKind::Collectives => collectives::render(m, focused, area, buf),
            PanelKind::Logs => logs::render(m, &self.run.logs, focused, area, buf),
            PanelKind::Events => events::render(m, &self.run.events, focused, area, buf),
            PanelKind::CompareChart => compare::render_chart(&self.compare, focused, area, buf),
            PanelKind::CompareTable => compare::render_table(&self.compare, focused, area, buf),
            PanelKind::Gpu => gpu::render(m, focused, area, buf),
            PanelKind::Matrix => {
                matrix::render(m, self.run.ranks.cursor, self.run.matrix_group.as_deref(), focused, area, buf)
            }
            PanelKind::Stacks => stacks::render(&self.run.stacks, focused, self.now_ms(), area, buf),
            PanelKind::Verdict => banner::render_panel(m, focused, self.now_ms(), area, buf),
            PanelKind::Rl => rl::render(m, &self.run.chart, focused, area, buf),
            PanelKind::Phases => phases::render(m, focused, area, buf),
            PanelKind::Samples => samples::render(m, focused, area, buf),
        }
    }
}
