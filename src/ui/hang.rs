//! What the cockpit shows of the hang analysis: which verdict the banner names (live, or the
//! last stored hang of a finished run) and what part each rank plays in it.
use super::model::RunModel;
use crate::protocol::{Verdict, VerdictKind};
use crate::store::EventKind;

/// A rank's part in the verdict on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankRole {
    /// Named by the verdict: the rank to look at.
    Culprit,
    /// Held up by the culprits.
    Waiting,
    Bystander,
}

/// The verdict the banner shows, and whether it holds now or is the run's last word.
#[derive(Clone, Copy, Debug)]
pub struct Shown<'a> {
    pub verdict: &'a Verdict,
    pub live: bool,
}

impl RunModel {
    /// The verdict to put in front of the user: for a live run, the first hang that holds now
    /// (else a straggler); for a finished one, the last hang it had. None while a live run's
    /// first progress report has not arrived: a stored hang may have cleared since.
    pub fn shown_verdict(&self) -> Option<Shown<'_>> {
        if self.is_live() {
            let live = self.live_verdicts.as_ref()?;
            let v = live.iter().find(|v| v.kind.is_hang()).or_else(|| live.first())?;
            return Some(Shown { verdict: v, live: true });
        }
        let v = self.stored_verdicts.iter().rev().find(|v| v.kind.is_hang())?;
        Some(Shown { verdict: v, live: false })
    }

    pub fn rank_role(&self, rank: u32) -> RankRole {
        let Some(Shown { verdict, .. }) = self.shown_verdict() else {
            return RankRole::Bystander;
        };
        if verdict.culprits.iter().any(|c| c.rank == rank) {
            RankRole::Culprit
        } else if verdict.waiting.contains(&rank) {
            RankRole::Waiting
        } else {
            RankRole::Bystander
        }
    }

    /// The incident reports the server has written so far: each new one goes to the events
    /// panel once, in the words the server stores (`incident report written: PATH`).
    pub fn set_incidents(&mut self, paths: &[String], now_ms: u64) {
        for p in paths {
            let text = format!("incident report written: {p}");
            if !self.events.iter().any(|e| e.kind == EventKind::Incident && e.text == text) {
                self.push_event(now_ms, EventKind::Incident, None, text);
            }
        }
    }

    /// The verdicts that hold now, from the run's progress stream. A verdict not seen before
    /// also goes to the events panel (live frames carry no server events).
    pub fn set_live_verdicts(&mut self, verdicts: Vec<Verdict>) {
        for v in &verdicts {
            let seen = |o: &Verdict| o.kind == v.kind && o.summary == v.summary;
            let before = self.live_verdicts.as_ref().is_some_and(|l| l.iter().any(seen));
            if !before && !self.stored_verdicts.iter().any(seen) {
                let rank = v.culprits.first().map(|c| c.rank);
                self.push_event(v.detected_ms, EventKind::Verdict, rank, format!("{}: {}", v.kind.name(), v.summary));
                if v.kind != VerdictKind::Straggler {
                    self.stored_verdicts.push(v.clone());
                }
            }
        }
        // The server's rule for the stored status, applied to what the cockpit shows now.
        self.state.settle_hang(verdicts.iter().any(|v| v.kind.is_hang()));
        self.live_verdicts = Some(verdicts);
    }
}
