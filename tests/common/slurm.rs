//! A real Slurm cluster faked on this one machine for tests: munged, slurmctld and N `slurmd -N nI`
//! on their own loopback addresses, all living in a temp dir, every process gone on drop.
//!
//! A slot (0..=15) keeps the clusters of concurrently running tests apart. Slot S owns:
//! - slurmctld's port 23800+S;
//! - node nI (I in 1..=250) at NodeAddr 127.0.(10+S).I with slurmd port 24000+250*S+(I-1), so all
//!   slots together use 24000..=27999. slurmd binds 0.0.0.0 (`CommunicationParameters=NoInAddrAny`
//!   breaks launches, research/slurm.md), so ports must differ across clusters, not just addresses.
//!   Every port sits below the kernel's ephemeral range (32768..) and clear of NCCL's RAS port
//!   (28028) and torch's usual 29500;
//! - the lock /tmp/flightdeck-slurm-slot-S.lock, held for the cluster's life: a second cluster on the
//!   same slot (another test binary, another checkout's test run) waits for it instead of colliding.
//!   A test holding two clusters at once needs two slots.
//!
//! Every node claims `CPUs=8` (8 ranks a node), whatever this machine has: with
//! `SlurmdParameters=config_overrides` slurmd reports the configured CPUs; without it nodes register
//! as `inval` ("Low socket*core*thread count, Low CPUs").
//!
//! Pitfalls met while building it:
//! - slurmstepd daemonizes (its parent is pid 1, not slurmd), so "the daemons' descendants" miss every
//!   job. A stepd is known by `SLURM_CONF=<this conf>` in its environment (inherited from slurmd) and
//!   by the node's log file, DIR/log/slurmd-NODE.log, which it keeps open.
//! - Killing a stepd leaves its tasks running (reparented to pid 1): kill the whole tree.
//! - A batch job whose node dies is requeued (PENDING, Reason=BeginTime, ~120 s) by Slurm's default
//!   `JobRequeue=1`, not cancelled; submit with `--no-requeue` when a test expects it gone.
//! - sbatch writes `slurm-J.out` into the submitter's working directory: [`Cluster::command`] runs
//!   clients in the cluster's temp dir so nothing lands in the repository.
//! - After a node death (SlurmdTimeout=10) sinfo adds `*` within ~7 s and reads `down*` after
//!   ~19-30 s.
//! - On SIGTERM a slurmd still ending jobs, or one whose slurmctld is gone, takes seconds to exit, as
//!   does a slurmctld with RPCs out to dead nodes: drop kills the jobs first and orders the rest.
//! - pid 1 on some test machines reaps nothing: killed daemonized processes stay zombies, which the
//!   scans here treat as gone.
//!
//! Include it as `#[allow(dead_code)] #[path = "common/slurm.rs"] mod slurm;` (it stands alone).
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const MAX_SLOT: u16 = 15;
pub const MAX_NODES: usize = 250;
pub const CPUS_PER_NODE: usize = 8;
const CTLD_PORT_BASE: u16 = 23800;
const SLURMD_PORT_BASE: u16 = 24000;
const START_DEADLINE: Duration = Duration::from_secs(120);
/// How long one client command (sinfo, squeue, scancel) may take inside start and drop.
const CLIENT_LIMIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);
const TOOLS: [&str; 10] =
    ["munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "scancel", "sbatch", "srun"];

enum StartError {
    /// This machine cannot run it (not root, Slurm not installed): the test is skipped.
    Unavailable(String),
    /// It should have started and did not: the test fails.
    Failed(String),
}

pub struct Cluster {
    tmp: Option<tempfile::TempDir>,
    dir: PathBuf,
    conf: PathBuf,
    slot: u16,
    nodes: usize,
    /// Every daemon this cluster spawned, by name: `munged`, `slurmctld`, `slurmd-nI`. Its log is
    /// DIR/log/NAME.log (the daemon's own) and DIR/log/NAME.out (its stdout and stderr).
    daemons: Mutex<BTreeMap<String, Child>>,
    _slot_lock: fs::File,
}

impl Cluster {
    /// Starts munged, slurmctld and `nodes` slurmd (n1..nN) on `slot` in a fresh temp dir and waits
    /// until every node is idle. Err(why) when it cannot run here or did not come up (then `why`
    /// carries the daemons' log tails).
    pub fn start(test: &str, nodes: usize, slot: u16) -> Result<Cluster, String> {
        Self::launch(test, nodes, slot).map_err(|e| match e {
            StartError::Unavailable(why) | StartError::Failed(why) => why,
        })
    }

    /// [`Cluster::start`], reporting the test as skipped (None) where this machine cannot run a
    /// cluster, and failing the test where one should have started and did not.
    pub fn start_or_skip(test: &str, nodes: usize, slot: u16) -> Option<Cluster> {
        match Self::launch(test, nodes, slot) {
            Ok(c) => Some(c),
            Err(StartError::Unavailable(why)) => {
                skipped(test, &why);
                None
            }
            Err(StartError::Failed(why)) => panic!("{test}: the fake Slurm cluster did not start: {why}"),
        }
    }

    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The cluster's temp dir (logs under log/, slurmd spools under spool/d/NODE).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What a client process needs to reach this cluster. A process that inherits other `SLURM_*`
    /// variables (a test run inside a real allocation) should drop them, as [`Cluster::command`] does.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".into(), self.conf.display().to_string())]
    }

    pub fn node_names(&self) -> Vec<String> {
        (1..=self.nodes).map(|i| format!("n{i}")).collect()
    }

    /// Node `node`'s NodeAddr, 127.0.(10+slot).I; panics for a node this cluster does not have.
    pub fn node_addr(&self, node: &str) -> String {
        format!("127.0.{}.{}", 10 + self.slot, self.node_index(node))
    }

    /// SIGKILLs node `node`'s slurmd (with [`Cluster::kill_node_processes`], a node death).
    pub fn kill_slurmd(&self, node: &str) {
        self.node_index(node);
        if let Some(mut child) = self.daemons().remove(&format!("slurmd-{node}")) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `node`'s slurmd again after [`Cluster::kill_slurmd`]; it registers by itself
    /// (ReturnToService=2), so wait for the state wanted with [`Cluster::wait_node_state`].
    pub fn restart_slurmd(&self, node: &str) {
        self.node_index(node);
        let name = format!("slurmd-{node}");
        if let Some(child) = self.daemons().get_mut(&name) {
            assert!(!matches!(child.try_wait(), Ok(None)), "{name} is still running");
        }
        self.spawn(&name, "slurmd", &["-D", "-N", node]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The live processes on fake node `node` under Slurm: its slurmstepds and all their
    /// descendants, and tasks of this cluster that escaped their stepd (`SLURMD_NODENAME=node`).
    pub fn node_processes(&self, node: &str) -> Vec<u32> {
        self.node_index(node);
        self.job_processes(Some(node)).into_iter().map(|p| p as u32).collect()
    }

    /// SIGKILLs every process on fake node `node` (see [`Cluster::node_processes`]) and waits until
    /// they are gone; returns how many were killed.
    pub fn kill_node_processes(&self, node: &str) -> usize {
        self.node_index(node);
        self.kill_job_processes(Some(node))
    }

    /// A Slurm client command (sinfo, squeue, scontrol, scancel, sbatch, srun) for this cluster:
    /// `SLURM_CONF` set, inherited `SLURM_*` removed, run in the cluster's temp dir.
    pub fn command(&self, program: &str) -> Command {
        let mut c = slurm_command(&self.conf, program);
        c.current_dir(&self.dir);
        c
    }

    pub fn cmd(&self, program: &str, args: &[&str]) -> Output {
        self.command(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"))
    }

    /// Job ids slurmctld has pending, running or completing (`squeue -h -o %i`).
    pub fn jobs(&self) -> Vec<String> {
        let out = self.cmd("squeue", &["-h", "-o", "%i"]);
        assert!(out.status.success(), "squeue failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
    }

    /// Node `node`'s state as sinfo shows it: `idle`, `allocated`, `mixed*`, `down*`, ... (a `*`
    /// means not responding). A busy node may read `allocated` where `mixed` is due: 22.05 refreshes
    /// its per-node allocation cache on whole-second timestamps, so treat the two alike.
    pub fn node_state(&self, node: &str) -> String {
        self.node_index(node);
        let out = self.cmd("sinfo", &["-h", "-N", "-n", node, "-o", "%T"]);
        assert!(out.status.success(), "sinfo failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string()
    }

    /// Polls node `node`'s state until `done` holds for it; Ok(that state), or Err with the last
    /// state seen once `limit` has passed.
    pub fn wait_node_state(&self, node: &str, limit: Duration, done: impl Fn(&str) -> bool) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            let state = self.node_state(node);
            if done(&state) {
                return Ok(state);
            }
            if Instant::now() > deadline {
                return Err(format!("{node} is still {state:?} after {limit:?}"));
            }
            std::thread::sleep(POLL);
        }
    }

    fn launch(test: &str, nodes: usize, slot: u16) -> Result<Cluster, StartError> {
        assert!(slot <= MAX_SLOT, "slot {slot}: valid slots are 0..={MAX_SLOT}");
        assert!((1..=MAX_NODES).contains(&nodes), "{nodes} nodes: a cluster has 1..={MAX_NODES}");
        if let Some(why) = unavailable() {
            return Err(StartError::Unavailable(why));
        }
        let began = Instant::now();
        let lock = lock_slot(slot).map_err(StartError::Failed)?;
        reap_stale(slot);
        // Short paths: munged's socket and slurmd's step sockets are Unix sockets (108 bytes at most).
        let tmp = tempfile::Builder::new()
            .prefix(&format!("fdslurm{slot}-"))
            .tempdir_in("/tmp")
            .map_err(|e| StartError::Failed(format!("making a temp dir: {e}")))?;
        let dir = tmp.path().to_path_buf();
        let conf = dir.join("slurm.conf");
        let made = ["munge", "spool/ctld", "spool/d", "run", "log"]
            .iter()
            .try_for_each(|sub| fs::create_dir_all(dir.join(sub)))
            .and_then(|()| fs::set_permissions(dir.join("munge"), fs::Permissions::from_mode(0o711)))
            .and_then(|()| fs::write(&conf, slurm_conf(&dir, nodes, slot)));
        made.map_err(|e| StartError::Failed(format!("preparing {}: {e}", dir.display())))?;
        let cluster =
            Cluster { tmp: Some(tmp), dir, conf, slot, nodes, daemons: Mutex::new(BTreeMap::new()), _slot_lock: lock };
        // On an error the cluster is dropped here, which stops whatever did start.
        cluster.boot(began + START_DEADLINE).map_err(StartError::Failed)?;
        eprintln!(
            "{test}: Slurm cluster of {nodes} nodes (slot {slot}) idle after {} ms in {}",
            began.elapsed().as_millis(),
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn boot(&self, deadline: Instant) -> Result<(), String> {
        let munge = self.dir.join("munge");
        let (key, socket) = (munge.join("munge.key"), munge.join("munge.sock"));
        let made = slurm_command(&self.conf, "mungekey").arg("--create").arg(arg("--keyfile=", &key)).output();
        match made {
            Ok(out) if out.status.success() => {}
            other => return Err(format!("mungekey --create failed: {other:?}")),
        }
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).map_err(|e| format!("chmod {key:?}: {e}"))?;
        let log = self.dir.join("log");
        let munged_args = [
            "-F".to_string(),
            arg("--socket=", &socket),
            arg("--key-file=", &key),
            arg("--log-file=", &log.join("munged.log")),
            arg("--pid-file=", &self.dir.join("run/munged.pid")),
            arg("--seed-file=", &munge.join("munge.seed")),
        ];
        self.spawn("munged", "munged", &munged_args.iter().map(String::as_str).collect::<Vec<_>>())?;
        self.wait_for("munged to accept connections", deadline, || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        })?;
        // -i: ignore old state files (there are none, the dir is new).
        self.spawn("slurmctld", "slurmctld", &["-D", "-i"])?;
        // The port first: refused at once until slurmctld listens, where a ping would retry for
        // seconds, long after slurmctld died.
        let port = CTLD_PORT_BASE + self.slot;
        self.wait_for("slurmctld to answer `scontrol ping`", deadline, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && output_within(self.command("scontrol").arg("ping"), Duration::from_secs(5))
                    .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
        })?;
        for node in self.node_names() {
            self.spawn(&format!("slurmd-{node}"), "slurmd", &["-D", "-N", &node])?;
        }
        self.wait_for("every node to be idle", deadline, || self.idle_nodes() == self.nodes)
    }

    /// Polls `ready` until it holds; Err (with logs) when a daemon exits or the deadline passes.
    fn wait_for(&self, what: &str, deadline: Instant, mut ready: impl FnMut() -> bool) -> Result<(), String> {
        loop {
            let dead: Vec<String> = self
                .daemons()
                .iter_mut()
                .filter_map(|(name, child)| match child.try_wait() {
                    Ok(None) => None,
                    Ok(Some(status)) => Some(format!("{name} exited ({status})")),
                    Err(e) => Some(format!("{name}: {e}")),
                })
                .collect();
            if !dead.is_empty() {
                return Err(self.failure(&format!("{} while waiting for {what}", dead.join(", "))));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failure(&format!("timed out after {START_DEADLINE:?} waiting for {what}")));
            }
            std::thread::sleep(POLL);
        }
    }

    fn idle_nodes(&self) -> usize {
        let out = output_within(self.command("sinfo").args(["-h", "-t", "idle", "-o", "%D"]), CLIENT_LIMIT);
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
        text.split_whitespace().filter_map(|n| n.parse::<usize>().ok()).sum()
    }

    /// `what`, the nodes' states, and the tails of the logs that matter, for a failed start.
    fn failure(&self, what: &str) -> String {
        let mut msg = format!("{what} (dir {})", self.dir.display());
        // Without slurmctld, sinfo would only retry for seconds.
        let sinfo = || output_within(self.command("sinfo").args(["-h", "-N", "-o", "%N %T %E"]), CLIENT_LIMIT);
        if let Some(o) = self.ctld_alive().then(sinfo).flatten() {
            let states: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap_or("").lines().take(20).collect();
            msg += &format!("\n--- sinfo -N (first 20)\n{}", states.join("\n"));
        }
        let mut names: BTreeSet<String> = ["munged", "slurmctld", "slurmd-n1"].map(String::from).into();
        for (name, child) in self.daemons().iter_mut() {
            if !matches!(child.try_wait(), Ok(None)) {
                names.insert(name.clone());
            }
        }
        for name in names {
            for file in [format!("{name}.log"), format!("{name}.out")] {
                let Ok(text) = fs::read_to_string(self.dir.join("log").join(&file)) else { continue };
                // Debian's build logs these on every start; they say nothing.
                let lines: Vec<&str> =
                    text.lines().filter(|l| !l.contains("pmix") && !l.contains("MPI: Cannot create")).collect();
                msg += &format!("\n--- {file} (last 20 lines)\n{}", lines[lines.len().saturating_sub(20)..].join("\n"));
            }
        }
        msg
    }

    fn spawn(&self, name: &str, program: &str, args: &[&str]) -> Result<(), String> {
        let path = self.dir.join("log").join(format!("{name}.out"));
        let out = fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", path.display()))?;
        let mut c = self.command(program);
        c.args(args).stdout(out).stderr(err);
        let child = c.spawn().map_err(|e| self.failure(&format!("spawning {program}: {e}")))?;
        self.daemons().insert(name.to_string(), child);
        Ok(())
    }

    fn ctld_alive(&self) -> bool {
        self.daemons().get_mut("slurmctld").is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn daemons(&self) -> MutexGuard<'_, BTreeMap<String, Child>> {
        self.daemons.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// I of node `nI`; panics for a name this cluster does not have.
    fn node_index(&self, node: &str) -> usize {
        match node.strip_prefix('n').and_then(|i| i.parse::<usize>().ok()) {
            Some(i) if (1..=self.nodes).contains(&i) && node == format!("n{i}") => i,
            _ => panic!("no node {node:?} in this cluster (nodes are n1..n{})", self.nodes),
        }
    }

    /// Live processes of this cluster's jobs: on `node`, or on every node. Tasks are found through
    /// their stepd (or, if they escaped it, their environment), never through the daemons.
    fn job_processes(&self, node: Option<&str>) -> BTreeSet<i32> {
        let procs = processes();
        let ours = format!("SLURM_CONF={}", self.conf.display());
        let mut roots = BTreeSet::new();
        for p in &procs {
            let env = environ(p.pid);
            if !env.contains(&ours) {
                continue;
            }
            let on_node = |n: &str| env.contains(&format!("SLURMD_NODENAME={n}"));
            let is_root = if p.comm == "slurmstepd" {
                node.is_none_or(|n| {
                    let log = self.dir.join("log").join(format!("slurmd-{n}.log"));
                    has_open(p.pid, &log)
                        || descendants(&procs, [p.pid].into())
                            .iter()
                            .any(|&d| environ(d).contains(&format!("SLURMD_NODENAME={n}")))
                })
            } else {
                match node {
                    Some(n) => on_node(n),
                    None => env.iter().any(|v| v.starts_with("SLURM_JOB_ID=")),
                }
            };
            if is_root {
                roots.insert(p.pid);
            }
        }
        let protected = self_and_ancestors(&procs);
        descendants(&procs, roots).into_iter().filter(|pid| !protected.contains(pid)).collect()
    }

    /// SIGKILLs the job processes (on `node`, or everywhere) until a scan finds none: a stepd may
    /// fork a task between a scan and the kill. Returns how many were killed.
    fn kill_job_processes(&self, node: Option<&str>) -> usize {
        let mut killed = 0;
        for _ in 0..10 {
            let pids = self.job_processes(node);
            if pids.is_empty() {
                break;
            }
            // SAFETY: signalling processes of this cluster's jobs, found just above.
            killed += pids.iter().filter(|&&pid| unsafe { libc::kill(pid, libc::SIGKILL) } == 0).count();
            wait_gone(&pids, Instant::now() + Duration::from_secs(10));
        }
        killed
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.ctld_alive() {
            // Politely first; bounded, since a wedged slurmctld would make the clients retry.
            if let Some(out) = output_within(self.command("squeue").args(["-h", "-o", "%i"]), CLIENT_LIMIT) {
                let ids: Vec<String> =
                    String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect();
                if !ids.is_empty() {
                    output_within(self.command("scancel").args(&ids), CLIENT_LIMIT);
                }
            }
        }
        // The jobs first: a slurmd asked to stop while it is still ending jobs waits for them (KillWait
        // and more). Then the slurmds while slurmctld still answers them (with it gone first, many
        // take seconds to exit), slurmctld (it lingers on RPCs to dead nodes), the jobs again (a stepd
        // started meanwhile), and last munged, which they all use.
        self.kill_job_processes(None);
        let mut daemons = std::mem::take(&mut *self.daemons());
        let munged = daemons.remove("munged");
        let ctld = daemons.remove("slurmctld");
        stop(daemons.into_values().collect(), Duration::from_secs(3));
        stop(ctld.into_iter().collect(), Duration::from_secs(1));
        self.kill_job_processes(None);
        stop(munged.into_iter().collect(), Duration::from_secs(3));
        if let Some(tmp) = self.tmp.take() {
            if std::env::var_os("FD_KEEP_SLURM").is_some() {
                eprintln!("FD_KEEP_SLURM: keeping the Slurm cluster's dir {}", tmp.keep().display());
            }
        }
    }
}

/// SIGTERM, up to `grace` for them to exit, then SIGKILL; every child reaped. Their state is
/// thrown away, so a daemon slow to shut down cleanly is not worth waiting long for.
fn stop(mut children: Vec<Child>, grace: Duration) {
    for c in &children {
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && children.iter_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
        std::thread::sleep(POLL);
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Reports `test` as skipped and returns true where this machine cannot run a cluster; for a test
/// that starts several and should be reported once.
pub fn skip(test: &str) -> bool {
    unavailable().map(|why| skipped(test, &why)).is_some()
}

/// Why a fake cluster cannot run on this machine, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("a fake Slurm cluster needs root (munged and slurmd run as root)".into());
    }
    let missing: Vec<&str> = TOOLS.into_iter().filter(|t| tool(t).is_none()).collect();
    if !missing.is_empty() {
        return Some(format!(
            "{} not installed (scripts/install-deps.sh installs slurmctld slurmd slurm-client munge)",
            missing.join(", ")
        ));
    }
    None
}

fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from);
    std::env::split_paths(&path).chain(sbin).map(|d| d.join(name)).find(|p| p.is_file())
}

fn slurm_command(conf: &Path, program: &str) -> Command {
    let mut c = Command::new(tool(program).unwrap_or_else(|| PathBuf::from(program)));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLURM_") {
            c.env_remove(k);
        }
    }
    c.env("SLURM_CONF", conf).stdin(Stdio::null());
    c
}

