//! The app's side of checkpoints, resume and graceful stop: the Checkpoints screen's keys, the
//! two confirmations, and the replies that come back (a resume switches to the child run).
use super::action::Action;
use super::app::{App, Overlay, Screen};
use super::effects::{Command, DataEvent};
use super::panels::ckpts::{CkptsView, ResumePlan, ResumeState};
use crate::store::RunRecord;
use crossterm::event::{KeyCode, KeyEvent};

impl App {
    /// The run these keys act on: the Checkpoints screen's, the open one, or Home's selection.
    pub(super) fn target_run(&self) -> Option<RunRecord> {
        match self.screen {
            Screen::Home => self.home.selected(self.now_ms()).cloned(),
            Screen::Run => self.run.model.as_ref().map(|m| m.state.record.clone()),
            Screen::Checkpoints => self.ckpts.record.clone(),
            Screen::Compare => None,
        }
    }

    /// `Checkpoints`, `Resume` and `Stop` from Home, Run and the Checkpoints screen.
    pub(super) fn lineage_action(&mut self, a: Action) {
        let Some(record) = self.target_run() else {
            let what = if self.screen == Screen::Home { "no run selected" } else { "no run open" };
            self.error(what);
            return;
        };
        match a {
            Action::Checkpoints => self.open_checkpoints(record),
            Action::Resume => self.ask_resume(record),
            Action::Stop if record.status.is_live() => {
                let recipe = serde_json::from_str::<crate::recipe::Recipe>(&record.recipe_json);
                let command = recipe.is_ok_and(|r| r.kind.not_resumable().is_some());
                self.overlay = Some(Overlay::ConfirmStop { run: record.id, name: record.name, command })
            }
            Action::Stop => {
                self.error(format!("run {} is {}, not live: nothing to stop", record.id, record.status.name()))
            }
            _ => {}
        }
    }

    pub fn open_checkpoints(&mut self, record: RunRecord) {
        let from_run = self.screen == Screen::Run || (self.screen == Screen::Checkpoints && self.ckpts.from_run);
        let run = record.id.clone();
        self.ckpts = CkptsView::open(record, from_run);
        self.screen = Screen::Checkpoints;
        self.effects.send(Command::LoadCheckpoints { run, verify: false });
    }

    /// Keys of the Checkpoints screen.
    pub(super) fn ckpts_action(&mut self, a: Action) {
        let page = (self.body().height as usize / 2).max(1);
        if self.ckpts.on_action(a, page) {
            return;
        }
        match a {
            Action::Back if self.ckpts.from_run => self.screen = Screen::Run,
            Action::Back => self.go_home(),
            Action::Checkpoints | Action::Resume | Action::Stop => self.lineage_action(a),
            Action::Verify | Action::Refresh => {
                if let Some(run) = self.ckpts.run().cloned() {
                    let verify = a == Action::Verify;
                    self.ckpts.verifying = verify;
                    if verify {
                        self.say(format!("verifying every checkpoint of run {run} (sha256 of every byte)…"));
                    }
                    self.effects.send(Command::LoadCheckpoints { run, verify });
                }
            }
            _ => {}
        }
    }

    /// The resume confirmation: from the selected checkpoint on the Checkpoints screen, else
    /// from the newest verified one (listed now, so the overlay can name it).
    /// A live run (a hung one, typically) is killed first, then restarted from its newest
    /// verified checkpoint; the confirmation says so.
    fn ask_resume(&mut self, record: RunRecord) {
        let live = record.status.is_live();
        let pick = if self.screen == Screen::Checkpoints && !live { self.ckpts.selected().cloned() } else { None };
        let mut plan = ResumePlan::new(&record, pick.as_ref());
        let listed = self.ckpts.list.as_ref().filter(|l| l.run == record.id);
        match listed {
            Some(list) => plan.resolve(list),
            None if pick.is_none() => self.effects.send(Command::LoadCheckpoints { run: record.id, verify: false }),
            None => {}
        }
        self.overlay = Some(Overlay::ConfirmResume(Box::new(plan)));
    }

