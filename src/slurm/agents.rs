//! The run's agents under Slurm: one `srun --overlap` step per launch wave (node 0, which hosts
//! the rendezvous store, then every other node with its ports), one agent task per node. Each
//! agent prints a ready line (`ready node=N agent_port=P store_port=S program_port=Q`), which
//! srun forwards into a file in the server's run directory; the server reads it there.
//!
//! srun runs in its own session with its output in files, so it outlives a server restart (and
//! the step with it); it exits when every agent of its step has.
use super::{Slurm, SlurmError};
use crate::protocol::spec::AgentSpec;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where `agent slurm` finds the run's spec (its template; each node fills in its own part).
/// An environment variable: srun carries it to every node, and only this user can read it.
pub const SPEC_ENV: &str = "FLIGHTDECK_SLURM_SPEC";
/// The first node index of this step (0, or 1 for the wave after node 0).
pub const OFFSET_ENV: &str = "FLIGHTDECK_SLURM_NODE_OFFSET";
/// Environment strings longer than this do not pass exec (Linux's MAX_ARG_STRLEN is 128 KiB).
const MAX_SPEC_BYTES: usize = 120 * 1024;
/// How often the step's output is read for ready lines.
const READY_POLL: Duration = Duration::from_millis(100);

/// One agent's ready line.
#[derive(Clone, Debug, PartialEq)]
pub struct Ready {
    pub node: String,
    pub agent_port: u16,
    pub store_port: u16,
    pub program_port: u16,
}

impl Ready {
    pub fn parse(line: &str) -> Option<Ready> {
        let rest = line.trim().strip_prefix("ready ")?;
        let mut fields = std::collections::HashMap::new();
        for part in rest.split_whitespace() {
            let (k, v) = part.split_once('=')?;
            fields.insert(k, v);
        }
        let port = |k: &str| fields.get(k)?.parse::<u16>().ok();
        Some(Ready {
            node: fields.get("node")?.to_string(),
            agent_port: port("agent_port")?,
            store_port: port("store_port")?,
            program_port: port("program_port")?,
        })
    }
}

/// The step's job name: how the run's own steps are found again in a shared allocation.
pub fn step_name(run: &crate::ids::RunId) -> String {
    format!("flightdeck-agents-{run}")
}

/// One launch wave: an agent on each of `nodes`, their node indices counted from `offset`.
pub struct Wave<'a> {
    pub job: &'a str,
    pub nodes: &'a [String],
    pub offset: usize,
    pub template: &'a AgentSpec,
    pub run_dir: &'a Path,
    /// How long the agents have to be ready once srun runs.
    pub limit: Duration,
}

/// Starts a wave's agents and waits for all their ready lines, in `nodes`' order. An srun that
/// exits before its agents are ready (Slurm's own trouble: "Unexpected missing socket error"
/// under load) takes its step with it, so the wave is tried once more, said through `notes`.
pub fn start(slurm: &Slurm, wave: &Wave, notes: &dyn Fn(&str)) -> Result<Vec<Ready>, SlurmError> {
    match start_once(slurm, wave, "") {
        Err(SlurmError::Failed { stderr, .. }) => {
            notes(&format!("the agents' srun on {} node(s) failed ({stderr}); trying once more", wave.nodes.len()));
            start_once(slurm, wave, "-again")
        }
        other => other,
    }
}