fn arg(flag: &str, path: &Path) -> String {
    format!("{flag}{}", path.display())
}

fn slurm_conf(dir: &Path, nodes: usize, slot: u16) -> String {
    let d = dir.display();
    let ctld_port = CTLD_PORT_BASE + slot;
    let first_port = SLURMD_PORT_BASE + slot * MAX_NODES as u16;
    let last_port = first_port + nodes as u16 - 1;
    let net = 10 + slot;
    format!(
        "ClusterName=fdtest{slot}
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
StateSaveLocation={d}/spool/ctld
SlurmdSpoolDir={d}/spool/d/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=10
KillWait=5
MinJobAge=300
NodeName=n[1-{nodes}] NodeHostname=localhost NodeAddr=127.0.{net}.[1-{nodes}] Port=[{first_port}-{last_port}] \
CPUs={CPUS_PER_NODE} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"
    )
}

/// Holds slot `slot` for this process until the returned file is closed (flock: the kernel lets
/// go of it when the holder dies, so a killed test run never blocks the next one).
fn lock_slot(slot: u16) -> Result<fs::File, String> {
    let path = format!("/tmp/flightdeck-slurm-slot-{slot}.lock");
    let f = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path);
    let f = f.map_err(|e| format!("opening {path}: {e}"))?;
    // SAFETY: flock on a descriptor we own; blocks while another cluster holds the slot.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!("locking {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(f)
}

