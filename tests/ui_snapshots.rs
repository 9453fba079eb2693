//! Whole-cockpit snapshots: recorded telemetry (tests/fixtures/telemetry, from a real 2-rank
//! run; re-record with tests/ui_record_fixtures.rs) fed into the App, drawn on a TestBackend at
//! 80×24 and 160×48 with a fixed clock.
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use flightdeck::agent::nvml_decode::{decode, RawGpuReading};
use flightdeck::ids::{Rank, RunId};
use flightdeck::protocol::{AgentEvent, AgentFrame, RunSnapshot};
use flightdeck::store::{CheckpointRecord, Point, ResumePoint, RunRecord};
use flightdeck::ui::app::{Overlay, Screen};
use flightdeck::ui::effects::{Command, DataEvent, Effects};
use flightdeck::ui::io::mean_by_step;
use flightdeck::ui::keymap::{Keymap, DEFAULT_KEYMAP};
use flightdeck::ui::panels::chart::ParentLoss;
use flightdeck::ui::panels::ckpts::{CkptList, Resumed};
use flightdeck::ui::{layout, App, Start};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;

const SIZES: [(u16, u16); 2] = [(80, 24), (160, 48)];

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/telemetry/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn runs() -> Vec<RunRecord> {
    fixture("runs.json")
}

fn open_snapshot() -> RunSnapshot {
    fixture("open-snapshot.json")
}

fn frames() -> Vec<AgentFrame> {
    fixture("open-frames.json")
}

fn app(start: Start, size: (u16, u16), now_ms: u64) -> App {
    let keymap = Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("default keymap");
    let layouts = layout::load_all(None).expect("layouts");
    App::new(Effects::fixed(now_ms), keymap, layouts, start, Rect::new(0, 0, size.0, size.1))
}

