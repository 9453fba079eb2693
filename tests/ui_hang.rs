//! The cockpit's hang hunting without a terminal: the verdict banner and the highlighted
//! culprit, the stacks viewer (keys become requests, answers fill it, a finished run says why
//! not), and the collective matrix; snapshots at 80×24 and 160×48 from the recorded 2-rank run
//! with a verdict and a stack dump built the way the server builds them.
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use flightdeck::agent::stacks::parse_eu_stack;
use flightdeck::ids::{RunId, Step};
use flightdeck::protocol::{AgentEvent, AgentFrame, CollectiveRef, CollectiveState, Culprit, Frame, Phase};
use flightdeck::protocol::{RankMsg, RankStacks, RunSnapshot, StackReport, StackTool, Verdict, VerdictKind};
use flightdeck::store::EventKind;
use flightdeck::ui::app::Overlay;
use flightdeck::ui::effects::{Command, DataEvent, Effects};
use flightdeck::ui::keymap::{Keymap, DEFAULT_KEYMAP};
use flightdeck::ui::panels::ckpts::CkptList;
use flightdeck::ui::panels::matrix::{self, Cell};
use flightdeck::ui::panels::stacks::{report_lines, StacksState};
use flightdeck::ui::{layout, App, Start};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier};
use ratatui::Terminal;