/// One try of `start`; its files are `slurm-agents-OFFSET{suffix}.out` and `.err`.
fn start_once(slurm: &Slurm, wave: &Wave, suffix: &str) -> Result<Vec<Ready>, SlurmError> {
    let Wave { job, nodes, offset, template, run_dir, limit } = *wave;
    let spec =
        serde_json::to_string(template).map_err(|e| SlurmError::Refused(format!("encoding the agent spec: {e}")))?;
    if spec.len() > MAX_SPEC_BYTES {
        return Err(SlurmError::Refused(format!(
            "the run's spec is {} KiB, more than the {} KiB an environment variable carries to the nodes; \
             shorten the recipe (command.argv, command.env)",
            spec.len() / 1024,
            MAX_SPEC_BYTES / 1024
        )));
    }
    let out_path = run_dir.join(format!("slurm-agents-{offset}{suffix}.out"));
    let err_path = run_dir.join(format!("slurm-agents-{offset}{suffix}.err"));
    let file = |p: &PathBuf| {
        std::fs::File::create(p).map_err(|e| SlurmError::Refused(format!("creating {}: {e}", p.display())))
    };
    let n = nodes.len().to_string();
    let list = nodes.join(",");
    let mut cmd = slurm.command("srun");
    // --whole: the step (the agent and the ranks it starts) gets every CPU the job holds on
    // each node, not the one its single task would ask for, which task/cgroup would enforce.
    cmd.args(["--jobid", job, "--overlap", "--whole", "--nodes", &n, "--ntasks", &n, "--ntasks-per-node=1"])
        .args(["--nodelist", &list, "--unbuffered", "--kill-on-bad-exit=0", "--export=ALL", "--cpu-bind=none"])
        .arg(format!("--job-name={}", step_name(&template.run)))
        .arg(&template.exe)
        .args(["agent", "slurm"])
        .env(SPEC_ENV, spec)
        .env(OFFSET_ENV, offset.to_string())
        .stdout(file(&out_path)?)
        .stderr(file(&err_path)?);
    crate::detach::new_session(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| SlurmError::Spawn { program: "srun".into(), source })?;
    // Reaped by its own thread, so it never lingers as a zombie of a long-lived server.
    let exited: Arc<Mutex<Option<std::process::ExitStatus>>> = Arc::default();
    std::thread::spawn({
        let exited = exited.clone();
        move || {
            if let Ok(status) = child.wait() {
                *crate::sync::lock(&exited) = Some(status);
            }
        }
    });
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        let ready: Vec<Ready> = text.lines().filter_map(Ready::parse).collect();
        let found: Option<Vec<Ready>> =
            nodes.iter().map(|node| ready.iter().find(|r| &r.node == node).cloned()).collect();
        if let Some(all) = found {
            return Ok(all);
        }
        let status = *crate::sync::lock(&exited);
        let missing: Vec<&str> =
            nodes.iter().filter(|n| !ready.iter().any(|r| &r.node == *n)).map(String::as_str).collect();
        let why = match status {
            Some(status) => {
                let tail = crate::detach::log_tail(&err_path, 5);
                return Err(SlurmError::Failed {
                    command: format!("srun (the agents' step, {})", out_path.display()),
                    code: status.code().unwrap_or(-1),
                    stderr: format!("it exited before the agents on {} were ready; {tail}", missing.join(", ")),
                });
            }
            None if Instant::now() >= deadline => {
                format!("the agents on {} were not ready within {} s", missing.join(", "), limit.as_secs())
            }
            None => {
                std::thread::sleep(READY_POLL);
                continue;
            }
        };
        let tail = crate::detach::log_tail(&err_path, 5);
        return Err(SlurmError::Refused(format!("{why}; {}: {tail}", err_path.display())));
    }
}

/// Cancels the run's agent steps in an allocation it does not own (its own job is cancelled
/// whole); returns what could not be.
pub fn cancel_steps(slurm: &Slurm, job: &str, run: &crate::ids::RunId) -> Vec<String> {
    let name = step_name(run);
    let out = match slurm.run("squeue", &["-h", "-s", "-j", job, "-o", "%i|%j"]) {
        Ok(out) => out,
        Err(e) => return vec![format!("listing job {job}'s steps: {e}")],
    };
    let mut left = Vec::new();
    for (step, step_job) in out.lines().filter_map(|l| l.trim().split_once('|')) {
        if step_job == name {
            if let Err(e) = slurm.run("scancel", &[step]) {
                left.push(format!("step {step}: {e}"));
            }
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines_name_the_node_and_its_ports() {
        let r = Ready::parse("ready node=n3 agent_port=4000 store_port=0 program_port=0\n").unwrap();
        assert_eq!(r, Ready { node: "n3".into(), agent_port: 4000, store_port: 0, program_port: 0 });
        assert!(Ready::parse("ready").is_none(), "a local agent's line has no ports");
        assert!(Ready::parse("ready node=n3 agent_port=x store_port=0 program_port=0").is_none());
        assert!(Ready::parse("srun: error: n2: task 1: Exited with exit code 1").is_none());
    }
}
