//! Sweeps (`flightdeck sweep`): one recipe expanded into points, each point one run, queued by
//! the server onto the capacity it knows. The sweep is stored once (`sweeps` tree); which run a
//! point became is on the run's own record (`RunRecord::sweep`), so starting a point and
//! recording it are one write, and a server killed between two points neither loses one nor
//! starts one twice.
use super::run::{RunRecord, RunStatus};
use crate::ids::RunId;
use serde::{Deserialize, Serialize};

/// A sweep as stored and sent: its points, and how much of the machine they may take at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRecord {
    /// Same shape as a run id (`YYYYMMDDTHHMMSS-xxxx`): sweeps sort by submission time.
    pub id: String,
    pub name: String,
    pub recipe_path: String,
    pub created_ms: u64,
    /// The swept keys, in the order of each point's `values`.
    pub keys: Vec<String>,
    pub points: Vec<SweepPointSpec>,
    /// Runs of this sweep live at once, at most.
    pub max_parallel: u32,
    /// Ranks live at once, at most (this machine's for local points; the sweep's own for hosts).
    pub max_ranks: u32,
    /// Points cancelled before they started (indices into `points`).
    #[serde(default)]
    pub cancelled: Vec<u32>,
    /// Points whose launch failed, with the launcher's reason: not tried again.
    #[serde(default)]
    pub launch_failed: Vec<(u32, String)>,
    /// The submitting client's environment (`protocol::spec::ClientEnv`, as JSON: records do not
    /// import the wire), which SSH and Slurm points launch in after the client has gone.
    pub env_json: String,
}

/// One point: the values of the swept keys and the validated recipe they give.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPointSpec {
    /// Each swept key's value as TOML text (`0.003`, `"synthetic:arith"`).
    pub values: Vec<String>,
    pub recipe_json: String,
    pub run_name: String,
    pub world_size: u32,
    /// Whether its ranks run on the server's machine (capacity shared with every local run).
    pub local: bool,
}

/// A sweep and where each of its points is (`flightdeck queue`, the cockpit's Compare).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepStatus {
    pub sweep: SweepRecord,
    pub points: Vec<PointStatus>,
}

/// One point's state, with its newest run's progress and last loss when it has one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PointStatus {
    pub state: PointState,
    /// Its run ended and recovery is deciding or waiting to restart it.
    pub restarting: bool,
    pub step: u64,
    pub steps: u64,
    pub last_loss: Option<f64>,
    /// Runs of its lineage (1 for a point that ran once; 0 before it starts).
    pub attempts: u32,
}

/// Which sweep point a run is (on the run's record; a recovery child keeps its parent's).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SweepPoint {
    pub sweep: String,
    pub point: u32,
}

/// Where a point is, derived from the sweep and the runs that carry its `SweepPoint`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PointState {
    Waiting,
    /// Its launch has begun and no run is recorded yet.
    Launching,
    /// Its newest run (the last attempt of its lineage) and that run's status.
    Run {
        run: RunId,
        status: RunStatus,
    },
    Cancelled,
    LaunchFailed {
        reason: String,
    },
}

impl PointState {
    /// Still to start, or starting: the queue has work for it.
    pub fn is_open(&self) -> bool {
        matches!(self, PointState::Waiting | PointState::Launching)
    }

    pub fn is_live(&self) -> bool {
        match self {
            PointState::Launching => true,
            PointState::Run { status, .. } => status.is_live(),
            _ => false,
        }
    }

    /// One word for tables: `waiting`, `launching`, the run's status, `cancelled`, `launch-failed`.
    pub fn word(&self) -> &'static str {
        match self {
            PointState::Waiting => "waiting",
            PointState::Launching => "launching",
            PointState::Run { status, .. } => status.name(),
            PointState::Cancelled => "cancelled",
            PointState::LaunchFailed { .. } => "launch-failed",
        }
    }
}

impl SweepRecord {
    /// Every point's state. `runs`: the runs that carry one of this sweep's points (any order);
    /// `launching`: the points whose launch is under way.
    pub fn states(&self, runs: &[&RunRecord], launching: &[u32]) -> Vec<PointState> {
        (0..self.points.len() as u32)
            .map(|i| {
                let newest = runs
                    .iter()
                    .filter(|r| r.sweep.as_ref().is_some_and(|p| p.sweep == self.id && p.point == i))
                    .max_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
                if let Some(r) = newest {
                    return PointState::Run { run: r.id.clone(), status: r.status };
                }
                if let Some((_, why)) = self.launch_failed.iter().find(|(p, _)| *p == i) {
                    return PointState::LaunchFailed { reason: why.clone() };
                }
                if self.cancelled.contains(&i) {
                    return PointState::Cancelled;
                }
                match launching.contains(&i) {
                    true => PointState::Launching,
                    false => PointState::Waiting,
                }
            })
            .collect()
    }

    /// `train.lr = 0.003, grpo.group_size = 8`: a point's values against their keys.
    pub fn label(&self, point: u32) -> String {
        let Some(spec) = self.points.get(point as usize) else { return String::new() };
        self.keys.iter().zip(&spec.values).map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunRecord;

    fn sweep(points: u32) -> SweepRecord {
        SweepRecord {
            id: "S".into(),
            name: "s".into(),
            recipe_path: "r.toml".into(),
            created_ms: 0,
            keys: vec!["train.lr".into()],
            points: (0..points)
                .map(|i| SweepPointSpec {
                    values: vec![format!("0.00{i}")],
                    recipe_json: "{}".into(),
                    run_name: format!("s.{}", i + 1),
                    world_size: 1,
                    local: true,
                })
                .collect(),
            max_parallel: 2,
            max_ranks: 2,
            cancelled: vec![],
            launch_failed: vec![],
            env_json: "{}".into(),
        }
    }

    fn run(id: &str, point: u32, created_ms: u64, status: RunStatus) -> RunRecord {
        let mut r = RunRecord::for_test(id, id, status, created_ms);
        r.sweep = Some(SweepPoint { sweep: "S".into(), point });
        r
    }

    #[test]
    fn a_point_is_its_newest_run_else_failed_cancelled_launching_or_waiting() {
        let mut s = sweep(5);
        s.cancelled = vec![3];
        s.launch_failed = vec![(4, "no such host".into())];
        let first = run("a", 0, 10, RunStatus::Failed);
        let retry = run("b", 0, 20, RunStatus::Running);
        let mut other = run("c", 1, 5, RunStatus::Succeeded);
        let states = s.states(&[&retry, &first, &other], &[2]);
        assert_eq!(states[0], PointState::Run { run: RunId("b".into()), status: RunStatus::Running });
        assert_eq!(states[1], PointState::Run { run: RunId("c".into()), status: RunStatus::Succeeded });
        assert_eq!(states[2], PointState::Launching);
        assert_eq!(states[3], PointState::Cancelled);
        assert_eq!(states[4], PointState::LaunchFailed { reason: "no such host".into() });
        assert!(states[0].is_live() && !states[1].is_live() && states[2].is_live() && states[2].is_open());
        // A run of another sweep is not this sweep's point.
        other.sweep = Some(SweepPoint { sweep: "T".into(), point: 2 });
        assert_eq!(s.states(&[&other], &[])[2], PointState::Waiting);
        assert_eq!(s.label(1), "train.lr = 0.001");
    }
}