/// Kills what a test run that died without dropping its cluster left on `slot`. Only called with the
/// slot's lock held, so whoever made those processes is gone.
fn reap_stale(slot: u16) {
    let prefix = format!("SLURM_CONF=/tmp/fdslurm{slot}-");
    let procs = processes();
    let roots = procs.iter().filter(|p| environ(p.pid).iter().any(|v| v.starts_with(&prefix))).map(|p| p.pid);
    let protected = self_and_ancestors(&procs);
    let pids: BTreeSet<i32> =
        descendants(&procs, roots.collect()).into_iter().filter(|p| !protected.contains(p)).collect();
    if pids.is_empty() {
        return;
    }
    eprintln!("slot {slot}: killing {} processes a dead test run left behind", pids.len());
    for &pid in &pids {
        // SAFETY: signalling processes of an earlier cluster on the slot we now hold.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_gone(&pids, Instant::now() + Duration::from_secs(10));
}

/// A live (not zombie) process.
struct Proc {
    pid: i32,
    ppid: i32,
    comm: String,
}

fn processes() -> Vec<Proc> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may itself hold spaces and parentheses.
            let (head, tail) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            let mut fields = tail.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z" && state != "X").then_some(Proc { pid, ppid, comm })
        })
        .collect()
}

fn environ(pid: i32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

fn has_open(pid: i32, path: &Path) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.filter_map(Result::ok).any(|fd| fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// `roots` and every live process below them.
fn descendants(procs: &[Proc], roots: BTreeSet<i32>) -> BTreeSet<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut all = roots.clone();
    let mut todo: Vec<i32> = roots.into_iter().collect();
    while let Some(pid) = todo.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if all.insert(child) {
                todo.push(child);
            }
        }
    }
    all
}

