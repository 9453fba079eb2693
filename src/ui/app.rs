//! The cockpit's state, owned by the UI task: screens, overlays and the input line. Events come
//! in (`on_key`, `on_mouse`, `on_data`, `on_tick`); requests go out through `Effects`.
use super::effects::{Command, DataEvent, Effects};
use super::keymap::Keymap;
use super::layout::{LayoutDef, PanelKind, ScreenKind};
use super::model::RunModel;
use super::panels::{chart::ChartView, compare::CompareRun, compare::CompareView, events::EventsView};
use super::panels::{chart::ParentLoss, ckpts::CkptsView, ckpts::ResumePlan};
use super::panels::{home::HomeView, incident::IncidentView, logs::LogsView, ranks::RanksView};
use super::panels::{stacks::StacksState, stacks::StacksView};
use crate::ids::RunId;
use ratatui::layout::Rect;

/// How often Home asks the server for the runs list again.
const HOME_REFRESH_MS: u64 = 2_000;
/// Below this a panel is unusable: the layout turns into tabs of full-size panels.
const MIN_PANEL: (u16, u16) = (20, 5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Home,
    Run,
    Compare,
    /// A run's checkpoints (`panels/ckpts.rs`), from Home or Run.
    Checkpoints,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Overlay {
    Help {
        scroll: usize,
    },
    ConfirmKill {
        run: RunId,
        name: String,
    },
    /// What `R` will start, until confirmed and answered (`panels/ckpts.rs`).
    ConfirmResume(Box<ResumePlan>),
    /// Graceful stop: every rank checkpoints, then exits; a command job's ranks get SIGTERM.
    ConfirmStop {
        run: RunId,
        name: String,
        /// A command job: no checkpoint of Flightdeck's, the program gets SIGTERM.
        command: bool,
    },
    /// The stacks viewer (its data is `RunScreen::stacks`), when the layout has no stacks panel.
    Stacks,
    /// The open run's newest incident report (its data is `RunScreen::incident`).
    Incident,
    /// `E`: which format to export `run` as.
    ExportFormat {
        run: Box<crate::store::RunRecord>,
    },
    /// Recipes under `recipes/` (None while listing).
    Picker {
        recipes: Option<Vec<super::effects::RecipeChoice>>,
        cursor: usize,
    },
}

/// The bottom line while typing.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Command(String),
    Filter(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    pub text: String,
    pub error: bool,
}

/// The Run screen: the open run and each panel's view state.
#[derive(Debug, Default)]
pub struct RunScreen {
    /// What the user asked to open (an id, prefix or name).
    pub query: String,
    pub model: Option<RunModel>,
    pub error: Option<String>,
    pub layout: usize,
    /// The layout was chosen for this run (a key, a pin, or its first snapshot's preference).
    pub layout_set: bool,
    /// The layout came from the run's kind alone (no key, no pin): a command's run that turns
    /// out to log an RL trainer's rewards moves to `rl` once.
    pub layout_auto: bool,
    pub focus: usize,
    pub zoom: bool,
    pub chart: ChartView,
    pub ranks: RanksView,
    pub logs: LogsView,
    pub events: EventsView,
    /// A resumed run's parent loss up to the resume step, for the chart.
    pub parent_loss: Option<ParentLoss>,
    pub stacks: StacksView,
    pub incident: IncidentView,
    /// The process group the matrix shows (`p`), by name; None: every rank's collectives.
    pub matrix_group: Option<String>,
}

/// Where the cockpit opens.
#[derive(Clone, Debug)]
pub enum Start {
    Home,
    Open(String),
}

/// The panels of the Run (or Compare) screen as drawn: rectangles, and a tab strip when the
/// terminal is too small for the layout (then only the focused panel is drawn).
pub struct Placed {
    pub panels: Vec<(PanelKind, Rect)>,
    pub tabs: Option<Rect>,
    pub all: Vec<PanelKind>,
}

pub struct App {
    pub effects: Effects,
    pub keymap: Keymap,
    pub layouts: Vec<LayoutDef>,
    pub area: Rect,
    pub screen: Screen,
    pub home: HomeView,
    pub run: RunScreen,
    pub compare: CompareView,
    pub ckpts: CkptsView,
    pub overlay: Option<Overlay>,
    pub input: Option<Input>,
    pub status: Option<Status>,
    pub quit: bool,
    /// The layout `:layout NAME` pinned: every run opens on it (None: each on its own).
    pub layout_pin: Option<usize>,
    last_refresh_ms: u64,
    last_second: u64,
}

impl App {
    /// The live runs quitting leaves going (and says so): the run on screen, or from Home the
    /// live runs its list shows (its status is the freshest there), newest first.
    pub fn live_runs(&self) -> Vec<RunId> {
        if self.screen == Screen::Run {
            let live = self.run.model.as_ref().filter(|m| m.state.record.status.is_live());
            return live.map(|m| m.state.record.id.clone()).into_iter().collect();
        }
        let mut live: Vec<&crate::record::RunRecord> = self.home.runs.iter().filter(|r| r.status.is_live()).collect();
        live.sort_by(|a, b| b.id.0.cmp(&a.id.0));
        live.into_iter().map(|r| r.id.clone()).collect()
    }

    pub fn new(effects: Effects, keymap: Keymap, layouts: Vec<LayoutDef>, start: Start, area: Rect) -> App {
        let mut app = App {
            effects,
            keymap,
            layouts,
            area,
            screen: Screen::Home,
            home: HomeView::default(),
            run: RunScreen::default(),
            compare: CompareView::default(),
            ckpts: CkptsView::default(),
            overlay: None,
            input: None,
            status: None,
            quit: false,
            layout_pin: None,
            last_refresh_ms: 0,
            last_second: 0,
        };
        app.last_refresh_ms = app.effects.now_ms();
        app.effects.send(Command::ListRuns);
        if let Start::Open(run) = start {
            app.open_run(&run);
        }
        app
    }

    pub fn now_ms(&self) -> u64 {
        self.effects.now_ms()
    }

    pub fn say(&mut self, text: impl Into<String>) {
        self.status = Some(Status { text: text.into(), error: false });
    }

    pub fn error(&mut self, text: impl Into<String>) {
        self.status = Some(Status { text: text.into(), error: true });
    }

    pub fn run_layouts(&self) -> Vec<&LayoutDef> {
        self.layouts.iter().filter(|l| l.screen == ScreenKind::Run).collect()
    }

    /// The layout a run opens on when none is pinned: `rl` for a GRPO run, `gpu` for a CUDA
    /// run, else `default`.
    fn preferred_layout(&self, r: &crate::store::RunRecord) -> usize {
        let recipe = serde_json::from_str::<serde_json::Value>(&r.recipe_json).ok();
        let field = |path: &str| recipe.as_ref().and_then(|v| v.pointer(path)?.as_str().map(str::to_string));
        let want = match (field("/kind").as_deref(), field("/cluster/device").as_deref()) {
            (Some("grpo"), _) => "rl",
            (_, Some("cuda")) => "gpu",
            _ => "default",
        };
        let layouts = self.run_layouts();
        layouts
            .iter()
            .position(|l| l.name == want)
            .or_else(|| layouts.iter().position(|l| l.name == "default"))
            .unwrap_or(0)
    }

    /// A run whose layout came from its kind alone and that logs an RL trainer's rewards (TRL,
    /// verl, OpenRLHF through a command) moves to the `rl` layout, once.
    fn follow_rl_metrics(&mut self) {
        if !self.run.layout_auto {
            return;
        }
        let Some(m) = &self.run.model else { return };
        let rl = m.metrics.keys().any(|k| k == "reward" || k.starts_with("rewards/") || k.starts_with("critic/score"));
        if !rl {
            return;
        }
        self.run.layout_auto = false;
        if let Some(i) = self.run_layouts().iter().position(|l| l.name == "rl") {
            if self.run.layout != i {
                self.run.layout = i;
                self.run.focus = 0;
                self.run.zoom = false;
            }
        }
    }

    fn compare_layout(&self) -> Option<&LayoutDef> {
        self.layouts.iter().find(|l| l.screen == ScreenKind::Compare)
    }

    /// The screen between the header line (and the verdict banner) and the footer line.
    pub fn body(&self) -> Rect {
        let a = self.area;
        let top = 1 + u16::from(self.banner_shown() && a.height > 6);
        Rect { x: a.x, y: a.y + top.min(a.height), width: a.width, height: a.height.saturating_sub(top + 1) }
    }

    /// Whether the Run screen shows a verdict banner under the header.
    pub fn banner_shown(&self) -> bool {
        self.screen == Screen::Run && self.run.model.as_ref().is_some_and(|m| m.shown_verdict().is_some())
    }

    /// Where each panel of the current screen goes.
    pub fn placed(&self) -> Placed {
        let def = match self.screen {
            Screen::Run => self.run_layouts().get(self.run.layout).copied(),
            Screen::Compare => self.compare_layout(),
            Screen::Home | Screen::Checkpoints => None,
        };
        let Some(def) = def else {
            return Placed { panels: Vec::new(), tabs: None, all: Vec::new() };
        };
        let body = self.body();
        let all = def.panels();
        let solved = def.solve(body);
        let focus = self.run.focus.min(all.len().saturating_sub(1));
        let small = solved.iter().any(|(_, r)| r.width < MIN_PANEL.0 || r.height < MIN_PANEL.1);
        if self.screen == Screen::Run && self.run.zoom {
            return Placed { panels: vec![(all[focus], body)], tabs: None, all };
        }
        if small && body.height > 2 {
            let tabs = Rect { height: 1, ..body };
            let rest = Rect { y: body.y + 1, height: body.height - 1, ..body };
            let focus = if self.screen == Screen::Run { focus } else { 0 };
            return Placed { panels: vec![(all[focus], rest)], tabs: Some(tabs), all };
        }
        Placed { panels: solved, tabs: None, all }
    }

    pub fn focused_panel(&self) -> Option<PanelKind> {
        let all = self.run_layouts().get(self.run.layout).map(|l| l.panels()).unwrap_or_default();
        all.get(self.run.focus.min(all.len().saturating_sub(1))).copied()
    }

    /// Opens a run on loss and on the pinned layout, else on the one its first snapshot
    /// prefers; the chart's toggles (EMA, log-y, axis, per-rank) carry over.
    pub fn open_run(&mut self, query: &str) {
        let chart = ChartView { metric: 0, ..std::mem::take(&mut self.run.chart) };
        self.run = RunScreen {
            query: query.to_string(),
            layout: self.layout_pin.unwrap_or(0),
            layout_set: self.layout_pin.is_some(),
            chart,
            ..RunScreen::default()
        };
        self.screen = Screen::Run;
        self.effects.send(Command::Open { run: query.to_string() });
    }

    pub fn go_home(&mut self) {
        if self.screen == Screen::Run {
            self.effects.send(Command::Close);
        }
        self.screen = Screen::Home;
        self.effects.send(Command::ListRuns);
        self.last_refresh_ms = self.now_ms();
    }

    /// Opens the Compare screen on the marked runs; with none marked, on the selected run's
    /// sweep (each point's newest run) when it is a sweep's, else on the selected run.
    pub fn open_compare(&mut self) {
        let now = self.now_ms();
        // Only what the user can see: marks on runs the filter hides are left out (and counted).
        let visible = self.home.visible(now);
        let marked: Vec<_> =
            visible.iter().filter(|r| self.home.marked.contains(&r.id)).map(|r| (*r).clone()).collect();
        let sweep = self.home.selected(now).and_then(|r| r.sweep.clone()).filter(|_| marked.is_empty());
        let records = match (&sweep, marked.is_empty()) {
            (Some(p), _) => super::panels::compare::sweep_runs(&self.home.runs, &p.sweep),
            (None, true) => self.home.selected(now).cloned().into_iter().collect(),
            (None, false) => marked,
        };
        if records.is_empty() {
            self.error("no run to compare: mark runs with space on Home first");
            return;
        }
        let runs = records.iter().map(|r| r.id.clone()).collect();
        self.compare = CompareView {
            runs: records.into_iter().map(|record| CompareRun { record, points: None, goodput: None }).collect(),
            log_y: self.compare.log_y,
            ..CompareView::default()
        };
        self.screen = Screen::Compare;
        self.effects.send(Command::LoadCompare { runs });
        if let Some(p) = sweep {
            self.effects.send(Command::LoadSweep { id: p.sweep });
        }
    }

    pub fn on_data(&mut self, ev: DataEvent) -> bool {
        match ev {
            DataEvent::Runs(runs) => {
                self.home.runs = runs;
                self.home.loaded = true;
                self.home.clamp(self.now_ms());
            }
            DataEvent::Snapshot(s) => {
                let same = self.run.model.as_ref().is_none_or(|m| m.state.record.id == s.detail.run.id);
                let watching =
                    self.screen == Screen::Run || (self.screen == Screen::Checkpoints && self.ckpts.from_run);
                if watching && same {
                    if !self.run.layout_set {
                        self.run.layout = self.preferred_layout(&s.detail.run);
                        self.run.layout_set = true;
                        self.run.layout_auto = true;
                    }
                    self.run.model = Some(RunModel::from_snapshot(&s));
                    self.follow_rl_metrics();
                    self.run.error = None;
                    self.ask_parent_loss();
                }
            }
            DataEvent::Frames { run, node, frames } => match self.run.model.as_mut() {
                Some(m) if m.state.record.id == run => {
                    m.apply_frames(node as usize, &frames);
                    self.follow_rl_metrics();
                }
                _ => return false,
            },
            DataEvent::Lagged { run, skipped } => {
                if self.run.model.as_ref().is_some_and(|m| m.state.record.id == run) {
                    self.say(format!("the cockpit fell behind the run ({skipped} batches): reloading"));
                    self.run.model = None;
                    self.effects.send(Command::Open { run: run.to_string() });
                }
            }
            DataEvent::Ended { run, status, reason } => match self.run.model.as_mut() {
                Some(m) if m.state.record.id == run => m.ended(status, &reason),
                _ => return false,
            },
            DataEvent::Restarted { run, child, restart } => {
                if self.run.model.as_ref().is_none_or(|m| m.state.record.id != run) {
                    return false;
                }
                self.say(format!(
                    "recovery restarted run {run} after a {} as run {child} (restart {}): following it",
                    restart.cause.name(),
                    restart.attempt
                ));
                self.open_run(child.as_str());
            }
            DataEvent::Launched(run) => {
                self.say(format!("launched run {run}"));
                self.overlay = None;
                self.open_run(run.as_str());
            }
            DataEvent::Recipes(list) => {
                if let Some(Overlay::Picker { recipes, cursor }) = &mut self.overlay {
                    *cursor = list.iter().position(|r| r.path == super::effects::DEFAULT_RECIPE).unwrap_or(0);
                    *recipes = Some(list);
                }
            }
            DataEvent::CompareSeries { run, points } => self.compare.set_points(&run, points),
            DataEvent::Sweep(s) => self.compare.sweep = Some(*s),
            DataEvent::CompareGoodput { run, ratio } => self.compare.set_goodput(&run, ratio),
            DataEvent::Verdicts { run, verdicts, incidents } => {
                let now = self.now_ms();
                match self.run.model.as_mut() {
                    Some(m) if m.state.record.id == run => {
                        m.set_live_verdicts(verdicts);
                        m.set_incidents(&incidents, now);
                    }
                    _ => return false,
                }
            }
            DataEvent::Incident { run, result } => {
                if self.run.model.as_ref().is_none_or(|m| m.state.record.id != run) {
                    return false;
                }
                if let Err(e) = &result {
                    self.error(e.clone());
                }
                self.run.incident.set(result);
            }
            DataEvent::Stacks { run, rank, result } => {
                if self.run.model.as_ref().is_none_or(|m| m.state.record.id != run) {
                    return false;
                }
                let who = rank.map_or("all ranks".to_string(), |r| format!("rank {r}"));
                self.run.stacks.state = match result {
                    Ok(report) => {
                        self.say(format!("stacks of {who}: {} group(s)", report.groups.len()));
                        StacksState::Ready { rank, report }
                    }
                    Err(error) => {
                        self.error(format!("no stacks of {who}: {error}"));
                        StacksState::Failed { rank, error }
                    }
                };
            }
            DataEvent::Done(text) => self.say(text),
            ev @ (DataEvent::Checkpoints(_)
            | DataEvent::CheckpointsFailed { .. }
            | DataEvent::Resumed(_)
            | DataEvent::ResumeFailed(_)
            | DataEvent::ParentLoss { .. }) => return self.on_lineage_data(&ev),
            DataEvent::OpenFailed { run, message } => {
                // Back to Home, unless the user has moved on meanwhile.
                if self.screen == Screen::Run && self.run.model.is_none() && self.run.query == run {
                    self.go_home();
                }
                self.error(format!("cannot open {run}: {message}"));
            }
            DataEvent::Error(text) => {
                if self.screen == Screen::Run && self.run.model.is_none() {
                    self.run.error = Some(text.clone());
                }
                self.error(text);
            }
        }
        true
    }

    /// Called on every redraw tick; true when something on screen changed (ages tick by seconds).
    pub fn on_tick(&mut self) -> bool {
        let now = self.now_ms();
        if self.screen == Screen::Home && now.saturating_sub(self.last_refresh_ms) >= HOME_REFRESH_MS {
            self.last_refresh_ms = now;
            self.effects.send(Command::ListRuns);
        }
        let second = now / 1000;
        let changed = second != self.last_second;
        self.last_second = second;
        changed
    }
}
