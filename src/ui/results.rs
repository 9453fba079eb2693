//! The app's side of export and report: `E` asks for a format, `P` writes the report; both go
//! to the server task as commands and come back as a line in the status bar naming the files.
//! Output lands in the cockpit's working directory, in a folder named after the run.
use super::app::{App, Overlay, Screen};
use super::effects::Command;
use crate::export::Format;
use crate::store::RunRecord;
use crossterm::event::{KeyCode, KeyEvent};
use std::path::PathBuf;

/// The format prompt's keys: a letter each, in the order shown.
pub const FORMAT_KEYS: [(char, Format); 4] =
    [('c', Format::Csv), ('j', Format::Jsonl), ('t', Format::Tensorboard), ('p', Format::Parquet)];

/// Where `E`/`P` write for `run`: `NAME-ID-WHAT` under the cockpit's working directory.
pub fn out_dir(run: &RunRecord, what: &str) -> PathBuf {
    PathBuf::from(format!("{}-{}-{what}", run.name, run.id))
}

impl App {
    fn result_target(&mut self) -> Option<RunRecord> {
        let r = self.target_run();
        if r.is_none() {
            self.error(if self.screen == Screen::Home { "no run selected" } else { "no run open" });
        }
        r
    }

    /// `E`: the format prompt for the open (or selected) run.
    pub(super) fn ask_export(&mut self) {
        if let Some(r) = self.result_target() {
            self.overlay = Some(Overlay::ExportFormat { run: Box::new(r) });
        }
    }

    /// `P`: the open (or selected) run's report, written off the UI task.
    pub(super) fn ask_report(&mut self) {
        let Some(r) = self.result_target() else { return };
        let out = out_dir(&r, "report");
        self.say(format!("writing the report of {} into {}…", r.id, out.display()));
        self.effects.send(Command::Report { run: r.id, out });
    }

    /// A key in the format prompt: a format's letter exports, anything else cancels.
    pub(super) fn on_export_key(&mut self, k: KeyEvent) {
        let Some(Overlay::ExportFormat { run }) = self.overlay.take() else { return };
        let chosen = match k.code {
            KeyCode::Char(c) => FORMAT_KEYS.iter().find(|(key, _)| *key == c.to_ascii_lowercase()).map(|f| f.1),
            _ => None,
        };
        match chosen {
            Some(format) => {
                let out = out_dir(&run, format.name());
                self.say(format!("exporting {} as {} into {}…", run.id, format.name(), out.display()));
                self.effects.send(Command::Export { run: run.id.clone(), format, out });
            }
            None => self.say("export cancelled"),
        }
    }
}