const SIZES: [(u16, u16); 2] = [(80, 24), (160, 48)];

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn press(app: &mut App, code: KeyCode) {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn keys(app: &mut App, text: &str) {
    text.chars().for_each(|c| press(app, KeyCode::Char(c)));
}

fn draw(app: &App) -> (String, ratatui::buffer::Buffer) {
    let mut t = Terminal::new(TestBackend::new(app.area.width, app.area.height)).expect("terminal");
    t.draw(|f| f.render_widget(app, f.area())).expect("draw");
    let buf = t.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    (out, buf)
}

fn collective(f: &AgentFrame) -> Option<(u32, u64, CollectiveState)> {
    match &f.event {
        AgentEvent::Rank { rank, msg: RankMsg::Collective(r) } => Some((rank.0, r.seq, r.state)),
        _ => None,
    }
}

/// The recorded run mid-way, reshaped into a hang: rank 1 never entered the last collective
/// its peer entered, and rank 0 waits inside it.
struct Hung {
    app: App,
    run: RunId,
    seq: u64,
    t_ms: u64,
}

fn hung(size: (u16, u16)) -> Hung {
    let snap: RunSnapshot = fixture("telemetry/open-snapshot.json");
    let frames: Vec<AgentFrame> = fixture("telemetry/open-frames.json");
    let mut frames = frames[..frames.len() / 2].to_vec();
    let seq = frames.iter().filter_map(collective).map(|c| c.1).max().expect("collectives");
    frames.retain(|f| match collective(f) {
        Some((1, s, _)) => s != seq,
        Some((0, s, state)) => !(s == seq && state == CollectiveState::Completed),
        _ => true,
    });
    let t_ms = frames.last().expect("frames").t_ms;
    let run = snap.detail.run.id.clone();
    let keymap = Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("default keymap");
    let layouts = layout::load_all(None).expect("layouts");
    let area = Rect::new(0, 0, size.0, size.1);
    let mut app = App::new(Effects::fixed(t_ms + 9_000), keymap, layouts, Start::Open(run.to_string()), area);
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.on_data(DataEvent::Frames { node: 0, run: run.clone(), frames });
    app.effects.take();
    Hung { app, run, seq, t_ms }
}

fn verdict(h: &Hung) -> Verdict {
    let m = h.app.run.model.as_ref().expect("model");
    let r1 = &m.state.ranks[1];
    Verdict {
        kind: VerdictKind::NeverEntered,
        culprits: vec![Culprit {
            rank: 1,
            host: r1.host.clone(),
            pid: r1.pid,
            phase: Some(Phase::Data),
            step: r1.step,
            last_seq: h.seq - 1,
            detail: format!("never entered all_reduce #{}; last phase data", h.seq),
        }],
        collective: Some(CollectiveRef {
            seq: h.seq,
            op: flightdeck::protocol::CollectiveOp::AllReduce,
            elements: 407_040,
            bytes: 1_628_160,
            step: Step(r1.step + 1),
        }),
        waiting: vec![0],
        since_ms: h.t_ms,
        detected_ms: h.t_ms + 5_200,
        summary: format!(
            "rank 1 ({}, pid {}) never entered all_reduce #{} (1.6 MiB, step {}); last phase data; 1 rank waiting 5.2 s",
            r1.host,
            r1.pid.unwrap_or(0),
            h.seq,
            r1.step + 1
        ),
    }
}

/// A dump as the server groups it: eu-stack's text of a worker for each rank, rank 1's main
/// thread elsewhere (in the data loader).
fn report(run: &RunId, ranks: &[u32], odd: u32) -> StackReport {
    let text =
        std::fs::read_to_string(format!("{}/tests/fixtures/stacks/eu-stack-worker.txt", env!("CARGO_MANIFEST_DIR")))
            .expect("eu-stack fixture");
    let threads = parse_eu_stack(&text);
    let pid = threads[0].tid;
    let stacks: Vec<RankStacks> = ranks
        .iter()
        .map(|&rank| {
            let mut threads = threads.clone();
            if rank == odd {
                threads[0].frames.splice(
                    0..2,
                    [
                        Frame { function: "std::thread::sleep".into(), location: None },
                        Frame {
                            function: "flightdeck::worker::train::next_batch".into(),
                            location: Some("src/worker/train.rs:88".into()),
                        },
                    ],
                );
            }
            RankStacks {
                rank,
                host: "local".into(),
                pid,
                tool: Some(StackTool::EuStack),
                elapsed_ms: 25 + u64::from(rank),
                threads,
                error: None,
            }
        })
        .collect();
    let (groups, failures) = flightdeck::protocol::stacks::group(&stacks);
    let timings = stacks.iter().map(|s| (s.rank, s.pid, s.tool, s.elapsed_ms)).collect();
    StackReport { run: run.clone(), groups, failures, timings }
}

#[test]
fn the_banner_names_the_culprit_and_its_row_stands_out() {
    for size in SIZES {
        let mut h = hung(size);
        let (before, _) = draw(&h.app);
        assert!(!before.contains("HANG"), "no verdict, no banner:\n{before}");
        let v = verdict(&h);
        h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![v], incidents: vec![] });
        let (text, buf) = draw(&h.app);
        let banner = text.lines().nth(1).expect("line 2");
        assert!(banner.contains("HANG never-entered") && banner.contains("rank 1 (local, pid"), "{banner}");
        let header = text.lines().next().expect("line 1");
        assert!(header.contains(" hung ") && !header.contains("running"), "a live hang makes it hung: {header}");
        // When narrow, what stays: the hang's duration, the run's name and id, the way back.
        assert!(banner.contains(" · for 9s"), "{banner}");
        assert!(header.contains("tiny-gpt") && header.contains(h.run.as_str()), "{header}");
        let footer = text.lines().last().expect("the footer");
        assert!(footer.starts_with("? help") && footer.trim_end().ends_with("q back"), "{footer}");
        // Events cut to the panel's width end in `…`.
        let cut = text.lines().find(|l| l.contains("never-entered: rank 1")).expect("the verdict event");
        assert!(cut.contains("…"), "{cut}");
        assert!(buf[(1, 1)].bg == Color::Red, "the banner is red");
        insta::assert_snapshot!(format!("banner_default_{}x{}", size.0, size.1), text);
        // The culprit's row in the ranks table: red and reversed, its rank marked.
        let y = text.lines().position(|l| l.contains("│1!")).expect("rank 1's row marked") as u16;
        let x = text.lines().nth(y as usize).and_then(|l| l.chars().position(|c| c == '!')).expect("!") as u16;
        let cell = &buf[(x, y)];
        assert!(cell.fg == Color::Red && cell.modifier.contains(Modifier::REVERSED), "{cell:?}");
        assert!(text.contains("│0…"), "the waiting rank is marked:\n{text}");
        // The events panel hears of it once, however often progress repeats it.
        let again = verdict(&h);
        h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![again], incidents: vec![] });
        let m = h.app.run.model.as_ref().expect("model");
        let n = m.events.iter().filter(|e| e.kind == flightdeck::store::EventKind::Verdict).count();
        assert_eq!(n, 1);
        keys(&mut h.app, "2");
        insta::assert_snapshot!(format!("banner_debug_{}x{}", size.0, size.1), draw(&h.app).0);
        // Progress resumes: the banner goes, and the run is running again.
        h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![], incidents: vec![] });
        let (text, _) = draw(&h.app);
        assert!(!text.contains("HANG") && text.lines().next().unwrap().contains(" running "), "{text}");
    }
}

