//! Keys and mouse: the keymap turns keys into actions, and each screen or panel acts on them.
//! The `:` command line and the `/` filter take text directly.
use super::action::Action;
use super::app::{App, Input, Overlay, Screen};
use super::effects::Command;
use super::layout::PanelKind;
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, MouseButton, MouseEvent, MouseEventKind};
use ratatui::layout::{Position, Rect};
use std::path::PathBuf;

const COMMANDS: &str =
    "run RECIPE [k=v ...], open RUN, attach RUN, kill, stop, ckpts, resume, layout NAME|auto (pins it), compare, help, q";

impl App {
    pub fn on_key(&mut self, k: KeyEvent) -> bool {
        if k.kind == KeyEventKind::Release {
            return false;
        }
        if self.input.is_some() {
            self.on_input_key(k);
            return true;
        }
        let action = self.keymap.action(&k);
        if self.overlay.is_some() {
            self.on_overlay_key(k, action);
            return true;
        }
        let Some(a) = action else { return false };
        self.status = None;
        self.on_action(a);
        true
    }

    pub fn on_action(&mut self, a: Action) {
        match a {
            Action::Quit => self.quit = true,
            Action::Help => self.overlay = Some(Overlay::Help { scroll: 0 }),
            Action::Command => self.input = Some(Input::Command(String::new())),
            Action::RecipePicker => {
                self.overlay = Some(Overlay::Picker { recipes: None, cursor: 0 });
                self.effects.send(Command::ListRecipes);
            }
            _ => match self.screen {
                Screen::Home => self.home_action(a),
                Screen::Run => self.run_action(a),
                Screen::Checkpoints => self.ckpts_action(a),
                Screen::Compare => match a {
                    Action::Back => self.go_home(),
                    Action::ToggleLogY => self.compare.log_y = !self.compare.log_y,
                    Action::Sort => self.compare.next_sort(),
                    Action::SortReverse => self.compare.reverse = !self.compare.reverse,
                    _ => {}
                },
            },
        }
    }

    fn page(&self) -> usize {
        (self.body().height as usize / 2).max(1)
    }

    fn home_action(&mut self, a: Action) {
        let now = self.now_ms();
        match a {
            Action::Back => self.quit = true,
            Action::Filter => self.input = Some(Input::Filter(self.home.filter.clone())),
            Action::Open => match self.home.selected(now).map(|r| r.id.to_string()) {
                Some(id) => self.open_run(&id),
                None => self.error("no run selected"),
            },
            Action::Compare => self.open_compare(),
            Action::Kill => match self.home.selected(now).map(|r| (r.id.clone(), r.name.clone(), r.status)) {
                Some((run, name, s)) if s.is_live() => self.overlay = Some(Overlay::ConfirmKill { run, name }),
                Some((run, _, s)) => self.error(format!("run {run} is {}, not live: nothing to kill", s.name())),
                None => self.error("no run selected"),
            },
            Action::Refresh => self.effects.send(Command::ListRuns),
            Action::Checkpoints | Action::Resume | Action::Stop => self.lineage_action(a),
            Action::Export => self.ask_export(),
            Action::Report => self.ask_report(),
            _ => {
                let page = self.page();
                self.home.on_action(a, now, page);
            }
        }
    }

    fn run_action(&mut self, a: Action) {
        let n_panels = self.run_layouts().get(self.run.layout).map(|l| l.panels().len()).unwrap_or(1).max(1);
        let page = self.page();
        if let Some(i) = a.layout_index() {
            let names: Vec<String> =
                self.run_layouts().iter().enumerate().map(|(i, l)| format!("{} {}", i + 1, l.name)).collect();
            if i < names.len() {
                self.run.layout = i;
                self.run.layout_set = true;
                self.run.layout_auto = false;
                self.run.focus = 0;
                self.run.zoom = false;
            } else {
                self.error(format!("no layout {}; layouts: {}", i + 1, names.join(", ")));
            }
            return;
        }
        if self.run.chart.on_action(a, self.run.model.as_ref()) {
            return;
        }
        match a {
            Action::Back if self.run.zoom => self.run.zoom = false,
            Action::Back => self.go_home(),
            Action::Filter => self.input = Some(Input::Filter(self.run.logs.search.clone())),
            Action::FocusNext => self.run.focus = (self.run.focus + 1) % n_panels,
            Action::FocusPrev => self.run.focus = (self.run.focus + n_panels - 1) % n_panels,
            Action::Zoom => self.run.zoom = !self.run.zoom,
            Action::Kill => self.ask_kill_open_run(),
            Action::Checkpoints | Action::Resume | Action::Stop => self.lineage_action(a),
            Action::Stacks | Action::StacksAll | Action::StacksNative => self.ask_stacks(a),
            Action::Incident => self.ask_incident(),
            Action::Export => self.ask_export(),
            Action::Report => self.ask_report(),
            Action::NextGroup => self.next_group(),
            Action::Refresh => {
                let q =
                    self.run.model.as_ref().map(|m| m.state.record.id.to_string()).unwrap_or(self.run.query.clone());
                self.open_run(&q);
            }
            Action::Follow | Action::NextLogRank | Action::PrevLogRank => {
                let world = self.run.model.as_ref().map(|m| m.world()).unwrap_or(0);
                self.run.logs.on_action(a, world, page);
            }
            _ => self.panel_action(a, page),
        }
    }