fn draw(app: &App) -> String {
    let mut t = Terminal::new(TestBackend::new(app.area.width, app.area.height)).expect("terminal");
    t.draw(|f| f.render_widget(app, f.area())).expect("draw");
    let buf = t.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn key(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
}

fn keys(app: &mut App, text: &str) {
    for c in text.chars() {
        app.on_key(key(c));
    }
}

fn end_ms(runs: &[RunRecord]) -> u64 {
    runs.iter().filter_map(|r| r.ended_ms).max().unwrap_or(0) + 1_000
}

/// The Run screen of the recorded live run: its snapshot, then frames up to `cut` of them.
fn live_app(size: (u16, u16), cut: usize, stale_ms: u64) -> App {
    let snap = open_snapshot();
    let frames = frames();
    let t = frames[..cut].last().map(|f| f.t_ms).unwrap_or(0);
    let mut app = app(Start::Open(snap.detail.run.id.to_string()), size, t + 300 + stale_ms);
    app.on_data(DataEvent::Snapshot(Box::new(snap.clone())));
    app.on_data(DataEvent::Frames { node: 0, run: snap.detail.run.id.clone(), frames: frames[..cut].to_vec() });
    app
}

#[test]
fn home() {
    for size in SIZES {
        let runs = runs();
        let mut app = app(Start::Home, size, end_ms(&runs));
        insta::assert_snapshot!(format!("home_loading_{}x{}", size.0, size.1), draw(&app));
        let id = runs[0].id.to_string();
        app.on_data(DataEvent::Runs(runs));
        let text = draw(&app);
        // At any size: every run's id (to copy it) and the way out.
        assert!(text.contains(&id), "{text}");
        assert!(text.lines().last().is_some_and(|l| l.ends_with("q quit")), "{text}");
        insta::assert_snapshot!(format!("home_{}x{}", size.0, size.1), text);
    }
}

#[test]
fn home_filter_mark_and_sort() {
    let runs = runs();
    let mut app = app(Start::Home, (80, 24), end_ms(&runs));
    app.on_data(DataEvent::Runs(runs));
    keys(&mut app, " o/lr");
    insta::assert_snapshot!("home_filtered_80x24", draw(&app));
}

#[test]
fn run_each_layout() {
    let cut = frames().len() / 2;
    for size in SIZES {
        let mut app = live_app(size, cut, 0);
        insta::assert_snapshot!(format!("run_default_{}x{}", size.0, size.1), draw(&app));
        keys(&mut app, "2");
        insta::assert_snapshot!(format!("run_debug_{}x{}", size.0, size.1), draw(&app));
    }
}

#[test]
fn run_finished_with_chart_toggles() {
    let all = frames().len();
    for size in SIZES {
        let mut app = live_app(size, all, 0);
        keys(&mut app, "eyr");
        insta::assert_snapshot!(format!("run_finished_toggles_{}x{}", size.0, size.1), draw(&app));
    }
}

#[test]
fn run_stale_data_shows_its_age() {
    let mut app = live_app((160, 48), frames().len() / 2, 20_000);
    let text = draw(&app);
    assert!(text.contains("data 20s ago"), "{text}");
    insta::assert_snapshot!("run_stale_160x48", text);
    keys(&mut app, "z");
    insta::assert_snapshot!("run_zoom_chart_80x24_like", draw(&app));
}

#[test]
fn compare() {
    let runs = runs();
    let points: Vec<(RunId, Vec<Point>)> = fixture("compare-points.json");
    for size in SIZES {
        let mut app = app(Start::Home, size, end_ms(&runs));
        app.on_data(DataEvent::Runs(runs.clone()));
        keys(&mut app, "  c");
        let sent = app.effects.take();
        let Some(Command::LoadCompare { runs: asked }) = sent.last() else { panic!("compare asks for loss: {sent:?}") };
        assert_eq!(asked.len(), 2, "both marked runs");
        for (run, pts) in &points {
            let points = flightdeck::ui::io::mean_by_step(pts);
            app.on_data(DataEvent::CompareSeries { run: run.clone(), points });
        }
        insta::assert_snapshot!(format!("compare_{}x{}", size.0, size.1), draw(&app));
    }
}

/// Compare opened on a sweep (no run marked, the selected run a sweep's): every point's newest
/// run, the swept values in the table, sortable with `o`.
#[test]
fn compare_a_sweep() {
    use flightdeck::record::{PointState, PointStatus, SweepPoint, SweepPointSpec, SweepRecord, SweepStatus};
    let mut runs = runs();
    // The two recorded runs as points 2 and 1 of a sweep over the learning rate and the seed.
    for (i, r) in runs.iter_mut().enumerate() {
        r.sweep = Some(SweepPoint { sweep: "S".into(), point: 1 - i as u32 });
    }
    let spec = |lr: &str| SweepPointSpec {
        values: vec![lr.to_string(), "7".to_string()],
        recipe_json: "{}".into(),
        run_name: format!("lr-{lr}"),
        world_size: 2,
        local: true,
    };
    let sweep = SweepRecord {
        id: "S".into(),
        name: "lr-sweep".into(),
        recipe_path: "recipes/tiny-gpt.toml".into(),
        created_ms: 0,
        keys: vec!["train.lr".into(), "train.seed".into()],
        points: vec![spec("0.001"), spec("0.003")],
        max_parallel: 2,
        max_ranks: 2,
        cancelled: vec![],
        launch_failed: vec![],
        env_json: "{}".into(),
    };
    let points = runs
        .iter()
        .map(|r| PointStatus {
            state: PointState::Run { run: r.id.clone(), status: r.status },
            restarting: false,
            step: r.step,
            steps: r.steps_planned,
            last_loss: r.last_loss,
            attempts: 1,
        })
        .collect();
    let status = SweepStatus { sweep, points };
    let series: Vec<(RunId, Vec<Point>)> = fixture("compare-points.json");
    let mut app = app(Start::Home, (160, 48), end_ms(&runs));
    app.on_data(DataEvent::Runs(runs.clone()));
    keys(&mut app, "c");
    let sent = app.effects.take();
    let asked = sent.iter().find_map(|c| match c {
        Command::LoadCompare { runs } => Some(runs.clone()),
        _ => None,
    });
    assert_eq!(asked.map(|a| a.len()), Some(2), "every point of the sweep: {sent:?}");
    assert!(sent.iter().any(|c| matches!(c, Command::LoadSweep { id } if id == "S")), "{sent:?}");
    app.on_data(DataEvent::Sweep(Box::new(status)));
    for ((run, pts), goodput) in series.iter().zip([0.78, 0.5]) {
        app.on_data(DataEvent::CompareSeries { run: run.clone(), points: mean_by_step(pts) });
        app.on_data(DataEvent::CompareGoodput { run: run.clone(), ratio: Some(goodput) });
    }
    let text = draw(&app);
    assert!(text.contains("GOODPUT") && text.contains("██████░░ 78%") && text.contains("████░░░░ 50%"), "{text}");
    assert!(text.contains("sweep lr-sweep") && text.contains("train.lr") && text.contains("sorted by point"), "{text}");
    // In point order, the run recorded second (point 1, lr 0.001) comes first.
    let row = |t: &str, v: &str| t.lines().position(|l| l.contains("0.00") && l.contains(v) && l.contains("succeeded"));
    assert!(row(&text, "0.001") < row(&text, "0.003"), "{text}");
    insta::assert_snapshot!("compare_sweep_160x48", text);
    keys(&mut app, "oooo");
    let text = draw(&app);
    assert!(text.contains("sorted by train.seed"), "{text}");
    keys(&mut app, "O");
    assert!(draw(&app).contains("sorted by train.seed (reversed)"));
}

#[test]
fn help_from_the_keymap() {
    for size in SIZES {
        let mut app = live_app(size, 10, 0);
        keys(&mut app, "?");
        insta::assert_snapshot!(format!("help_{}x{}", size.0, size.1), draw(&app));
    }
}

#[test]
fn a_log_search_without_a_match_says_so() {
    let mut app = live_app((160, 48), 10, 0);
    keys(&mut app, "/zzz");
    app.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    let text = draw(&app);
    assert!(text.contains("no match for \"zzz\"") && !text.contains("no log lines"), "{text}");
}

#[test]
fn help_pages_with_every_paging_key_and_says_what_is_below() {
    let mut app = live_app((80, 24), 10, 0);
    keys(&mut app, "?");
    let text = draw(&app);
    assert!(text.contains("more below · pagedown/pageup scroll"), "{text}");
    assert!(!text.contains("scroll a panel, click to focus it"), "the last entry is below at 80x24: {text}");
    assert!(text.contains(":run RECIPE k=v, :open RUN, :kill, :lay…"), "a long entry is elided with …: {text}");
    for (name, event) in [
        ("pagedown", KeyEvent::new(KeyCode::PageDown, KeyModifiers::NONE)),
        ("ctrl-d", KeyEvent::new(KeyCode::Char('d'), KeyModifiers::CONTROL)),
        ("G", key('G')),
        ("end", KeyEvent::new(KeyCode::End, KeyModifiers::NONE)),
        ("pageup", KeyEvent::new(KeyCode::PageUp, KeyModifiers::NONE)),
        ("g", key('g')),
    ] {
        app.on_key(event);
        assert!(matches!(app.overlay, Some(Overlay::Help { .. })), "{name} keeps help open");
    }
    keys(&mut app, "G");
    let text = draw(&app);
    assert!(
        text.contains("scroll a panel, click to focus it") && text.contains("end · "),
        "G shows the last entry: {text}"
    );
    keys(&mut app, "k");
    assert!(draw(&app).contains("1 more below"), "k from the end scrolls up one at once");
    keys(&mut app, "q");
    assert!(app.overlay.is_none(), "q still closes help");
    // At 160x48 every entry fits: no scroll line.
    let mut big = live_app((160, 48), 10, 0);
    keys(&mut big, "?");
    let text = draw(&big);
    assert!(text.contains("scroll a panel, click to focus it") && !text.contains("more below"), "{text}");
}

fn ckpt(run: &RunId, step: u64, saved_ms: u64, problem: Option<&str>) -> CheckpointRecord {
    CheckpointRecord {
        run: run.clone(),
        step,
        path: format!("/data/fd/runs/{run}/checkpoints/step-{step:08}"),
        bytes: 1_234_567 + step * 10,
        loss: Some(3.0 - step as f64 * 0.03),
        saved_ms,
        blocking_ms: 2.5,
        write_ms: 41.0,
        verified: problem.is_none(),
        checked: "sha256".into(),
        checked_ms: saved_ms,
        problem: problem.map(String::from),
        nodes: Vec::new(),
    }
}

/// Four checkpoints of `run`, every 10 steps to 40; step 30 lost a file.
fn ckpt_list(run: &RunId, now: u64) -> CkptList {
    let checkpoints =
        (1..=4).map(|i| ckpt(run, i * 10, now - (5 - i) * 2_000, (i == 3).then_some("optim.bin is missing"))).collect();
    CkptList { run: run.clone(), dir: format!("/data/fd/runs/{run}/checkpoints"), latest: Some(40), checkpoints }
}

#[test]
fn checkpoints_screen_and_resume_confirmation() {
    for size in SIZES {
        let runs = runs();
        let now = end_ms(&runs);
        let mut app = app(Start::Home, size, now);
        app.on_data(DataEvent::Runs(runs));
        app.effects.take();
        keys(&mut app, "C");
        let sent = app.effects.take();
        let Some(Command::LoadCheckpoints { run, verify: false }) = sent.last().cloned() else {
            panic!("C lists the selected run's checkpoints: {sent:?}")
        };
        insta::assert_snapshot!(format!("ckpts_loading_{}x{}", size.0, size.1), draw(&app));
        app.on_data(DataEvent::Checkpoints(Box::new(ckpt_list(&run, now))));
        let text = draw(&app);
        assert!(text.contains("LATEST"), "{text}");
        insta::assert_snapshot!(format!("ckpts_{}x{}", size.0, size.1), text);
        // The cursor starts on the newest verified (40); two down is 20, past the broken 30.
        keys(&mut app, "jjR");
        let text = draw(&app);
        assert!(text.contains("20 (selected)") && text.contains("step-00000020"), "{text}");
        insta::assert_snapshot!(format!("ckpts_confirm_resume_{}x{}", size.0, size.1), text);
        keys(&mut app, "y");
        assert_eq!(app.effects.take(), vec![Command::Resume { run: run.clone(), step: Some(20), kill_first: false }]);
        app.on_data(DataEvent::ResumeFailed("run X: checkpoint step 20: optim.bin is missing".into()));
        let text = draw(&app);
        assert!(text.contains("resume refused: run X: checkpoint step 20: optim.bin"), "{text}");
        keys(&mut app, "q");
        assert!(app.overlay.is_none());
        assert_eq!(app.screen, Screen::Checkpoints, "closing the overlay stays on the list");
        // A resume that starts switches to the child's Run screen.
        let child = RunId("20261202T110000-c0de".into());
        let resumed =
            Resumed { run: child.clone(), parent: run.clone(), step: 20, path: "p".into(), skipped: Vec::new() };
        app.on_data(DataEvent::Resumed(Box::new(resumed)));
        assert_eq!(app.screen, Screen::Run);
        assert!(app.effects.take().contains(&Command::Open { run: child.to_string() }));
    }
}

#[test]
fn resume_from_the_run_screen_names_the_newest_verified_checkpoint() {
    // A finished run: R without the Checkpoints screen asks for the list, then names its newest
    // verified checkpoint (40 here; 60 would be the last step, which the overlay warns about).
    let mut snap: RunSnapshot = fixture("finished-snapshot.json");
    snap.detail.run.steps_planned = 60;
    let run = snap.detail.run.id.clone();
    let now = snap.detail.run.ended_ms.unwrap_or(0) + 10_000;
    let mut app = app(Start::Open(run.to_string()), (80, 24), now);
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.effects.take();
    keys(&mut app, "R");
    assert_eq!(app.effects.take(), vec![Command::LoadCheckpoints { run: run.clone(), verify: false }]);
    assert!(draw(&app).contains("listing"), "{}", draw(&app));
    app.on_data(DataEvent::Checkpoints(Box::new(ckpt_list(&run, now))));
    let text = draw(&app);
    assert!(text.contains("40 (newest verified)") && text.contains("steps 41–60"), "{text}");
    insta::assert_snapshot!("run_confirm_resume_newest_80x24", text);
    keys(&mut app, "n");
    assert!(app.overlay.is_none() && app.effects.take().is_empty(), "any other key cancels");
}

/// The finished run as a child of the other recorded run, resumed from its step 20.
fn child_snapshot() -> (RunSnapshot, ParentLoss) {
    let mut snap: RunSnapshot = fixture("finished-snapshot.json");
    let parent = RunId("20261202T105754-5919".into());
    snap.detail.run.parent = Some(parent.clone());
    snap.detail.run.resumed_from = Some(ResumePoint { step: 20, path: "/data/step-00000020".into() });
    for s in &mut snap.series {
        s.buckets.retain(|b| b.last_step > 20);
    }
    let points: Vec<(RunId, Vec<Point>)> = fixture("compare-points.json");
    let mut mean = points.iter().find(|(r, _)| *r == parent).map(|(_, p)| mean_by_step(p)).expect("parent points");
    mean.retain(|(s, _)| *s <= 20);
    (snap, ParentLoss { parent, step: 20, points: mean, marks: vec![20] })
}

#[test]
fn resumed_run_chart_draws_the_parent_up_to_the_resume_step() {
    for size in SIZES {
        let (snap, loss) = child_snapshot();
        let child = snap.detail.run.id.clone();
        let mut app = app(Start::Open(child.to_string()), size, snap.detail.run.ended_ms.unwrap_or(0) + 1_000);
        app.effects.take();
        app.on_data(DataEvent::Snapshot(Box::new(snap)));
        let sent = app.effects.take();
        let want = Command::LoadParentLoss { child: child.clone(), parent: loss.parent.clone(), step: 20 };
        assert_eq!(sent, vec![want], "a resumed run asks for its parent's loss");
        app.on_data(DataEvent::ParentLoss { child, loss });
        let text = draw(&app);
        assert!(text.contains("↳20"), "the resume step is marked on the axis: {text}");
        if size.0 >= 160 {
            assert!(text.contains("↳ 20261202T105754-5919@20"), "the header names the parent: {text}");
        }
        insta::assert_snapshot!(format!("run_resumed_chart_{}x{}", size.0, size.1), text);
    }
}

#[test]
fn a_lineage_of_restarts_marks_every_resume_step_on_the_chart() {
    let (snap, mut loss) = child_snapshot();
    // The parent was itself restarted at step 8: two resumes in the lineage.
    loss.marks = vec![8, 20];
    let child = snap.detail.run.id.clone();
    let mut app = app(Start::Open(child.to_string()), (160, 48), snap.detail.run.ended_ms.unwrap_or(0) + 1_000);
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.on_data(DataEvent::ParentLoss { child, loss });
    let text = draw(&app);
    assert!(text.contains("↳8") && text.contains("↳20"), "both resume steps on the axis: {text}");
    assert!(text.contains("@20 · 2 resumes"), "the lineage's resumes are counted: {text}");
}

#[test]
fn home_shows_lineage() {
    for size in SIZES {
        let mut runs = runs();
        let now = end_ms(&runs);
        let mut child = runs[0].clone();
        child.id = RunId("20261202T110000-c0de".into());
        child.parent = Some(runs[0].id.clone());
        child.resumed_from = Some(ResumePoint { step: 20, path: "/data/step-00000020".into() });
        child.created_ms = now - 500;
        runs.push(child);
        let mut app = app(Start::Home, size, now);
        app.on_data(DataEvent::Runs(runs));
        let text = draw(&app);
        assert!(text.contains("↳ tiny-gpt"), "{text}");
        insta::assert_snapshot!(format!("home_lineage_{}x{}", size.0, size.1), text);
    }
}

#[derive(serde::Deserialize)]
struct NvmlRecording {
    ranks: Vec<(u32, u32)>,
    readings: Vec<RawGpuReading>,
}

fn nvml(name: &str) -> NvmlRecording {
    let path = format!("{}/tests/fixtures/nvml/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

/// GPU samples decoded from the recorded NVML readings: the H200 (second reading: power cap
/// and thermal slowdown) as GPU 0 with rank 0's process on it, the L4 (no GPM) as GPU 1.
fn gpu_frames(after: &AgentFrame) -> Vec<AgentFrame> {
    let h200 = nvml("h200-training.json");
    let ranks: Vec<(Rank, u32)> = h200.ranks.iter().map(|(r, p)| (Rank(*r), *p)).collect();
    let g0 = decode(Some(&h200.readings[0]), &h200.readings[1], &ranks);
    let l4 = nvml("l4-no-gpm.json");
    let ranks: Vec<(Rank, u32)> = l4.ranks.iter().map(|(r, p)| (Rank(*r), *p)).collect();
    let mut g1 = decode(None, &l4.readings[0], &ranks);
    g1.index = 1;
    [g0, g1]
        .into_iter()
        .enumerate()
        .map(|(i, g)| AgentFrame {
            seq: after.seq + 1 + i as u64,
            t_ms: after.t_ms,
            event: AgentEvent::GpuSample(Box::new(g)),
        })
        .collect()
}

#[test]
fn gpu_layout_from_nvml_fixtures() {
    let cut = frames().len() / 2;
    for size in SIZES {
        let mut app = live_app(size, cut, 0);
        let run = app.run.model.as_ref().map(|m| m.state.record.id.clone()).expect("model");
        let last = frames()[cut - 1].clone();
        app.on_data(DataEvent::Frames { node: 0, run, frames: gpu_frames(&last) });
        keys(&mut app, "3");
        let text = draw(&app);
        assert!(text.contains("gpus 2 · 1 slowed") && text.contains("MFU"), "{text}");
        insta::assert_snapshot!(format!("run_gpu_{}x{}", size.0, size.1), text);
    }
}

/// A finished GRPO run (tests/fixtures/telemetry/grpo-snapshot.json, recorded from a real
/// 2-rank run) opens on the `rl` layout: its four charts, the time split and the samples.
#[test]
fn a_grpo_run_opens_on_the_rl_layout() {
    let snap: RunSnapshot = fixture("grpo-snapshot.json");
    let end = snap.detail.run.ended_ms.unwrap_or(0) + 1_000;
    for size in SIZES {
        let mut app = app(Start::Open(snap.detail.run.id.to_string()), size, end);
        app.on_data(DataEvent::Snapshot(Box::new(snap.clone())));
        let screen = draw(&app);
        if size.0 >= 160 {
            assert!(screen.contains("layout rl"), "{screen}");
            for part in ["reward", "kl", "completions/mean_length", "eval/exact_match", "time split", "generate"] {
                assert!(screen.contains(part), "{part} missing:\n{screen}");
            }
            assert!(screen.contains(" → "), "a sample:\n{screen}");
        }
        insta::assert_snapshot!(format!("run_rl_{}x{}", size.0, size.1), screen);
    }
}

/// The Checkpoints footer offers to stop the run only while it is live (a finished run's
/// footer above has no `X stop run`).
#[test]
fn the_checkpoints_footer_offers_stop_only_for_a_live_run() {
    let mut runs = runs();
    for r in &mut runs {
        r.status = flightdeck::record::RunStatus::Running;
    }
    let now = end_ms(&runs);
    let mut app = app(Start::Home, (160, 48), now);
    app.on_data(DataEvent::Runs(runs.clone()));
    keys(&mut app, "C");
    assert!(draw(&app).contains("X stop run"), "{}", draw(&app));
    // The run ends while the screen is open: the polled list says so, and the offer goes.
    for r in &mut runs {
        r.status = flightdeck::record::RunStatus::Succeeded;
    }
    app.on_data(DataEvent::Runs(runs));
    assert!(!draw(&app).contains("stop run"), "{}", draw(&app));
}