#[test]
fn the_matrix_shows_who_never_entered() {
    let mut h = hung((160, 48));
    let v = verdict(&h);
    h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![v], incidents: vec![] });
    let m = h.app.run.model.as_ref().expect("model");
    let row = &m.collectives[&h.seq];
    assert_eq!(matrix::cell(m, row, 0), Cell::InFlight);
    assert_eq!(matrix::cell(m, row, 1), Cell::NotEntered);
    assert_eq!(matrix::cell(m, &m.collectives[&(h.seq - 1)], 1), Cell::Done);
    keys(&mut h.app, "2");
    let (text, _) = draw(&h.app);
    assert!(text.contains("○ not entered"), "{text}");
    let r1 = text.lines().find(|l| l.starts_with("│r1 ") || l.starts_with("┃r1 ")).expect("rank 1 in the matrix");
    let cells = r1.split("││").next().unwrap_or(r1);
    assert!(cells.trim_end_matches(|c| " │".contains(c)).ends_with('○'), "{r1}");
}

#[test]
fn s_dumps_the_selected_rank_off_the_ui_and_the_answer_fills_the_viewer() {
    for size in SIZES {
        let mut h = hung(size);
        h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![verdict(&h)], incidents: vec![] });
        // Select rank 1 in the ranks table (the default layout's second panel).
        press(&mut h.app, KeyCode::Tab);
        press(&mut h.app, KeyCode::Tab);
        keys(&mut h.app, "js");
        assert_eq!(h.app.effects.take(), vec![Command::Stacks { run: h.run.clone(), rank: Some(1), native: false }]);
        assert_eq!(h.app.overlay, Some(Overlay::Stacks));
        let (text, _) = draw(&h.app);
        assert!(text.contains("dumping stacks of rank 1…"), "{text}");
        insta::assert_snapshot!(format!("stacks_dumping_{}x{}", size.0, size.1), text);
        keys(&mut h.app, "S");
        assert!(h.app.effects.take().is_empty(), "one dump at a time");
        let one = report(&h.run, &[1], 1);
        h.app.on_data(DataEvent::Stacks { run: h.run.clone(), rank: Some(1), result: Ok(Box::new(one)) });
        assert!(matches!(h.app.run.stacks.state, StacksState::Ready { .. }));
        let (text, _) = draw(&h.app);
        assert!(text.contains("main thread") && text.contains("next_batch"), "{text}");
        press(&mut h.app, KeyCode::Esc);
        assert!(h.app.overlay.is_none());
        keys(&mut h.app, "S");
        assert_eq!(h.app.effects.take(), vec![Command::Stacks { run: h.run.clone(), rank: None, native: false }]);
        let all = report(&h.run, &[0, 1], 1);
        h.app.on_data(DataEvent::Stacks { run: h.run.clone(), rank: None, result: Ok(Box::new(all)) });
        insta::assert_snapshot!(format!("stacks_all_{}x{}", size.0, size.1), draw(&h.app).0);
        keys(&mut h.app, "jjjj");
        assert_eq!(h.app.run.stacks.scroll, 4, "j scrolls the viewer");
        // In the debug layout the stacks are a panel, focused by s.
        press(&mut h.app, KeyCode::Esc);
        keys(&mut h.app, "2");
        h.app.on_data(DataEvent::Stacks {
            run: h.run.clone(),
            rank: None,
            result: Err("the agent of run x did not answer within 40s".into()),
        });
        let (text, _) = draw(&h.app);
        assert!(text.contains("no stacks of all ranks: the agent of run x did not answer"), "{text}");
        keys(&mut h.app, "S");
        assert!(h.app.overlay.is_none(), "the debug layout's stacks panel takes it");
        let all = report(&h.run, &[0, 1], 1);
        h.app.on_data(DataEvent::Stacks { run: h.run.clone(), rank: None, result: Ok(Box::new(all)) });
        insta::assert_snapshot!(format!("stacks_debug_{}x{}", size.0, size.1), draw(&h.app).0);
        assert_eq!(h.app.effects.take(), vec![Command::Stacks { run: h.run.clone(), rank: None, native: false }]);
        // N: the selected rank's stacks with native frames too (py-spy --native for Python ranks).
        keys(&mut h.app, "N");
        assert_eq!(h.app.effects.take(), vec![Command::Stacks { run: h.run.clone(), rank: Some(1), native: true }]);
    }
}

