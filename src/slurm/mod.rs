//! Slurm as a launcher (DESIGN §13): the server holds an allocation (`sbatch`, or a job the
//! user already has), starts one agent per node with `srun --overlap`, and reaches each over
//! TCP at its node's address. The agents' protocol is the one every placement speaks; only who
//! starts them changes.
//!
//! - `mod.rs`: the Slurm client commands, run in the asking client's Slurm environment, and
//!   what they print, read into typed records.
//! - `alloc.rs`: the allocation (sbatch's holder script, waiting for it to run, its nodes).
//! - `agents.rs`: the agent steps (srun), their ready lines, and taking them down.
//! - `node.rs`: the agent's side, on a compute node: its spec from the step's environment.
pub mod agents;
pub mod alloc;
pub mod node;

use crate::protocol::spec::ClientEnv;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Why a Slurm command did not give what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("could not run `{program}`: {source}; is Slurm's client installed and on PATH? (`flightdeck doctor --slurm` checks)")]
    Spawn { program: String, source: std::io::Error },
    #[error("`{command}` failed (exit {code}): {stderr}")]
    Failed { command: String, code: i32, stderr: String },
    #[error("`{command}` printed what Flightdeck cannot read as {what}: {output:?}")]
    Unreadable { command: String, what: String, output: String },
    #[error("{0}")]
    Refused(String),
}

/// Slurm's client commands, in one client's environment.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Slurm {
    /// `SLURM_CONF` for every command; None: Slurm's default.
    pub conf: Option<PathBuf>,
    /// The allocation the client runs inside (`$SLURM_JOB_ID`), offered to its launches.
    pub client_job: Option<String>,
}

impl Slurm {
    pub fn of(env: &ClientEnv) -> Slurm {
        Slurm { conf: env.slurm_conf.clone(), client_job: env.slurm_job.clone() }
    }

    /// `program` with this context's `SLURM_CONF` and none of the server's own `SLURM_*`: a
    /// server started inside one allocation must not lend its job's settings to another.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLURM_") {
                cmd.env_remove(&name);
            }
        }
        if let Some(conf) = &self.conf {
            cmd.env("SLURM_CONF", conf);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Runs `program args` to its end; Ok: its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, SlurmError> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|source| SlurmError::Spawn { program: program.into(), source })?;
        if !out.status.success() {
            return Err(SlurmError::Failed {
                command: shown(program, args),
                code: out.status.code().unwrap_or(-1),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A job's state, or None when Slurm no longer knows the job.
    pub fn job(&self, job: &str) -> Result<Option<JobInfo>, SlurmError> {
        let args = ["-h", "-t", "all", "-j", job, "-o", JobInfo::FORMAT];
        match self.run("squeue", &args) {
            Ok(out) => match out.lines().find(|l| !l.trim().is_empty()) {
                None => Ok(None),
                Some(line) => JobInfo::parse(line).map(Some).ok_or_else(|| SlurmError::Unreadable {
                    command: shown("squeue", &args),
                    what: "a job's state".into(),
                    output: line.into(),
                }),
            },
            // squeue answers an id it has forgotten (past MinJobAge) with an error.
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The node names of a hostlist expression (`n[1-3]` → n1, n2, n3).
    pub fn hostnames(&self, list: &str) -> Result<Vec<String>, SlurmError> {
        Ok(self
            .run("scontrol", &["show", "hostnames", list])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    /// Each node's address (Slurm's `NodeAddr`): where its agent is dialled, and MASTER_ADDR.
    /// A node's hostname can be useless for this (the same on every node of a test cluster).
    pub fn node_addrs(&self, nodes: &[String]) -> Result<Vec<String>, SlurmError> {
        let list = nodes.join(",");
        let args = ["-h", "-N", "-n", list.as_str(), "-o", "%N %o"];
        let out = self.run("sinfo", &args)?;
        let mut addrs = std::collections::HashMap::new();
        for line in out.lines() {
            if let Some((name, addr)) = line.trim().split_once(' ') {
                addrs.insert(name.to_string(), addr.trim().to_string());
            }
        }
        nodes
            .iter()
            .map(|n| {
                addrs.get(n).cloned().ok_or_else(|| SlurmError::Unreadable {
                    command: shown("sinfo", &args),
                    what: format!("node {n}'s address"),
                    output: out.clone(),
                })
            })
            .collect()
    }
}

/// What `squeue` says of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobInfo {
    /// PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    pub state: String,
    /// Why it pends (Resources, Priority, BeginTime) or `None`.
    pub reason: String,
    /// Its nodes as a hostlist expression (empty while pending).
    pub nodes: String,
    /// The job's comment: where the holder script notes the time-limit warning.
    pub comment: String,
}

impl JobInfo {
    /// `state|reason|nodes|comment`: the comment is last, since a user may put `|` in it.
    const FORMAT: &'static str = "%T|%r|%N|%k";

    fn parse(line: &str) -> Option<JobInfo> {
        let mut parts = line.trim().splitn(4, '|');
        let (state, reason, nodes) = (parts.next()?, parts.next()?, parts.next()?);
        let comment = parts.next().unwrap_or("");
        if state.is_empty() {
            return None;
        }
        let none = |s: &str| if s == "(null)" { String::new() } else { s.to_string() };
        Some(JobInfo { state: state.into(), reason: none(reason), nodes: none(nodes), comment: none(comment) })
    }

    pub fn running(&self) -> bool {
        self.state == "RUNNING"
    }

    /// States a job does not leave by itself.
    pub fn pending(&self) -> bool {
        matches!(self.state.as_str(), "PENDING" | "CONFIGURING" | "REQUEUED" | "RESV_DEL_HOLD" | "REQUEUE_HOLD")
    }
}

/// A command line as a person would type it, for messages.
fn shown(program: &str, args: &[&str]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        if a.is_empty() || a.contains(' ') {
            s.push_str(&format!("{a:?}"));
        } else {
            s.push_str(a);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_read_into_job_info() {
        let j = JobInfo::parse("RUNNING|None|n[1-2]|flightdeck:grace").unwrap();
        assert!(j.running());
        assert_eq!((j.nodes.as_str(), j.comment.as_str()), ("n[1-2]", "flightdeck:grace"));
        let j = JobInfo::parse("PENDING|Resources|(null)|(null)").unwrap();
        assert!(j.pending() && !j.running());
        assert_eq!((j.nodes.as_str(), j.comment.as_str(), j.reason.as_str()), ("", "", "Resources"));
        let j = JobInfo::parse("RUNNING|None|n1|a|b").unwrap();
        assert_eq!(j.comment, "a|b");
        assert!(JobInfo::parse("").is_none());
        assert!(JobInfo::parse("RUNNING").is_none());
    }

    #[test]
    fn commands_are_shown_as_typed() {
        assert_eq!(shown("squeue", &["-j", "12", "-o", "%T|%r"]), "squeue -j 12 -o %T|%r");
        assert_eq!(shown("sbatch", &["--comment", "a b"]), "sbatch --comment \"a b\"");
    }
}
