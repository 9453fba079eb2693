//! Whole-cockpit snapshots: recorded telemetry (tests/fixtures/telemetry, from a real 2-rank
//! run; re-record with tests/ui_record_fixtures.rs) fed into the App, drawn on a TestBackend at
//! 80×24 and 160×48 with a fixed clock.
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use flightdeck::ids::RunId;
use flightdeck::protocol::{AgentFrame, RunSnapshot};
use flightdeck::store::{Point, RunRecord};
use flightdeck::ui::effects::{Command, DataEvent, Effects};
use flightdeck::ui::keymap::{Keymap, DEFAULT_KEYMAP};
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
    app.on_data(DataEvent::Frames { run: snap.detail.run.id.clone(), frames: frames[..cut].to_vec() });
    app
}

#[test]
fn home() {
    for size in SIZES {
        let runs = runs();
        let mut app = app(Start::Home, size, end_ms(&runs));
        insta::assert_snapshot!(format!("home_loading_{}x{}", size.0, size.1), draw(&app));
        app.on_data(DataEvent::Runs(runs));
        insta::assert_snapshot!(format!("home_{}x{}", size.0, size.1), draw(&app));
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

#[test]
fn help_from_the_keymap() {
    for size in SIZES {
        let mut app = live_app(size, 10, 0);
        keys(&mut app, "?");
        insta::assert_snapshot!(format!("help_{}x{}", size.0, size.1), draw(&app));
    }
}