/// This test process and its ancestors: never signalled, whatever their environment says.
fn self_and_ancestors(procs: &[Proc]) -> BTreeSet<i32> {
    let parent: BTreeMap<i32, i32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let mut out = BTreeSet::new();
    let mut pid = std::process::id() as i32;
    while pid > 0 && out.insert(pid) {
        pid = parent.get(&pid).copied().unwrap_or(0);
    }
    out
}

/// Waits until none of `pids` is alive (a zombie counts as gone: it is dead, and pid 1 may never
/// reap it).
fn wait_gone(pids: &BTreeSet<i32>, deadline: Instant) {
    while Instant::now() < deadline && processes().iter().any(|p| pids.contains(&p.pid)) {
        std::thread::sleep(POLL);
    }
}

/// A command's output, or None when it fails to start or is still running after `limit` (then it
/// is killed).
fn output_within(c: &mut Command, limit: Duration) -> Option<Output> {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().ok()?;
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.ok(),
        Err(_) => {
            // SAFETY: our own child, not reaped while the waiting thread has not answered.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = rx.recv();
            None
        }
    }
}

/// Reports a skipped test like tests/common/mod.rs's `skipped` (this file stands alone): on stderr,
/// and appended to the file `FLIGHTDECK_SKIP_LOG` names, where `.ci/run` counts it.
fn skipped(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("FLIGHTDECK_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}
