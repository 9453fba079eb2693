//! The cockpit (DESIGN §10): a ratatui client of the server. One `App` owned by this task; one
//! `select!` loop over terminal events, server data and a redraw tick; background tasks only
//! send events; redraws only when something changed, at most 30 per second.
pub mod action;
pub mod app;
pub mod bench;
pub mod config;
pub mod effects;
pub mod fmt;
pub mod frame_stats;
pub mod groups;
pub mod hang;
pub mod heat_grid;
mod input;
pub mod io;
pub mod keymap;
pub mod layout;
pub mod model;
pub mod panels;
mod results;
pub use results::out_dir;
mod resume;
pub mod series;
pub mod term;
pub mod view;

pub use app::{App, Start};

use crate::paths::DbPaths;
use effects::{DataEvent, Effects};
use futures::StreamExt;
use std::io::IsTerminal;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// 30 frames per second at most.
const FRAME: Duration = Duration::from_millis(33);
/// Server data waiting for the UI task. Bounded so a flood makes the stream wait (and the
/// server's watcher lag, which reloads) instead of growing memory; 256 batches is seconds of a
/// large run.
pub const DATA_QUEUE: usize = 256;

/// Loads the keymap and layouts (built in, then the user's), failing with a message that names
/// the file, the place and what is valid.
pub fn load_config() -> anyhow::Result<(keymap::Keymap, Vec<layout::LayoutDef>)> {
    let dir = config::config_dir();
    let keymap = keymap::Keymap::load(dir.as_deref())?;
    let layouts = layout::load_all(dir.as_deref())?;
    Ok((keymap, layouts))
}

/// Opens the cockpit on this terminal until the user quits. Runs keep going either way.
pub async fn run(db: &DbPaths, start: Start) -> anyhow::Result<i32> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!("the cockpit needs a terminal; use the CLI (`flightdeck runs`, `run --headless`) instead");
    }
    let (keymap, layouts) = load_config()?;
    let (tx, mut rx) = mpsc::channel::<DataEvent>(DATA_QUEUE);
    let mut link = io::ServerLink::new(db.clone(), tx);
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let (mut term, guard) = term::enter()?;
    let size = term.size()?;
    let area = ratatui::layout::Rect::new(0, 0, size.width, size.height);
    let mut app = App::new(Effects::live(), keymap, layouts, start, area);
    let mut events = crossterm::event::EventStream::new();
    let mut tick = tokio::time::interval(FRAME);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut dirty = true;
    // Frame times, only when asked for (FLIGHTDECK_FRAME_STATS): the file and what goes in it.
    let mut stats = frame_stats::requested().map(|file| (file, frame_stats::FrameStats::default()));
    loop {
        for cmd in app.effects.take() {
            link.handle(cmd);
        }
        if app.quit {
            break;
        }
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(crossterm::event::Event::Key(k))) => dirty |= app.on_key(k),
                Some(Ok(crossterm::event::Event::Mouse(m))) => dirty |= app.on_mouse(m),
                Some(Ok(crossterm::event::Event::Resize(w, h))) => {
                    app.area = ratatui::layout::Rect::new(0, 0, w, h);
                    term.autoresize()?;
                    dirty = true;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => anyhow::bail!("reading the terminal: {e}"),
                None => break,
            },
            Some(data) = rx.recv() => {
                dirty |= app.on_data(data);
                // Take what else is queued now, so a burst costs one redraw.
                while let Ok(more) = rx.try_recv() {
                    app.on_data(more);
                }
            }
            _ = tick.tick() => {
                dirty |= app.on_tick();
                if let Some((_, s)) = stats.as_mut() {
                    s.queued(rx.len());
                }
                if dirty {
                    let t = std::time::Instant::now();
                    term.draw(|f| f.render_widget(&app, f.area()))?;
                    if let Some((_, s)) = stats.as_mut() {
                        s.frame(t.elapsed());
                    }
                    dirty = false;
                }
            }
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
        }
    }
    if let Some((path, stats)) = stats {
        std::fs::write(&path, format!("{}\n", stats.summary()))
            .map_err(|e| anyhow::anyhow!("writing {} ({}): {e}", path.display(), frame_stats::ENV))?;
    }
    // The terminal is the user's again: say what goes on without the cockpit.
    drop(term);
    drop(guard);
    let live = app.live_runs();
    for run in live.iter().take(3) {
        println!("run {run} keeps training: `flightdeck attach {run}` · `flightdeck stop {run}`");
    }
    if live.len() > 3 {
        println!("and {} more live runs: `flightdeck runs`", live.len() - 3);
    }
    Ok(0)
}