    /// The matrix's next process group: every rank, then each group of the torch job in turn.
    fn next_group(&mut self) {
        let names: Vec<String> = self
            .run
            .model
            .as_ref()
            .map(|m| m.process_groups().into_iter().map(|g| g.name).collect())
            .unwrap_or_default();
        if names.is_empty() {
            self.error("no process groups: the matrix by group is for torch jobs, from their shims' flight recorders");
            return;
        }
        let at = self.run.matrix_group.as_ref().and_then(|g| names.iter().position(|n| n == g));
        self.run.matrix_group = match at {
            None => names.first().cloned(),
            Some(i) => names.get(i + 1).cloned(),
        };
    }

    /// Movement keys go to the focused panel.
    fn panel_action(&mut self, a: Action, page: usize) {
        let world = self.run.model.as_ref().map(|m| m.world()).unwrap_or(0);
        let events = self.run.model.as_ref().map(|m| m.events.len()).unwrap_or(0);
        match self.focused_panel() {
            Some(PanelKind::Ranks) => {
                self.run.ranks.on_action(a, world, page);
            }
            Some(PanelKind::Logs) => {
                self.run.logs.on_action(a, world, page);
            }
            Some(PanelKind::Events) => {
                self.run.events.on_action(a, events);
            }
            Some(PanelKind::Matrix) => {
                self.run.ranks.on_action(a, world, page);
            }
            Some(PanelKind::Stacks) => {
                self.run.stacks.on_action(a, page);
            }
            _ => {}
        }
    }

    /// `s` / `S` / `N`: dumps stacks off the UI task and shows the viewer (the layout's stacks
    /// panel, else an overlay) with "dumping…" until the answer comes. `native`: Python ranks'
    /// C/C++ frames too.
    fn ask_stacks(&mut self, which: Action) {
        let (all, native) = (which == Action::StacksAll, which == Action::StacksNative);
        let now = self.now_ms();
        let Some(m) = self.run.model.as_ref() else { return self.error("no run open") };
        let (run, status, world) = (m.state.record.id.clone(), m.state.record.status, m.world());
        let rank = (!all).then(|| self.run.ranks.cursor.min(world.saturating_sub(1)) as u32);
        let who = rank.map_or("all ranks".to_string(), |r| format!("rank {r}"));
        if self.run.stacks.dumping() {
            self.say("a stack dump is under way: its answer comes first");
        } else if !status.is_live() {
            let error = format!(
                "run {run} is {}, not live: stacks are read from running ranks (its incident reports keep \
                 the stacks taken at a hang: `flightdeck show {run}`)",
                status.name()
            );
            self.run.stacks.state = super::panels::stacks::StacksState::Failed { rank, error };
        } else {
            self.run.stacks.start(rank, now);
            self.say(format!("dumping stacks of {who}…"));
            self.effects.send(Command::Stacks { run, rank, native });
        }
        match self
            .run_layouts()
            .get(self.run.layout)
            .and_then(|l| l.panels().iter().position(|p| *p == PanelKind::Stacks))
        {
            Some(i) => self.run.focus = i,
            None => self.overlay = Some(Overlay::Stacks),
        }
    }

    /// `I`: the open run's newest incident report, fetched off the UI task, in an overlay.
    fn ask_incident(&mut self) {
        let Some(run) = self.run.model.as_ref().map(|m| m.state.record.id.clone()) else {
            return self.error("no run open");
        };
        self.run.incident.start();
        self.overlay = Some(Overlay::Incident);
        self.effects.send(Command::LoadIncident { run });
    }