#[test]
fn the_odd_rank_out_comes_last_and_is_marked() {
    let run = RunId("r".into());
    let lines: Vec<String> = report_lines(&report(&run, &[0, 1, 2], 1))
        .iter()
        .map(|l| l.spans.iter().map(|s| s.content.to_string()).collect())
        .collect();
    let head0 = lines.iter().position(|l| l.contains("── ranks 0,2")).expect("the pair first");
    let head1 = lines.iter().position(|l| l.contains("── rank 1")).expect("the lone rank");
    assert!(head0 < head1, "{lines:#?}");
    assert!(lines[head1].contains("odd one out") && !lines[head0].contains("odd one out"), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("other thread(s)")), "helper threads listed, collapsed");
}

#[test]
fn stacks_of_a_finished_run_say_why_not_and_ask_nothing() {
    let snap: RunSnapshot = fixture("telemetry/open-snapshot.json");
    let frames: Vec<AgentFrame> = fixture("telemetry/open-frames.json");
    let run = snap.detail.run.id.clone();
    let keymap = Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("default keymap");
    let layouts = layout::load_all(None).expect("layouts");
    let mut app = App::new(
        Effects::fixed(1_900_000_000_000),
        keymap,
        layouts,
        Start::Open(run.to_string()),
        Rect::new(0, 0, 100, 30),
    );
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    app.on_data(DataEvent::Frames { node: 0, run, frames });
    app.effects.take();
    keys(&mut app, "S");
    assert!(app.effects.take().is_empty());
    let (text, _) = draw(&app);
    assert!(text.contains("is succeeded, not live: stacks are read from"), "{text}");
}

/// The hung run, with its (empty) checkpoint listing: `checkpoint.every = 100`, step 12.
fn no_checkpoints(h: &Hung) -> DataEvent {
    let dir = format!("/data/fd/runs/{}/checkpoints", h.run);
    DataEvent::Checkpoints(Box::new(CkptList { run: h.run.clone(), dir, latest: None, checkpoints: Vec::new() }))
}

#[test]
fn r_on_a_hung_run_without_a_checkpoint_refuses_before_killing_and_offers_k() {
    for size in SIZES {
        let mut h = hung(size);
        let v = verdict(&h);
        h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![v], incidents: vec![] });
        h.app.effects.take();
        keys(&mut h.app, "R");
        assert_eq!(h.app.effects.take(), vec![Command::LoadCheckpoints { run: h.run.clone(), verify: false }]);
        // Still listing: y waits rather than kill blind.
        keys(&mut h.app, "y");
        assert!(h.app.effects.take().is_empty(), "y before the listing sends nothing");
        assert!(matches!(h.app.overlay, Some(Overlay::ConfirmResume(_))));
        h.app.on_data(no_checkpoints(&h));
        let (text, _) = draw(&h.app);
        let Some(Overlay::ConfirmResume(plan)) = &h.app.overlay else { panic!("still asking") };
        let said: String = plan.lines().iter().map(|l| l.to_string()).collect::<Vec<_>>().join(" ");
        assert!(said.contains("nothing to restart from: y would only kill it"), "{said}");
        assert!(said.contains("before its first save at step 100"), "the true reason: {said}");
        assert!(flat(&text).contains("(checkpoint.every = 100)"), "the overlay shows all of it:\n{text}");
        assert!(text.contains("K kill it · esc close"), "the overlay ends with its keys:\n{text}");
        insta::assert_snapshot!(format!("resume_hung_no_checkpoint_{}x{}", size.0, size.1), text);
        keys(&mut h.app, "y");
        assert!(h.app.effects.take().is_empty(), "y neither kills nor resumes");
        assert!(h.app.overlay.is_none());
        // K from the same overlay asks to kill, and only y there kills.
        keys(&mut h.app, "R");
        h.app.on_data(no_checkpoints(&h));
        h.app.effects.take();
        keys(&mut h.app, "K");
        assert!(matches!(h.app.overlay, Some(Overlay::ConfirmKill { .. })), "{:?}", h.app.overlay);
        keys(&mut h.app, "y");
        assert_eq!(h.app.effects.take(), vec![Command::Kill { run: h.run.clone() }]);
    }
}

