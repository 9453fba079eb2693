//! The real terminal: raw mode, alternate screen and mouse on entry; all undone on exit, on
//! panic (a hook) and on SIGTERM/SIGHUP (the loop ends, then the guard drops).
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::Stdout;

pub type Term = Terminal<CrosstermBackend<Stdout>>;

/// Restores the terminal when dropped.
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

pub fn restore() {
    let _ = disable_raw_mode();
    let _ = crossterm::execute!(std::io::stdout(), DisableMouseCapture, LeaveAlternateScreen, crossterm::cursor::Show);
}

/// Enters the cockpit's terminal mode; the guard undoes it.
pub fn enter() -> anyhow::Result<(Term, Guard)> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    enable_raw_mode()?;
    let guard = Guard;
    crossterm::execute!(std::io::stdout(), EnterAlternateScreen, EnableMouseCapture)?;
    let mut term = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    term.hide_cursor()?;
    term.clear()?;
    Ok((term, guard))
}