    fn ask_kill_open_run(&mut self) {
        match self
            .run
            .model
            .as_ref()
            .map(|m| (m.state.record.id.clone(), m.state.record.name.clone(), m.state.record.status))
        {
            Some((run, name, s)) if s.is_live() => self.overlay = Some(Overlay::ConfirmKill { run, name }),
            Some((run, _, s)) => self.error(format!("run {run} is {}, not live: nothing to kill", s.name())),
            None => self.error("no run open"),
        }
    }

    fn on_overlay_key(&mut self, k: KeyEvent, action: Option<Action>) {
        let help_last = super::panels::help::max_scroll(self.body());
        let help_page = self.page();
        let Some(ov) = self.overlay.as_mut() else { return };
        match ov {
            Overlay::Help { scroll } => match action {
                Some(
                    a @ (Action::Up | Action::Down | Action::PageUp | Action::PageDown | Action::Top | Action::Bottom),
                ) => *scroll = a.move_cursor((*scroll).min(help_last), help_last + 1, help_page).unwrap_or(*scroll),
                Some(Action::Quit) => self.quit = true,
                _ => self.overlay = None,
            },
            Overlay::Stacks => {
                let page = self.page();
                match action {
                    Some(a @ (Action::Stacks | Action::StacksAll | Action::StacksNative)) => self.ask_stacks(a),
                    Some(Action::Quit) => self.quit = true,
                    Some(a) if self.run.stacks.on_action(a, page) => {}
                    _ if k.code == KeyCode::Esc || action == Some(Action::Back) => self.overlay = None,
                    _ => {}
                }
            }
            Overlay::Incident => {
                let page = self.page();
                match action {
                    Some(Action::Quit) => self.quit = true,
                    Some(a) if self.run.incident.on_action(a, page) => {}
                    _ => self.overlay = None,
                }
            }
            Overlay::ConfirmKill { run, .. } => {
                if matches!(k.code, KeyCode::Char('y') | KeyCode::Char('Y') | KeyCode::Enter) {
                    let run = run.clone();
                    self.say(format!("killing run {run}…"));
                    self.effects.send(Command::Kill { run });
                } else {
                    self.say("kill cancelled");
                }
                self.overlay = None;
            }
            Overlay::ConfirmResume(_) => self.on_resume_key(k),
            Overlay::ExportFormat { .. } => self.on_export_key(k),
            Overlay::ConfirmStop { .. } => self.on_stop_key(k),
            Overlay::Picker { recipes, cursor } => {
                let n = recipes.as_ref().map(|r| r.len()).unwrap_or(0);
                match action {
                    Some(Action::Up) => *cursor = cursor.saturating_sub(1),
                    Some(Action::Down) => *cursor = (*cursor + 1).min(n.saturating_sub(1)),
                    Some(Action::Open) => {
                        if let Some(r) = recipes.as_ref().and_then(|r| r.get(*cursor)).cloned() {
                            self.launch(PathBuf::from(&r.path), Vec::new());
                            self.overlay = None;
                        }
                    }
                    // Overrides: the launch as a command line to finish (`:run RECIPE k=v ...`).
                    Some(Action::Command) => {
                        if let Some(r) = recipes.as_ref().and_then(|r| r.get(*cursor)).cloned() {
                            self.input = Some(Input::Command(format!("run {} ", r.path)));
                            self.overlay = None;
                        }
                    }
                    Some(Action::Quit) => self.quit = true,
                    _ if k.code == KeyCode::Esc || action == Some(Action::Back) => self.overlay = None,
                    _ => {}
                }
            }
        }
    }

    fn launch(&mut self, recipe: PathBuf, overrides: Vec<String>) {
        self.say(format!("launching {}…", recipe.display()));
        self.effects.send(Command::Launch { recipe, overrides });
    }

    fn on_input_key(&mut self, k: KeyEvent) {
        let is_filter = matches!(self.input, Some(Input::Filter(_)));
        match k.code {
            KeyCode::Esc => {
                if is_filter {
                    self.input = Some(Input::Filter(String::new()));
                    self.apply_filter();
                }
                self.input = None;
            }
            KeyCode::Enter => {
                if let Some(Input::Command(line)) = self.input.take() {
                    self.run_command(&line);
                }
            }
            KeyCode::Backspace => {
                if self.edit(|t| t.pop().is_none()) {
                    self.input = None;
                } else {
                    self.apply_filter();
                }
            }
            KeyCode::Char(c) => {
                self.edit(|t| {
                    t.push(c);
                    false
                });
                self.apply_filter();
            }
            _ => {}
        }
    }

    fn edit(&mut self, f: impl FnOnce(&mut String) -> bool) -> bool {
        match self.input.as_mut() {
            Some(Input::Command(t) | Input::Filter(t)) => f(t),
            None => false,
        }
    }

