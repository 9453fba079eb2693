//! The cockpit's behaviour without a terminal: keys become requests, streams fold into the
//! model with no gap or double count, and odd sizes never panic.
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use flightdeck::protocol::{AgentFrame, RunSnapshot};
use flightdeck::store::{CheckpointRecord, RunRecord};
use flightdeck::ui::app::{Overlay, Screen};
use flightdeck::ui::effects::{Command, DataEvent, Effects};
use flightdeck::ui::keymap::{Keymap, DEFAULT_KEYMAP};
use flightdeck::ui::model::RunModel;
use flightdeck::ui::panels::ckpts::CkptList;
use flightdeck::ui::{layout, App, Start};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use std::path::PathBuf;

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/telemetry/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn app(start: Start) -> App {
    let keymap = Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("default keymap");
    let layouts = layout::load_all(None).expect("layouts");
    App::new(Effects::fixed(1_800_000_000_000), keymap, layouts, start, Rect::new(0, 0, 100, 30))
}

fn press(app: &mut App, code: KeyCode) {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn typed(app: &mut App, text: &str) {
    text.chars().for_each(|c| press(app, KeyCode::Char(c)));
}

#[test]
fn command_line_launches_a_recipe_with_overrides() {
    let mut app = app(Start::Home);
    assert_eq!(app.effects.take(), vec![Command::ListRuns]);
    typed(&mut app, ":run recipes/tiny-gpt.toml train.steps=5 cluster.ranks_per_node=2");
    press(&mut app, KeyCode::Enter);
    let want = Command::Launch {
        recipe: PathBuf::from("recipes/tiny-gpt.toml"),
        overrides: vec!["train.steps=5".into(), "cluster.ranks_per_node=2".into()],
    };
    assert_eq!(app.effects.take(), vec![want]);
    app.on_data(DataEvent::Launched(flightdeck::ids::RunId("r1".into())));
    assert_eq!(app.screen, Screen::Run);
    assert_eq!(app.effects.take(), vec![Command::Open { run: "r1".into() }]);
    typed(&mut app, ":run recipes/tiny-gpt.toml steps");
    press(&mut app, KeyCode::Enter);
    assert!(app.effects.take().is_empty());
    assert!(app.status.as_ref().is_some_and(|s| s.error && s.text.contains("\"steps\" is not key=value")));
    typed(&mut app, ":frobnicate");
    press(&mut app, KeyCode::Enter);
    assert!(app.status.as_ref().is_some_and(|s| s.text.contains("commands: run RECIPE")));
}

#[test]
fn open_of_an_unknown_run_says_why_and_stays_on_home() {
    let mut app = app(Start::Home);
    app.effects.take();
    typed(&mut app, ":open nosuch");
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.effects.take(), vec![Command::Open { run: "nosuch".into() }]);
    let message = "no run matches \"nosuch\"; `flightdeck runs` lists them".to_string();
    app.on_data(DataEvent::OpenFailed { run: "nosuch".into(), message });
    assert_eq!(app.screen, Screen::Home);
    assert_eq!(app.effects.take(), vec![Command::Close, Command::ListRuns]);
    let status = app.status.as_ref().expect("a status line");
    assert!(status.error && status.text.contains("cannot open nosuch: no run matches"), "{}", status.text);
    // A late refusal of a run the user already left does not pull them off another one.
    typed(&mut app, ":open other");
    press(&mut app, KeyCode::Enter);
    app.on_data(DataEvent::OpenFailed { run: "nosuch".into(), message: "gone".into() });
    assert_eq!(app.screen, Screen::Run);
}

#[test]
fn enter_opens_and_q_goes_home_without_stopping_the_run() {
    let runs: Vec<RunRecord> = fixture("runs.json");
    let mut app = app(Start::Home);
    app.effects.take();
    app.on_data(DataEvent::Runs(runs.clone()));
    press(&mut app, KeyCode::Enter);
    let newest = runs.iter().map(|r| r.id.clone()).max().expect("a run");
    assert_eq!(app.effects.take(), vec![Command::Open { run: newest.to_string() }]);
    typed(&mut app, "q");
    assert_eq!(app.screen, Screen::Home);
    // Leaving closes the stream only; nothing is sent to the run.
    assert_eq!(app.effects.take(), vec![Command::Close, Command::ListRuns]);
    typed(&mut app, "q");
    assert!(app.quit);
}

