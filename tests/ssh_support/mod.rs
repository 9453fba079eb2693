//! A lab of SSH nodes for tests: network namespaces on a private bridge, a real `sshd` in
//! each, keys made for the test, and an OpenSSH client config (`FLIGHTDECK_SSH_CONFIG`) naming
//! them `node0`, `node1`, ... Everything is removed on drop, also when a test fails.
//!
//! Addresses: 10.213.N.0/24 with N unique per lab; the bridge is 10.213.N.1 (this machine's
//! root namespace) and node i is 10.213.N.(i+2). These are the only non-loopback targets.
#![allow(dead_code)]
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub const SSH_PORT: u16 = 2222;
static LABS: AtomicU32 = AtomicU32::new(0);
/// Held while a lab picks its subnet and puts it on its bridge.
static SUBNETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub struct LabHost {
    pub alias: String,
    pub ns: String,
    pub addr: String,
    pub host_key_pub: PathBuf,
    sshd: Option<Child>,
}

pub struct Lab {
    pub dir: tempfile::TempDir,
    pub hosts: Vec<LabHost>,
    bridge: String,
    veths: Vec<String>,
    /// Each node's sessions get a home of their own (`home(i)`), so a relative
    /// `cluster.remote_dir` puts each node's files apart, as on machines with their own disks.
    homes: bool,
}

/// Runs a command; Err(its stderr) when it fails.
pub fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// Why SSH lab tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces".into());
    }
    for tool in ["/usr/sbin/sshd", "/usr/bin/ssh-keygen"] {
        if !Path::new(tool).exists() {
            return Some(format!("{tool} is not installed (scripts/install-deps.sh installs openssh-server)"));
        }
    }
    if sh(&["ip", "netns", "list"]).is_err() {
        return Some("`ip netns` is not available (iproute2)".into());
    }
    None
}

/// Prints why a test is skipped and returns true, when the lab cannot run here.
pub fn skip(test: &str) -> bool {
    match unavailable() {
        Some(why) => {
            crate::common::skipped(test, &why);
            true
        }
        None => false,
    }
}

fn keygen(path: &Path) {
    sh(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "flightdeck-test", "-f", path.to_str().unwrap()])
        .expect("ssh-keygen");
}

impl Lab {
    /// `n` nodes, each with its own sshd and host key; known_hosts trusts them all.
    pub fn new(n: usize) -> Lab {
        Lab::with_umask(n, None)
    }

    /// Like `new`, with every sshd (and so every session and command on the nodes) started
    /// under `umask`, as a node whose default is loose would be.
    pub fn with_umask(n: usize, umask: Option<u32>) -> Lab {
        Lab::build(n, umask, false)
    }

    /// Like `new`, with a home directory per node (`home(i)`): what a relative
    /// `cluster.remote_dir` is under on each node, so no node sees another's run directories.
    pub fn with_homes(n: usize) -> Lab {
        Lab::build(n, None, true)
    }

    /// Node i's home when the lab has homes of their own.
    pub fn home(&self, i: usize) -> PathBuf {
        self.path().join(format!("home{i}"))
    }