#[test]
fn confirmations_wrap_to_fit_and_end_with_their_keys() {
    for size in SIZES {
        let mut h = hung(size);
        for (key, name, end) in [('X', "stop", "SIGKILL)."), ('K', "kill", "is saved.")] {
            keys(&mut h.app, &key.to_string());
            let (text, _) = draw(&h.app);
            assert!(text.contains("y confirm · esc cancel"), "{name} at {size:?} ends with its keys:\n{text}");
            assert!(text.contains(end), "{name} at {size:?} is whole:\n{text}");
            insta::assert_snapshot!(format!("confirm_{name}_{}x{}", size.0, size.1), text);
            press(&mut h.app, KeyCode::Esc);
            assert!(h.app.overlay.is_none());
        }
    }
}

/// The screen's words in order, borders dropped: text that wraps reads as one line.
fn flat(text: &str) -> String {
    text.replace(['│', '┃'], " ").split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn alerts_count_verdicts_and_failures_not_clean_exits() {
    // The recorded finished run succeeded: its two clean rank exits are not alerts.
    let snap: RunSnapshot = fixture("telemetry/finished-snapshot.json");
    let run = snap.detail.run.id.clone();
    let keymap = Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("default keymap");
    let area = Rect::new(0, 0, 160, 48);
    let now = snap.detail.run.ended_ms.unwrap_or(0) + 1_000;
    let layouts = layout::load_all(None).expect("layouts");
    let mut app = App::new(Effects::fixed(now), keymap, layouts, Start::Open(run.to_string()), area);
    app.on_data(DataEvent::Snapshot(Box::new(snap)));
    let (text, _) = draw(&app);
    assert!(text.contains("rank 0 (local, pid") && text.contains(" · 0 alerts"), "{text}");
    // A hang verdict is one.
    let mut h = hung((160, 48));
    let v = verdict(&h);
    h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts: vec![v], incidents: vec![] });
    assert!(draw(&h.app).0.contains(" · 1 alert "), "{}", draw(&h.app).0);
}

#[test]
fn the_incident_report_is_an_event_and_i_opens_it_scrollable() {
    for size in SIZES {
        let mut h = hung(size);
        let v = verdict(&h);
        let path = format!("/data/fd/runs/{}/incident-never-entered.md", h.run);
        for _ in 0..2 {
            let verdicts = vec![v.clone()];
            h.app.on_data(DataEvent::Verdicts { run: h.run.clone(), verdicts, incidents: vec![path.clone()] });
        }
        let m = h.app.run.model.as_ref().expect("model");
        let said: Vec<&str> =
            m.events.iter().filter(|e| e.kind == EventKind::Incident).map(|e| e.text.as_str()).collect();
        assert_eq!(said, [format!("incident report written: {path}")], "once, however often progress repeats it");
        h.app.effects.take();
        keys(&mut h.app, "I");
        assert_eq!(h.app.effects.take(), vec![Command::LoadIncident { run: h.run.clone() }]);
        assert_eq!(h.app.overlay, Some(Overlay::Incident));
        assert!(draw(&h.app).0.contains("asking the server for the report…"));
        let md: String = ["# Incident: never-entered", "", "## Timeline"]
            .into_iter()
            .map(String::from)
            .chain((0..60).map(|i| format!("- line {i} of the timeline")))
            .collect::<Vec<_>>()
            .join("\n");
        h.app.on_data(DataEvent::Incident { run: h.run.clone(), result: Ok((Some(path.clone()), md)) });
        let (text, _) = draw(&h.app);
        assert!(text.contains("# Incident: never-entered") && text.contains("line 1/63"), "{text}");
        insta::assert_snapshot!(format!("incident_{}x{}", size.0, size.1), text);
        keys(&mut h.app, "jj");
        let (text, _) = draw(&h.app);
        assert!(text.contains("line 3/63") && !text.contains("# Incident"), "j scrolls:\n{text}");
        keys(&mut h.app, "G");
        assert!(draw(&h.app).0.contains("line 63/63"), "G goes to the end");
        press(&mut h.app, KeyCode::Esc);
        assert!(h.app.overlay.is_none());
        // A run without one says why.
        keys(&mut h.app, "I");
        let why = "run X has no incident report: one is written when a hang verdict is given".to_string();
        h.app.on_data(DataEvent::Incident { run: h.run.clone(), result: Err(why.clone()) });
        assert!(draw(&h.app).0.contains("has no incident report"));
    }
}