#[test]
fn kill_asks_first_and_only_for_a_live_run() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let id = snap.detail.run.id.clone();
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    typed(&mut app, "K");
    assert!(matches!(app.overlay, Some(Overlay::ConfirmKill { .. })));
    typed(&mut app, "n");
    assert!(app.overlay.is_none() && app.effects.take().is_empty(), "any other key cancels");
    typed(&mut app, "Ky");
    assert_eq!(app.effects.take(), vec![Command::Kill { run: id.clone() }]);
    let frames: Vec<AgentFrame> = fixture("open-frames.json");
    app.on_data(DataEvent::Frames { node: 0, run: id, frames });
    typed(&mut app, "K");
    assert!(app.overlay.is_none(), "a finished run has nothing to kill");
    assert!(app.status.as_ref().is_some_and(|s| s.text.contains("not live")));
}

#[test]
fn snapshot_then_frames_cover_every_step_once() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let frames: Vec<AgentFrame> = fixture("open-frames.json");
    let mut m = RunModel::from_snapshot(&snap);
    m.apply_frames(0, &frames);
    // The server subscribes before it reads, so some frames repeat what the snapshot holds:
    // applying them again must change nothing.
    let once = m.metrics["loss"].cross.entries().to_vec();
    m.apply_frames(0, &frames);
    assert_eq!(m.metrics["loss"].cross.entries(), once.as_slice());
    let steps: Vec<u64> = once.iter().map(|e| e.step).collect();
    assert_eq!(steps, (1..=40).collect::<Vec<u64>>(), "every step, no gap");
    assert!(once.iter().all(|e| e.count == 2), "each step has both ranks exactly once");
    assert_eq!(m.state.record.status, flightdeck::store::RunStatus::Succeeded);
}

#[test]
fn a_restart_by_recovery_opens_the_child_and_says_why() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let id = snap.detail.run.id.clone();
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    let child = flightdeck::ids::RunId("20261206T000001-beef".into());
    let restart = flightdeck::record::Restart { attempt: 1, cause: flightdeck::record::Cause::Crash };
    // Another run's restart is not the open run's.
    app.on_data(DataEvent::Restarted { run: child.clone(), child: id.clone(), restart: restart.clone() });
    assert_eq!(app.effects.take(), vec![]);
    app.on_data(DataEvent::Restarted { run: id.clone(), child: child.clone(), restart });
    assert_eq!(app.effects.take(), vec![Command::Open { run: child.to_string() }]);
    let said = app.status.as_ref().map(|s| s.text.clone()).unwrap_or_default();
    assert!(said.contains(&format!("restarted run {id} after a crash as run {child} (restart 1)")), "{said}");
}

#[test]
fn lagging_stream_reloads_the_run() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let id = snap.detail.run.id.clone();
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    app.on_data(DataEvent::Lagged { run: id.clone(), skipped: 3 });
    assert_eq!(app.effects.take(), vec![Command::Open { run: id.to_string() }]);
    assert!(app.run.model.is_none());
}

#[test]
fn every_screen_draws_at_tiny_and_odd_sizes() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let frames: Vec<AgentFrame> = fixture("open-frames.json");
    let runs: Vec<RunRecord> = fixture("runs.json");
    for (w, h) in [(1, 1), (10, 3), (20, 6), (40, 12), (80, 24), (81, 25), (300, 90)] {
        for screen in 0..4 {
            let mut app = app(Start::Home);
            app.area = Rect::new(0, 0, w, h);
            app.on_data(DataEvent::Runs(runs.clone()));
            if screen >= 1 {
                app.open_run(snap.detail.run.id.as_str());
                app.on_data(DataEvent::Snapshot(Box::new(snap.clone())));
                app.on_data(DataEvent::Frames { node: 0, run: snap.detail.run.id.clone(), frames: frames.clone() });
            }
            match screen {
                2 => typed(&mut app, "2z?"),
                3 => typed(&mut app, "qc"),
                _ => {}
            }
            let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
            t.draw(|f| f.render_widget(&app, f.area())).expect("draw");
        }
    }
}