    fn build(n: usize, umask: Option<u32>, homes: bool) -> Lab {
        // Unique among the labs of this process (a test binary has fewer than 16 labs).
        let id = (std::process::id() % 1000) * 16 + LABS.fetch_add(1, Ordering::SeqCst) % 16;
        let dir = tempfile::Builder::new().prefix("fds").tempdir_in("/tmp").expect("tempdir");
        let mut lab = Lab { dir, hosts: Vec::new(), bridge: format!("fdbr{id}"), veths: Vec::new(), homes };
        // Leftovers of a crashed run with the same id would make the setup fail.
        let _ = sh(&["ip", "link", "del", &lab.bridge]);
        sh(&["ip", "link", "add", &lab.bridge, "type", "bridge"]).expect("bridge");
        let subnet = {
            // A subnet no interface here has: a lab a killed test process left behind keeps its
            // bridge and its nodes' namespaces, and a second bridge on the same /24 sent this
            // lab's connections to that one's sshd-less nodes ("Connection refused").
            let _choosing = SUBNETS.lock().unwrap_or_else(|p| p.into_inner());
            let used = sh(&["ip", "-4", "-o", "addr", "show"]).expect("ip addr");
            let subnet = (0..250)
                .map(|k| (id + k) % 250 + 1)
                .find(|n| !used.contains(&format!(" 10.213.{n}.")))
                .expect("a free 10.213.N.0/24 for the lab");
            sh(&["ip", "addr", "add", &format!("10.213.{subnet}.1/24"), "dev", &lab.bridge]).expect("bridge address");
            subnet
        };
        sh(&["ip", "link", "set", &lab.bridge, "up"]).expect("bridge up");
        std::fs::create_dir_all("/run/sshd").expect("sshd's privilege separation directory");
        let client_key = lab.path().join("id_ed25519");
        keygen(&client_key);
        std::fs::copy(lab.path().join("id_ed25519.pub"), lab.path().join("authorized_keys")).unwrap();
        for i in 0..n {
            let ns = format!("fd{id}n{i}");
            let veth = format!("fdv{id}n{i}");
            let addr = format!("10.213.{subnet}.{}", i + 2);
            let _ = sh(&["ip", "netns", "del", &ns]);
            sh(&["ip", "netns", "add", &ns]).expect("netns");
            // Registered before it is fully set up, so Drop removes it whatever fails next.
            let key = lab.path().join(format!("host{i}_ed25519"));
            lab.hosts.push(LabHost {
                alias: format!("node{i}"),
                ns: ns.clone(),
                addr: addr.clone(),
                host_key_pub: key.with_extension("pub"),
                sshd: None,
            });
            lab.veths.push(veth.clone());
            sh(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns]).expect("veth");
            sh(&["ip", "link", "set", &veth, "master", &lab.bridge, "up"]).expect("veth on bridge");
            lab.exec(i, &["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"]).expect("node address");
            lab.exec(i, &["ip", "link", "set", "eth0", "up"]).expect("eth0 up");
            lab.exec(i, &["ip", "link", "set", "lo", "up"]).expect("lo up");
            keygen(&key);
            let sshd = lab.start_sshd(i, &key, umask);
            lab.hosts[i].sshd = Some(sshd);
        }
        lab.write_config(&[]);
        lab.trust_all();
        lab
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs a command inside node i's namespace.
    pub fn exec(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let mut full = vec!["ip", "netns", "exec", &self.hosts[i].ns];
        full.extend_from_slice(args);
        sh(&full)
    }