    pub(super) fn on_resume_key(&mut self, k: KeyEvent) {
        let Some(Overlay::ConfirmResume(plan)) = self.overlay.as_mut() else { return };
        let yes = matches!(k.code, KeyCode::Char('y' | 'Y') | KeyCode::Enter);
        match &plan.state {
            // A live run with nothing to restart from is not killed by `y`; the kill key says so.
            ResumeState::Asking
                if plan.kill_first && plan.refusal().is_some() && self.keymap.action(&k) == Some(Action::Kill) =>
            {
                let (run, name) = (plan.parent.clone(), plan.parent_name.clone());
                self.overlay = Some(Overlay::ConfirmKill { run, name });
            }
            ResumeState::Asking if yes && plan.ready() => {
                plan.state = ResumeState::Sending;
                let (run, step, kill_first) = (plan.parent.clone(), plan.step, plan.kill_first);
                self.effects.send(Command::Resume { run, step, kill_first });
            }
            // Listing: `y` waits for it (the overlay says so) rather than kill blind.
            ResumeState::Asking if yes && plan.refusal().is_none() => {}
            ResumeState::Asking if yes => {
                let why = plan.refusal().unwrap_or_default();
                let run = plan.parent.clone();
                self.overlay = None;
                self.error(format!("resume of run {run} refused: {why}"));
            }
            ResumeState::Asking => {
                self.overlay = None;
                self.say("resume cancelled");
            }
            // The request is with the server; Esc hides the overlay (the reply still switches).
            ResumeState::Sending if k.code == KeyCode::Esc => self.overlay = None,
            ResumeState::Sending => {}
            ResumeState::Failed(_) => self.overlay = None,
        }
    }

    pub(super) fn on_stop_key(&mut self, k: KeyEvent) {
        let Some(Overlay::ConfirmStop { run, .. }) = self.overlay.take() else { return };
        if matches!(k.code, KeyCode::Char('y' | 'Y') | KeyCode::Enter) {
            self.say(format!("stopping run {run}: each rank saves a checkpoint, then exits…"));
            self.effects.send(Command::Stop { run });
        } else {
            self.say("stop cancelled");
        }
    }

    /// After a snapshot: a resumed run's chart wants its parent's loss up to the resume step.
    pub(super) fn ask_parent_loss(&mut self) {
        let Some(m) = self.run.model.as_ref() else { return };
        let (Some(parent), Some(from)) = (m.state.record.parent.clone(), m.state.record.resumed_from.as_ref()) else {
            return;
        };
        if self.run.parent_loss.as_ref().is_some_and(|p| p.parent == parent) {
            return;
        }
        let child = m.state.record.id.clone();
        self.effects.send(Command::LoadParentLoss { child, parent, step: from.step });
    }

    /// The replies of this module's commands; false for any other event.
    pub(super) fn on_lineage_data(&mut self, ev: &DataEvent) -> bool {
        match ev {
            DataEvent::Checkpoints(list) => {
                if self.ckpts.run() == Some(&list.run) {
                    if self.ckpts.verifying {
                        let bad = list.checkpoints.iter().filter(|c| !c.verified).count();
                        self.say(format!("verified {} checkpoints: {bad} failed", list.checkpoints.len()));
                    }
                    self.ckpts.set_list((**list).clone());
                }
                if let Some(Overlay::ConfirmResume(plan)) = self.overlay.as_mut() {
                    plan.resolve(list);
                }
            }
            DataEvent::CheckpointsFailed { run, message } => {
                if self.ckpts.run() == Some(run) {
                    self.ckpts.error = Some(message.clone());
                    self.ckpts.verifying = false;
                }
                self.error(message.clone());
            }
            DataEvent::Resumed(r) => {
                if matches!(self.overlay, Some(Overlay::ConfirmResume(_))) {
                    self.overlay = None;
                }
                self.say(r.text());
                self.open_run(r.run.as_str());
            }
            DataEvent::ResumeFailed(message) => {
                if let Some(Overlay::ConfirmResume(plan)) = self.overlay.as_mut() {
                    plan.state = ResumeState::Failed(message.clone());
                }
                self.error(format!("resume refused: {message}"));
            }
            DataEvent::ParentLoss { child, loss } => {
                if self.run.model.as_ref().is_some_and(|m| &m.state.record.id == child) {
                    self.run.parent_loss = Some(loss.clone());
                }
            }
            _ => return false,
        }
        true
    }
}