#[test]
fn stop_asks_first_and_checkpoints_keep_the_run_open() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let id = snap.detail.run.id.clone();
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    typed(&mut app, "X");
    assert!(matches!(app.overlay, Some(Overlay::ConfirmStop { command: false, .. })));
    typed(&mut app, "n");
    assert!(app.overlay.is_none() && app.effects.take().is_empty(), "any other key cancels");
    typed(&mut app, "Xy");
    assert_eq!(app.effects.take(), vec![Command::Stop { run: id.clone() }]);
    // C from Run lists the open run's checkpoints; q comes back to the same Run screen,
    // which kept its stream.
    typed(&mut app, "C");
    assert_eq!(app.screen, Screen::Checkpoints);
    assert_eq!(app.effects.take(), vec![Command::LoadCheckpoints { run: id.clone(), verify: false }]);
    typed(&mut app, "v");
    assert_eq!(app.effects.take(), vec![Command::LoadCheckpoints { run: id.clone(), verify: true }]);
    app.on_data(DataEvent::CheckpointsFailed { run: id.clone(), message: "checkpoints of run x: gone".into() });
    assert_eq!(app.ckpts.error.as_deref(), Some("checkpoints of run x: gone"));
    typed(&mut app, "q");
    assert_eq!(app.screen, Screen::Run);
    assert!(app.effects.take().is_empty(), "back to Run neither closes nor reopens the stream");
    let frames: Vec<AgentFrame> = fixture("open-frames.json");
    app.on_data(DataEvent::Frames { node: 0, run: id, frames });
    typed(&mut app, "X");
    assert!(app.overlay.is_none(), "a finished run has nothing to stop");
    assert!(app.status.as_ref().is_some_and(|s| s.text.contains("nothing to stop")));
}

#[test]
fn checkpoints_and_gpu_screens_draw_at_tiny_and_odd_sizes() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let runs: Vec<RunRecord> = fixture("runs.json");
    for (w, h) in [(1, 1), (10, 3), (20, 6), (40, 12), (81, 25), (300, 90)] {
        for keys in ["C", "R", "3"] {
            let mut app = app(Start::Home);
            app.area = Rect::new(0, 0, w, h);
            app.on_data(DataEvent::Runs(runs.clone()));
            if keys == "3" {
                app.open_run(snap.detail.run.id.as_str());
                app.on_data(DataEvent::Snapshot(Box::new(snap.clone())));
            }
            typed(&mut app, keys);
            let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
            t.draw(|f| f.render_widget(&app, f.area())).expect("draw");
        }
    }
}

#[test]
fn r_on_a_live_run_kills_it_then_restarts_from_the_newest_verified_checkpoint() {
    let snap: RunSnapshot = fixture("open-snapshot.json");
    let id = snap.detail.run.id.clone();
    assert!(snap.detail.run.status.is_live(), "the fixture is a live run");
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    typed(&mut app, "R");
    let Some(Overlay::ConfirmResume(plan)) = &app.overlay else { panic!("R asks first: {:?}", app.overlay) };
    assert!(plan.kill_first && plan.step.is_none(), "a live run is killed, then restarted from the newest");
    let said: String = plan.lines().iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n");
    assert!(said.contains("Kill run") && said.contains("then"), "{said}");
    assert!(plan.keys("K").contains("waiting for the checkpoint listing"), "{}", plan.keys("K"));
    // y waits for the listing: a kill must know there is something to restart from.
    typed(&mut app, "y");
    assert!(app.effects.take().iter().all(|c| !matches!(c, Command::Resume { .. })));
    let dir = format!("/r/{id}/checkpoints");
    let saved = CheckpointRecord {
        run: id.clone(),
        step: 10,
        path: format!("{dir}/step-00000010"),
        bytes: 1 << 20,
        loss: Some(2.1),
        saved_ms: 1,
        blocking_ms: 1.0,
        write_ms: 2.0,
        verified: true,
        checked: "sha256".into(),
        checked_ms: 1,
        problem: None,
        nodes: Vec::new(),
    };
    let list = CkptList { run: id.clone(), dir, latest: Some(10), checkpoints: vec![saved] };
    app.on_data(DataEvent::Checkpoints(Box::new(list)));
    let Some(Overlay::ConfirmResume(plan)) = &app.overlay else { panic!("still asking: {:?}", app.overlay) };
    assert_eq!(plan.keys("K"), "y confirm · esc cancel");
    typed(&mut app, "y");
    assert_eq!(app.effects.take(), vec![Command::Resume { run: id, step: None, kill_first: true }]);
}