    fn start_sshd(&self, i: usize, key: &Path, umask: Option<u32>) -> Child {
        let config = self.path().join(format!("sshd{i}.conf"));
        let text = format!(
            "Port {SSH_PORT}\nListenAddress {addr}\nHostKey {key}\nPidFile {pid}\nAuthorizedKeysFile {ak}\n\
             UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nLogLevel INFO\n",
            addr = self.hosts[i].addr,
            key = key.display(),
            pid = self.path().join(format!("sshd{i}.pid")).display(),
            ak = self.path().join("authorized_keys").display(),
        );
        let text = if self.homes {
            std::fs::create_dir_all(self.home(i)).unwrap();
            format!("{text}SetEnv HOME={}\n", self.home(i).display())
        } else {
            text
        };
        std::fs::write(&config, text).unwrap();
        // Each node gets its own core where there are enough (what it would have on a real
        // cluster): ranks size their thread pools by the cores they may use, and nodes that all
        // think they own the whole machine oversubscribe it many times over.
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i].ns]);
        if cores > 1 && Path::new("/usr/bin/taskset").exists() {
            cmd.args(["/usr/bin/taskset", "-c", &(i % cores).to_string()]);
        }
        if let Some(mask) = umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .args(["/usr/sbin/sshd", "-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sshd");
        // sshd says when it listens; the rest of its log is kept for a failing test to print.
        let (tx, rx) = std::sync::mpsc::channel();
        let log = self.path().join(format!("sshd{i}.log"));
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(log).ok();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("Server listening") {
                    let _ = tx.send(Ok(()));
                }
                if let Some(f) = file.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
            }
            let _ = tx.send(Err(()));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(())) => child,
            _ => panic!("sshd in {} did not start: {}", self.hosts[i].ns, self.sshd_log(i)),
        }
    }

    pub fn sshd_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.path().join(format!("sshd{i}.log"))).unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.path().join("ssh_config")
    }

    pub fn known_hosts(&self) -> PathBuf {
        self.path().join("known_hosts")
    }

    /// Where runs put their files on the nodes (the namespaces share this filesystem).
    pub fn remote_dir(&self) -> PathBuf {
        self.path().join("remote")
    }

    /// The client config: `nodeI` for each host, plus `(alias, node, identity file)` extras.
    pub fn write_config(&self, extra: &[(&str, usize, &Path)]) {
        let mut text = String::new();
        let mut entry = |alias: &str, i: usize, key: &Path| {
            text.push_str(&format!(
                "Host {alias}\n  HostName {}\n  Port {SSH_PORT}\n  User root\n  IdentityFile {}\n  UserKnownHostsFile {}\n\n",
                self.hosts[i].addr,
                key.display(),
                self.known_hosts().display()
            ));
        };
        for (i, h) in self.hosts.iter().enumerate() {
            entry(&h.alias, i, &self.path().join("id_ed25519"));
        }
        for (alias, i, key) in extra {
            entry(alias, *i, key);
        }
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// known_hosts line for node i with the public key of host `key_of`.
    pub fn known_line(&self, i: usize, key_of: usize) -> String {
        let public = std::fs::read_to_string(&self.hosts[key_of].host_key_pub).unwrap();
        let mut words = public.split_whitespace();
        let (kind, blob) = (words.next().unwrap(), words.next().unwrap());
        format!("[{}]:{SSH_PORT} {kind} {blob}\n", self.hosts[i].addr)
    }

    pub fn trust_all(&self) {
        let lines: String = (0..self.hosts.len()).map(|i| self.known_line(i, i)).collect();
        std::fs::write(self.known_hosts(), lines).unwrap();
    }

    /// `SHA256:...` of node i's host key, as ssh-keygen prints it.
    pub fn fingerprint(&self, i: usize) -> String {
        let out = sh(&["ssh-keygen", "-l", "-f", self.hosts[i].host_key_pub.to_str().unwrap()]).unwrap();
        out.split_whitespace().nth(1).unwrap().to_string()
    }

    /// Installs the binary on the nodes as a launch would (a hard link, with its checksum
    /// marker), so that tests other than the one about deploying skip the 100 MB upload.
    pub fn preinstall(&self) {
        self.preinstall_at(&self.remote_dir());
    }

    /// `preinstall` into the remote directory `root` (each node's, in a lab with homes).
    pub fn preinstall_at(&self, root: &Path) {
        static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let bin = crate::common::bin();
        let hash = HASH.get_or_init(|| {
            let out = sh(&["sha256sum", bin.to_str().unwrap()]).expect("sha256sum");
            out.split_whitespace().next().unwrap().to_string()
        });
        let dir = root.join("bin").join(format!("{}-{}", env!("CARGO_PKG_VERSION"), &hash[..16]));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::hard_link(&bin, dir.join("flightdeck"))
            .or_else(|_| std::fs::copy(&bin, dir.join("flightdeck")).map(|_| ()))
            .unwrap();
        std::fs::write(dir.join("flightdeck.sha256"), format!("{hash}\n")).unwrap();
    }

    pub fn link(&self, i: usize, up: bool) {
        self.exec(i, &["ip", "link", "set", "eth0", if up { "up" } else { "down" }]).expect("ip link set");
    }

    /// Processes started for this lab's nodes (agents, ranks, bridges): their command line or
    /// environment names the lab's directory.
    pub fn leftover_processes(&self) -> Vec<String> {
        let needle = self.path().display().to_string();
        let mut found = Vec::new();
        let me = std::process::id().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().to_string();
            if pid.parse::<u32>().is_err() || pid == me {
                continue;
            }
            let cmd = String::from_utf8_lossy(&std::fs::read(entry.path().join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
            let env =
                String::from_utf8_lossy(&std::fs::read(entry.path().join("environ")).unwrap_or_default()).to_string();
            // sshd itself is the lab's own (its config is in the lab directory).
            if cmd.contains("sshd") {
                continue;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z')) {
                continue;
            }
            if cmd.contains(&needle) || env.contains(&needle) {
                found.push(format!("{pid}: {cmd}"));
            }
        }
        found
    }

    /// Waits for the lab's node processes to exit (each one's pidfd), then asserts none is left.
    pub fn assert_nothing_running(&self) {
        for entry in self.leftover_processes() {
            if let Some(pid) = entry.split(':').next().and_then(|p| p.parse::<i32>().ok()) {
                crate::common::wait_pid_exit(pid, 15_000);
            }
        }
        let left = self.leftover_processes();
        assert!(left.is_empty(), "processes left on the nodes: {left:#?}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut c) = h.sshd.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Whatever a failed test left on the nodes goes too (agents, ranks, bridges).
        for entry in self.leftover_processes() {
            if let Some(pid) = entry.split(':').next().and_then(|p| p.parse::<i32>().ok()) {
                // SAFETY: signalling a process this lab's test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for h in &self.hosts {
            // sshd's per-connection children and anything else still in the namespace.
            for pid in sh(&["ip", "netns", "pids", &h.ns]).unwrap_or_default().split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: signalling a process inside this lab's own namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let _ = sh(&["ip", "netns", "del", &h.ns]);
        }
        for v in &self.veths {
            let _ = sh(&["ip", "link", "del", v]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
    }
}