#[test]
fn p_shows_a_torch_jobs_process_groups_one_at_a_time_and_the_member_that_never_entered() {
    // The recorded 4-rank job (tests/fixtures/torchfr/groups): groups [0, 1] and [2, 3] besides
    // the world; rank 3 sleeps before its group's all-reduce, rank 2 waits in it.
    let mut h = hung((160, 48));
    let last = h.app.run.model.as_ref().expect("model").snapshot_seq.first().copied().unwrap_or(0) + 10_000;
    let frames: Vec<AgentFrame> = (0..4u32)
        .map(|k| {
            let path = format!("{}/tests/fixtures/torchfr/groups/rank_{k}", env!("CARGO_MANIFEST_DIR"));
            let dump = flightdeck::torchfr::parse(&std::fs::read(&path).expect("fixture"), &path).expect("parses");
            let snapshot = Box::new(flightdeck::torchfr::Snapshot { dump: dump.recent(4), main_stack: Vec::new() });
            AgentFrame {
                seq: last + u64::from(k),
                t_ms: h.t_ms,
                event: AgentEvent::TorchFlight { rank: flightdeck::ids::Rank(k), snapshot },
            }
        })
        .collect();
    h.app.on_data(DataEvent::Frames { node: 0, run: h.run.clone(), frames });
    let groups = h.app.run.model.as_ref().expect("model").process_groups();
    let names: Vec<String> = groups.iter().map(|g| format!("{} {:?}", g.name, g.ranks)).collect();
    assert_eq!(names, ["0 [0, 1, 2, 3]", "1 [0, 1]", "2 [2, 3]"], "{groups:?}");
    keys(&mut h.app, "2");
    let (text, _) = draw(&h.app);
    assert!(text.contains("ranks × collective seq"), "all ranks first: {text}");
    let mut seen = Vec::new();
    for _ in 0..3 {
        keys(&mut h.app, "p");
        let (text, _) = draw(&h.app);
        let title = text.lines().find(|l| l.contains("matrix")).unwrap_or("").to_string();
        seen.push(title.clone());
        if title.contains("group 2") {
            assert!(title.contains("ranks 2,3"), "{title}");
            let row = |r: u32| {
                let at = |l: &&str| l.starts_with(&format!("│r{r} ")) || l.starts_with(&format!("┃r{r} "));
                let line = text.lines().find(at).unwrap_or("");
                line.split("││").next().unwrap_or(line).to_string()
            };
            let (r2, r3) = (row(2), row(3));
            assert!(r2.contains('▶'), "rank 2 waits inside its group's collective: {r2:?}\n{text}");
            assert!(r3.contains('○') && !r3.contains('▶'), "rank 3 never entered: {r3:?}\n{text}");
        }
    }
    assert!(seen.iter().any(|t| t.contains("group 2")), "{seen:?}");
    keys(&mut h.app, "p");
    let (text, _) = draw(&h.app);
    assert!(text.contains("ranks × collective seq"), "back to all ranks after the last group: {text}");
}