/// The layout the Run screen shows, by name.
fn layout_name(app: &App) -> String {
    app.run_layouts().get(app.run.layout).map(|l| l.name.clone()).unwrap_or_default()
}

/// Opens a run and hands it the recorded snapshot (as the run `id`).
fn open_fixture(app: &mut App, id: &str) {
    let mut snap: RunSnapshot = fixture("open-snapshot.json");
    snap.detail.run.id = flightdeck::ids::RunId(id.into());
    app.open_run(id);
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
}

#[test]
fn a_newly_opened_run_starts_on_loss_and_its_own_layout_unless_one_is_pinned() {
    let mut app = app(Start::Home);
    open_fixture(&mut app, "20261202T105754-aaaa");
    assert_eq!((layout_name(&app), app.run.chart.metric), ("default".into(), 0));
    typed(&mut app, "mm2e");
    assert_eq!((layout_name(&app), app.run.chart.metric), ("debug".into(), 2));
    // Another run: loss and default again; the chart's EMA toggle is a preference and stays.
    open_fixture(&mut app, "20261202T105754-bbbb");
    assert_eq!((layout_name(&app), app.run.chart.metric), ("default".into(), 0), "nothing leaks");
    assert!(app.run.chart.ema != flightdeck::ui::panels::chart::ChartView::default().ema);
    // A CUDA run prefers the gpu layout.
    let mut snap: RunSnapshot = fixture("open-snapshot.json");
    snap.detail.run.recipe_json = snap.detail.run.recipe_json.replace("\"device\":\"cpu\"", "\"device\":\"cuda\"");
    assert!(snap.detail.run.recipe_json.contains("\"device\":\"cuda\""));
    app.open_run(snap.detail.run.id.as_str());
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    assert_eq!(layout_name(&app), "gpu");
    // :layout NAME pins it for every run opened after, and the header says so.
    typed(&mut app, ":layout debug");
    press(&mut app, KeyCode::Enter);
    open_fixture(&mut app, "20261202T105754-cccc");
    assert_eq!(layout_name(&app), "debug");
    let mut t = Terminal::new(TestBackend::new(160, 30)).expect("terminal");
    t.draw(|f| f.render_widget(&app, f.area())).expect("draw");
    let header: String = (0..160).map(|x| t.backend().buffer()[(x, 0)].symbol().to_string()).collect();
    assert!(header.contains("layout debug (pinned)"), "{header}");
    typed(&mut app, ":layout auto");
    press(&mut app, KeyCode::Enter);
    open_fixture(&mut app, "20261202T105754-dddd");
    assert_eq!(layout_name(&app), "default");
}

#[test]
fn the_recipe_picker_starts_on_the_default_marks_cuda_and_takes_overrides() {
    use flightdeck::ui::effects::RecipeChoice;
    let mut app = app(Start::Home);
    typed(&mut app, "n");
    assert!(app.effects.take().contains(&Command::ListRecipes));
    let choice = |p: &str, no_gpu_here: bool| RecipeChoice { path: p.into(), no_gpu_here };
    let list = vec![
        choice("recipes/command-env.toml", false),
        choice("recipes/tiny-gpt-cuda.toml", true),
        choice("recipes/tiny-gpt.toml", false),
    ];
    app.on_data(DataEvent::Recipes(list));
    let Some(Overlay::Picker { cursor, .. }) = &app.overlay else { panic!("the picker: {:?}", app.overlay) };
    assert_eq!(*cursor, 2, "the cursor starts on recipes/tiny-gpt.toml");
    let mut t = Terminal::new(TestBackend::new(100, 30)).expect("terminal");
    t.draw(|f| f.render_widget(&app, f.area())).expect("draw");
    let screen: String = (0..30)
        .map(|y| (0..100).map(|x| t.backend().buffer()[(x, y)].symbol().to_string()).collect::<String>() + "\n")
        .collect();
    let cuda = screen.lines().find(|l| l.contains("tiny-gpt-cuda.toml")).expect("the CUDA recipe");
    assert!(cuda.contains("needs CUDA: no NVIDIA driver here"), "{screen}");
    assert!(!screen.lines().any(|l| l.contains("tiny-gpt.toml ") && l.contains("needs CUDA")), "{screen}");
    // `:` turns the pick into a command line to add overrides to.
    typed(&mut app, ":");
    assert!(app.overlay.is_none());
    typed(&mut app, "train.steps=5");
    press(&mut app, KeyCode::Enter);
    let want =
        Command::Launch { recipe: PathBuf::from("recipes/tiny-gpt.toml"), overrides: vec!["train.steps=5".into()] };
    assert!(app.effects.take().contains(&want));
}