    /// The filter applies as it is typed (Home: runs; Run: log search).
    fn apply_filter(&mut self) {
        let Some(Input::Filter(text)) = &self.input else { return };
        let text = text.clone();
        match self.screen {
            Screen::Home => {
                self.home.filter = text;
                self.home.cursor = 0;
            }
            Screen::Run => self.run.logs.search = text,
            Screen::Compare | Screen::Checkpoints => {}
        }
    }

    /// `:` commands.
    pub fn run_command(&mut self, line: &str) {
        let mut words = line.split_whitespace();
        let Some(cmd) = words.next() else { return };
        let args: Vec<&str> = words.collect();
        match (cmd, args.as_slice()) {
            ("q" | "quit" | "q!", _) => self.quit = true,
            ("run", []) => self.on_action(Action::RecipePicker),
            ("run", [recipe, rest @ ..]) => {
                if let Some(bad) = rest.iter().find(|kv| !kv.contains('=')) {
                    self.error(format!(":run: {bad:?} is not key=value (e.g. train.steps=60)"));
                    return;
                }
                self.launch(PathBuf::from(recipe), rest.iter().map(|s| s.to_string()).collect());
            }
            ("open" | "attach", [run]) => self.open_run(run),
            ("kill", []) => match self.screen {
                Screen::Run => self.ask_kill_open_run(),
                _ => self.home_action(Action::Kill),
            },
            ("layout", ["auto"]) => {
                self.layout_pin = None;
                self.say("layout unpinned: each run opens on the layout it prefers");
            }
            ("layout", [name]) => match self.run_layouts().iter().position(|l| l.name == *name) {
                Some(i) => {
                    self.layout_pin = Some(i);
                    (self.run.layout, self.run.layout_set) = (i, true);
                    self.say(format!("layout {name} pinned: every run opens on it (:layout auto unpins)"));
                }
                None => {
                    let names: Vec<&str> = self.run_layouts().iter().map(|l| l.name.as_str()).collect();
                    self.error(format!("no layout {name:?}; layouts: {}", names.join(", ")));
                }
            },
            ("compare", []) => self.open_compare(),
            ("ckpts" | "checkpoints", []) => self.lineage_action(Action::Checkpoints),
            ("resume", []) => self.lineage_action(Action::Resume),
            ("stop", []) => self.lineage_action(Action::Stop),
            ("help", []) => self.overlay = Some(Overlay::Help { scroll: 0 }),
            _ => self.error(format!("unknown command :{line}; commands: {COMMANDS}")),
        }
    }

    pub fn on_mouse(&mut self, m: MouseEvent) -> bool {
        let pos = Position { x: m.column, y: m.row };
        let scroll = match m.kind {
            MouseEventKind::ScrollUp => Some(Action::Up),
            MouseEventKind::ScrollDown => Some(Action::Down),
            MouseEventKind::Down(MouseButton::Left) => None,
            _ => return false,
        };
        if self.overlay.is_some() || self.input.is_some() {
            return false;
        }
        match self.screen {
            Screen::Home => match scroll {
                Some(a) => self.on_action(a),
                None => {
                    // Rows start below the border and the header line.
                    let body = self.body();
                    let rows = body.height.saturating_sub(3) as usize;
                    let offset = (self.home.cursor + 1).saturating_sub(rows.max(1));
                    if let Some(row) = (m.row as usize).checked_sub(body.y as usize + 2) {
                        let n = self.home.visible(self.now_ms()).len();
                        if row < rows && offset + row < n {
                            self.home.cursor = offset + row;
                        }
                    }
                }
            },
            Screen::Run => {
                let placed = self.placed();
                let hit = placed.panels.iter().find(|(_, r)| r.contains(pos)).map(|(k, _)| *k);
                if let Some(i) = hit.and_then(|k| placed.all.iter().position(|p| *p == k)) {
                    self.run.focus = i;
                } else if let Some(tabs) = placed.tabs.filter(|t: &Rect| t.contains(pos)) {
                    // Tabs are drawn as equal slots.
                    let slot = tabs.width / placed.all.len().max(1) as u16;
                    self.run.focus = ((m.column - tabs.x) / slot.max(1)) as usize % placed.all.len().max(1);
                }
                if let Some(a) = scroll {
                    let page = self.page();
                    self.panel_action(a, page);
                }
            }
            Screen::Checkpoints => {
                if let Some(a) = scroll {
                    self.ckpts_action(a);
                }
            }
            Screen::Compare => {}
        }
        true
    }
}
