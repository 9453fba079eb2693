//! Where things live on disk: the database directory, its server socket, and each run's files.
use crate::ids::RunId;
use std::path::{Path, PathBuf};

/// The database directory: `--db`, else `$FLIGHTDECK_HOME`, else the XDG data dir. Always
/// absolute: the server, the agents and the ranks it is handed to run in other directories
/// (a relative `--db db` once left every rank unable to find its recipe).
pub fn db_dir(cli: Option<&Path>) -> PathBuf {
    let dir = given_db_dir(cli);
    std::path::absolute(&dir).unwrap_or(dir)
}

fn given_db_dir(cli: Option<&Path>) -> PathBuf {
    if let Some(p) = cli {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("FLIGHTDECK_HOME") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(p).join("flightdeck");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/flightdeck")
}

/// The files of one database directory.
#[derive(Clone, Debug)]
pub struct DbPaths {
    pub root: PathBuf,
}

impl DbPaths {
    pub fn new(root: PathBuf) -> DbPaths {
        DbPaths { root }
    }
    pub fn sled(&self) -> PathBuf {
        self.root.join("history.sled")
    }
    pub fn server_socket(&self) -> PathBuf {
        self.root.join("server.sock")
    }
    pub fn server_lock(&self) -> PathBuf {
        self.root.join("server.lock")
    }
    pub fn server_log(&self) -> PathBuf {
        self.root.join("server.log")
    }
    /// A local run's node directory: its agent's sockets, spec, logs and spool.
    pub fn run_dir(&self, run: &RunId) -> PathBuf {
        self.root.join("runs").join(run.as_str())
    }
}

/// The files of one node's agent for one run.
#[derive(Clone, Debug)]
pub struct RunDirPaths {
    pub root: PathBuf,
}

impl RunDirPaths {
    pub fn new(root: PathBuf) -> RunDirPaths {
        RunDirPaths { root }
    }
    pub fn spec(&self) -> PathBuf {
        self.root.join("spec.json")
    }
    /// The run's secret for the ranks (`collective::auth`), 0600.
    pub fn secret(&self) -> PathBuf {
        self.root.join("run.secret")
    }

    pub fn recipe(&self) -> PathBuf {
        self.root.join("recipe.json")
    }
    pub fn agent_socket(&self) -> PathBuf {
        self.root.join("agent.sock")
    }
    pub fn telemetry_socket(&self) -> PathBuf {
        self.root.join("telemetry.sock")
    }
    pub fn agent_log(&self) -> PathBuf {
        self.root.join("agent.log")
    }
    pub fn rank_log(&self, rank: u32) -> PathBuf {
        self.root.join("logs").join(format!("rank-{rank}.log"))
    }
    /// PyTorch's flight-recorder dumps: its own (`rank_<R>`) and the shim's.
    pub fn fr_dir(&self) -> PathBuf {
        self.root.join("fr")
    }
    /// The shim's recorder dump of `rank` (assets/shim/sitecustomize.py).
    pub fn shim_dump(&self, rank: u32) -> PathBuf {
        self.fr_dir().join(format!("shim_rank_{rank}.pkl"))
    }
    /// The shim's stacks of `rank`'s Python threads.
    pub fn shim_stacks(&self, rank: u32) -> PathBuf {
        self.fr_dir().join(format!("shim_rank_{rank}.stacks.json"))
    }
    /// Where the shim itself is installed for the run's ranks (first on their PYTHONPATH).
    pub fn shim_dir(&self) -> PathBuf {
        self.root.join("shim")
    }
}

/// Why a directory `export` or `report` would write into was refused.
#[derive(Debug, thiserror::Error)]
pub enum OutDirError {
    #[error("{0}: is not empty: the output goes into a new or empty directory (choose another --out)")]
    NotEmpty(String),
    #[error("{0}: is a file: --out names a directory")]
    File(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Makes `dir` if it is missing; refuses one that holds anything, so output never mixes with or
/// overwrites what was there.
pub fn new_or_empty_dir(dir: &Path) -> Result<(), OutDirError> {
    let shown = || dir.display().to_string();
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(OutDirError::NotEmpty(shown())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|source| OutDirError::Io { path: shown(), source })
        }
        Err(_) if dir.is_file() => Err(OutDirError::File(shown())),
        Err(source) => Err(OutDirError::Io { path: shown(), source }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_relative_db_dir_is_made_absolute_against_the_working_directory() {
        let dir = super::db_dir(Some(std::path::Path::new("db")));
        assert!(dir.is_absolute(), "{}", dir.display());
        assert_eq!(dir, std::env::current_dir().unwrap().join("db"));
        let given = std::path::Path::new("/tmp/fd-db");
        assert_eq!(super::db_dir(Some(given)), given);
    }
}