#[test]
fn compare_takes_only_the_marked_runs_the_filter_shows() {
    let runs: Vec<RunRecord> = fixture("runs.json");
    assert!(runs.len() >= 2);
    let mut app = app(Start::Home);
    app.on_data(DataEvent::Runs(runs.clone()));
    // Mark every run (Space marks and moves down), then filter down to one of them.
    for _ in &runs {
        typed(&mut app, " ");
    }
    assert_eq!(app.home.marked.len(), runs.len());
    let shown = runs.iter().find(|r| r.name.contains("lr")).expect("a run named with lr").clone();
    typed(&mut app, "/lr");
    press(&mut app, KeyCode::Enter);
    app.effects.take();
    typed(&mut app, "c");
    let sent = app.effects.take();
    assert!(sent.contains(&Command::LoadCompare { runs: vec![shown.id.clone()] }), "{sent:?}");
}

#[test]
fn e_asks_for_a_format_then_exports_and_p_writes_the_report_off_the_ui_task() {
    let snap: RunSnapshot = fixture("finished-snapshot.json");
    let (id, name) = (snap.detail.run.id.clone(), snap.detail.run.name.clone());
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    press(&mut app, KeyCode::Char('E'));
    assert!(matches!(app.overlay, Some(Overlay::ExportFormat { .. })), "{:?}", app.overlay);
    assert!(app.effects.take().is_empty(), "nothing sent before a format is picked");
    press(&mut app, KeyCode::Char('t'));
    assert_eq!(app.overlay, None);
    let out = PathBuf::from(format!("{name}-{id}-tensorboard"));
    let want = Command::Export { run: id.clone(), format: flightdeck::export::Format::Tensorboard, out };
    assert_eq!(app.effects.take(), vec![want]);
    assert!(app.status.as_ref().is_some_and(|s| s.text.contains("exporting") && !s.error));
    // Any other key cancels, and says so.
    press(&mut app, KeyCode::Char('E'));
    press(&mut app, KeyCode::Esc);
    assert_eq!((app.overlay.clone(), app.effects.take()), (None, vec![]));
    assert!(app.status.as_ref().is_some_and(|s| s.text == "export cancelled"));
    press(&mut app, KeyCode::Char('P'));
    let out = PathBuf::from(format!("{name}-{id}-report"));
    assert_eq!(app.effects.take(), vec![Command::Report { run: id.clone(), out }]);
    // What comes back is said in the status line.
    app.on_data(DataEvent::Done(format!("report of {id} written: /x/report.md")));
    assert!(app.status.as_ref().is_some_and(|s| s.text.ends_with("/x/report.md")));
}

/// `X` on a command job says what a stop is there (SIGTERM; the program's own checkpoint, if
/// any), not a checkpoint Flightdeck cannot make.
#[test]
fn stop_on_a_command_job_promises_no_checkpoint() {
    let mut snap: RunSnapshot = fixture("open-snapshot.json");
    let mut recipe: serde_json::Value = serde_json::from_str(&snap.detail.run.recipe_json).expect("recipe JSON");
    recipe["kind"] = serde_json::json!("command");
    snap.detail.run.recipe_json = recipe.to_string();
    let id = snap.detail.run.id.clone();
    let mut app = app(Start::Open(id.to_string()));
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    typed(&mut app, "X");
    assert!(matches!(app.overlay, Some(Overlay::ConfirmStop { command: true, .. })), "{:?}", app.overlay);
}
