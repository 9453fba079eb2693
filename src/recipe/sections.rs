//! Validation of the runtime sections: train, parallel, checkpoint, cluster, telemetry, fault, command.
use super::check::{Check, MAX_I64, MAX_U32, R};
use super::error::ErrorKind;
use super::raw::*;
use super::*;

/// torch DDP's default gradient bucket.
const DEFAULT_BUCKET_BYTES: i64 = 25 * 1024 * 1024;

impl Check<'_> {
    pub(super) fn train(&self, raw: RawTrain, trains: bool, device: Device) -> R<Train> {
        let steps = self.required("train.steps", raw.steps, trains, 1, MAX_I64)? as u64;
        let batch_per_rank = self.required("train.batch_per_rank", raw.batch_per_rank, trains, 1, MAX_U32)? as u32;
        let lr = match raw.lr {
            Some(lr) => self.float("train.lr", lr, lr > 0.0, "a positive number, e.g. 3e-4")?,
            None if trains => return Err(self.missing("train.lr", "a positive number, e.g. 3e-4")),
            None => 0.0,
        };
        let min_lr = match raw.min_lr {
            Some(v) => {
                self.float("train.min_lr", v, (0.0..=lr).contains(&v), &format!("between 0 and train.lr = {lr}"))?
            }
            None => lr / 10.0,
        };
        let warmup = self.int_in("train.warmup", raw.warmup.unwrap_or(0), 0, MAX_I64)? as u64;
        if trains && warmup > steps {
            return Err(self.invalid(
                "train.warmup",
                format!(
                    "{} is longer than {}; choose warmup from 0 to {steps}",
                    self.ctx.show("train.warmup", warmup),
                    self.ctx.show("train.steps", steps)
                ),
            ));
        }
        use Schedule::*;
        let schedule = self.choice(
            "train.schedule",
            raw.schedule,
            Cosine,
            &[("constant", Constant), ("cosine", Cosine), ("linear", Linear)],
        )?;
        let grad_clip = raw.grad_clip.unwrap_or(1.0);
        let grad_clip = self.float("train.grad_clip", grad_clip, grad_clip >= 0.0, "0 (off) or a positive max norm")?;
        let weight_decay = raw.weight_decay.unwrap_or(0.1);
        let weight_decay = self.float("train.weight_decay", weight_decay, weight_decay >= 0.0, "0 or more")?;
        let beta = |key, v: f64| self.float(key, v, (0.0..1.0).contains(&v), "in [0, 1), e.g. 0.9");
        let beta1 = beta("train.beta1", raw.beta1.unwrap_or(0.9))?;
        let beta2 = beta("train.beta2", raw.beta2.unwrap_or(0.95))?;
        let seed = self.int_in("train.seed", raw.seed.unwrap_or(1337), 0, MAX_I64)? as u64;
        let dtype =
            self.choice("train.dtype", raw.dtype, Dtype::Fp32, &[("fp32", Dtype::Fp32), ("bf16", Dtype::Bf16)])?;
        if trains && dtype == Dtype::Bf16 && device != Device::Cuda {
            return Err(self.invalid("train.dtype", format!(
                r#"{} needs cluster.device = "cuda" (bf16 autocast runs on GPUs; CPU ranks train in fp32); valid on cpu: fp32"#,
                self.ctx.show("train.dtype", "\"bf16\"")
            )));
        }
        let threads = self.int_in("train.threads", raw.threads.unwrap_or(0), 0, 1024)? as u32;
        Ok(Train {
            threads,
            steps,
            batch_per_rank,
            lr,
            min_lr,
            warmup,
            schedule,
            grad_clip,
            weight_decay,
            beta1,
            beta2,
            seed,
            dtype,
        })
    }

    pub(super) fn parallel(&self, raw: RawParallel, cluster: &Cluster) -> R<Parallel> {
        let hosts = u64::from(cluster.node_count());
        let slots = hosts * u64::from(cluster.ranks_per_node);
        let data = match raw.data {
            Some(v) => self.int_in("parallel.data", v, 1, MAX_U32)? as u32,
            None => u32::try_from(slots).map_err(|_| {
                self.invalid(
                    "cluster.ranks_per_node",
                    format!(
                        "{} hosts × {} ranks per node is more ranks than Flightdeck counts ({})",
                        hosts,
                        cluster.ranks_per_node,
                        u32::MAX
                    ),
                )
            })?,
        };
        if u64::from(data) > slots {
            return Err(self.invalid(
                "parallel.data",
                format!(
                    "{} is larger than the {slots} rank slots: {hosts} {} times cluster.ranks_per_node = {}; \
                 choose parallel.data from 1 to {slots}, or add {}, or raise cluster.ranks_per_node",
                    self.ctx.show("parallel.data", data),
                    match (cluster.launcher, hosts) {
                        (ClusterLauncher::Slurm, 1) => "node (cluster.nodes)",
                        (ClusterLauncher::Slurm, _) => "nodes (cluster.nodes)",
                        (ClusterLauncher::Hosts, 1) => "host (cluster.hosts)",
                        (ClusterLauncher::Hosts, _) => "hosts (cluster.hosts)",
                    },
                    cluster.ranks_per_node,
                    if cluster.launcher == ClusterLauncher::Slurm { "nodes" } else { "hosts" }
                ),
            ));
        }
        for (key, v) in [("parallel.tensor", raw.tensor), ("parallel.pipeline", raw.pipeline)] {
            if let Some(v) = v.filter(|v| *v != 1) {
                return Err(self.ctx.err(
                    ErrorKind::Unsupported,
                    key,
                    format!("{}: only data parallelism runs today; valid: 1", self.ctx.show(key, v)),
                ));
            }
        }
        use CollectiveBackend::*;
        let backend = self.choice("parallel.backend", raw.backend, Ring, &[("ring", Ring), ("nccl", Nccl)])?;
        if backend == Nccl && cluster.device != Device::Cuda {
            return Err(self.invalid(
                "parallel.backend",
                format!(
                    r#"{} needs cluster.device = "cuda" (NCCL reduces GPU tensors); use backend = "ring" on cpu"#,
                    self.ctx.show("parallel.backend", "\"nccl\"")
                ),
            ));
        }
        let bucket_bytes = raw.bucket_bytes.unwrap_or(DEFAULT_BUCKET_BYTES);
        let bucket_bytes = self.int_in("parallel.bucket_bytes", bucket_bytes, 1, MAX_I64)? as u64;
        Ok(Parallel { data, backend, bucket_bytes })
    }

    pub(super) fn checkpoint(&self, raw: RawCheckpoint) -> R<Checkpoint> {
        let every = self.int_in("checkpoint.every", raw.every.unwrap_or(0), 0, MAX_I64)? as u64;
        let keep = self.int_in("checkpoint.keep", raw.keep.unwrap_or(3), 1, MAX_U32)? as u32;
        let dir = raw.dir.unwrap_or_else(|| "checkpoints".to_string());
        if dir.trim().is_empty() || dir.chars().any(char::is_control) {
            return Err(self.invalid(
                "checkpoint.dir",
                format!(
                    r#"{} is not a directory name; e.g. dir = "checkpoints" (relative to the run's directory)"#,
                    self.ctx.show("checkpoint.dir", format!("{dir:?}"))
                ),
            ));
        }
        Ok(Checkpoint { every, keep, dir })
    }

    pub(super) fn telemetry(&self, raw: RawTelemetry) -> R<Telemetry> {
        let step_interval = self.int_in("telemetry.step_interval", raw.step_interval.unwrap_or(1), 1, MAX_I64)? as u64;
        let key = "telemetry.sample_interval_ms";
        let sample_interval_ms = self.int_in(key, raw.sample_interval_ms.unwrap_or(1000), 250, MAX_I64)? as u64;
        Ok(Telemetry { step_interval, sample_interval_ms, enabled: raw.enabled.unwrap_or(true) })
    }

    pub(super) fn command(&self, raw: Option<RawCommand>, kind: Kind) -> R<Option<Command>> {
        let example = r#"argv = ["python", "train.py"] under [command]"#;
        if kind != Kind::Command {
            return match raw {
                None => Ok(None),
                Some(_) => Err(self.invalid("command", format!(
                    r#"[command] is only read when kind = "command" (this recipe has kind = "{}"); remove [command] or set kind = "command""#,
                    self.kind
                ))),
            };
        }
        let raw = raw.unwrap_or_default();
        let log_format = match raw.log_format.as_deref().map(str::parse::<crate::adapters::Choice>) {
            None => crate::adapters::Choice::Auto,
            Some(Ok(choice)) => choice,
            Some(Err(e)) => {
                let shown = self.ctx.show("command.log_format", toml::Value::from(e.given.clone()));
                return Err(self.invalid(
                    "command.log_format",
                    format!("{shown} is not a log format; valid: auto, none, {}", e.valid),
                ));
            }
        };
        let Some(argv) = raw.argv else {
            let message = format!(r#"command.argv is missing; kind = "command" runs it on every rank: add {example}"#);
            return Err(self.ctx.err(ErrorKind::Missing, "command.argv", message));
        };
        let shown = self.ctx.show("command.argv", toml::Value::from(argv.clone()));
        if argv.first().is_none_or(|program| program.trim().is_empty()) {
            return Err(self.invalid("command.argv", format!("{shown} names no program; e.g. {example}")));
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(self.invalid(
                "command.argv",
                format!("{shown} contains a NUL character, which no program argument can hold"),
            ));
        }
        let launcher = self.choice(
            "command.launcher",
            raw.launcher,
            Launcher::Direct,
            &[("direct", Launcher::Direct), ("torchrun", Launcher::Torchrun)],
        )?;
        self.command_launch(&argv, launcher, &shown)?;
        let mut env = Vec::new();
        for item in raw.env.unwrap_or_default() {
            let ok = item.split_once('=').filter(|(k, _)| {
                !k.is_empty()
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && !k.as_bytes()[0].is_ascii_digit()
            });
            let Some((key, value)) = ok else {
                let shown = self.ctx.show("command.env", toml::Value::from(item.clone()));
                return Err(self.invalid(
                    "command.env",
                    format!(r#"{shown}: each entry is "NAME=VALUE" with NAME of letters, digits and _ (not first a digit), e.g. env = ["TORCH_FR_BUFFER_SIZE=4000"]"#),
                ));
            };
            if item.contains('\0') {
                return Err(self.invalid("command.env", format!("{item:?} contains a NUL character")));
            }
            env.push((key.to_string(), value.to_string()));
        }
        let cwd = match raw.cwd.map(std::path::PathBuf::from) {
            Some(dir) if dir.is_absolute() => Some(dir),
            Some(dir) => Some(self.base.map_or(dir.clone(), |b| b.join(&dir))),
            None => self.base.map(std::path::Path::to_path_buf),
        };
        Ok(Some(Command {
            argv,
            log_format,
            observe: raw.observe.unwrap_or(true),
            instrument: raw.instrument.unwrap_or(true),
            env,
            cwd,
            launcher,
        }))
    }

    /// An argv that starts torchrun needs `launcher = "torchrun"` (else every rank would start
    /// a torchrun of its own), and then leaves to Flightdeck the options it sets from `[cluster]`.
    fn command_launch(&self, argv: &[String], launcher: Launcher, shown: &str) -> R<()> {
        let prefix = torchrun_prefix_len(argv);
        match (launcher, prefix) {
            (Launcher::Direct, Some(_)) => Err(self.invalid(
                "command.argv",
                format!(
                    r#"{shown} starts torchrun, which would start a torchrun per rank; set [command] launcher = "torchrun" and give the script, e.g. argv = ["python", "train.py"] (Flightdeck passes torchrun --nnodes, --nproc-per-node, --node-rank and the rendezvous from [cluster])"#
                ),
            )),
            (Launcher::Direct, None) => Ok(()),
            (Launcher::Torchrun, prefix) => {
                let rest = &argv[prefix.unwrap_or(1)..];
                let set_here = rest.iter().take_while(|a| a.starts_with('-')).find(|a| {
                    let name = a.split('=').next().unwrap_or(a).replace('_', "-");
                    TORCHRUN_OPTIONS_SET.contains(&name.as_str()) || name.starts_with("--rdzv")
                });
                if let Some(option) = set_here {
                    return Err(self.invalid(
                        "command.argv",
                        format!(
                            "{shown} gives torchrun {option:?}, which Flightdeck sets itself (from [cluster], with the ranks' output in the run directory); leave it out"
                        ),
                    ));
                }
                let python_option = prefix.is_none() && rest.first().is_some_and(|a| a.starts_with('-') && a != "-m");
                if python_option {
                    return Err(self.invalid(
                        "command.argv",
                        format!(
                            r#"{shown}: with launcher = "torchrun" argv is the interpreter, then the script (or -m MODULE) and its arguments; torchrun does not pass {:?} on to Python (set PYTHON* variables in [command] env instead)"#,
                            rest[0]
                        ),
                    ));
                }
                if rest.iter().all(|a| a.starts_with('-')) {
                    return Err(self.invalid(
                        "command.argv",
                        format!(r#"{shown} names no script for torchrun to run, e.g. argv = ["python", "train.py"]"#),
                    ));
                }
                Ok(())
            }
        }
    }

    pub(super) fn cluster(&self, raw: RawCluster) -> R<Cluster> {
        let launcher = self.choice(
            "cluster.launcher",
            raw.launcher.clone(),
            ClusterLauncher::Hosts,
            &[("hosts", ClusterLauncher::Hosts), ("slurm", ClusterLauncher::Slurm)],
        )?;
        let slurm = self.cluster_slurm(&raw, launcher)?;
        // Checked after the hosts (whose errors come first), before `raw` is taken apart.
        let ssh = self.cluster_ssh(&raw);
        if launcher == ClusterLauncher::Slurm {
            // `hosts = ["local"]` is the default every shipped recipe spells out: a launch with
            // `--set cluster.launcher=slurm` leaves it, and it names no node Slurm could clash with.
            if let Some(hosts) = raw.hosts.as_ref().filter(|h| h.as_slice() != ["local"]) {
                return Err(self.invalid(
                    "cluster.hosts",
                    format!(
                        "{} and cluster.launcher = \"slurm\" exclude each other: Slurm picks the nodes; \
                         remove cluster.hosts and give the node count as cluster.nodes",
                        self.ctx.show("cluster.hosts", format!("{hosts:?}"))
                    ),
                ));
            }
            let rpn = self.int_in("cluster.ranks_per_node", raw.ranks_per_node.unwrap_or(1), 1, MAX_U32)? as u32;
            let device = self.choice(
                "cluster.device",
                raw.device,
                Device::Cpu,
                &[("cpu", Device::Cpu), ("cuda", Device::Cuda)],
            )?;
            if raw.spare_hosts.as_ref().is_some_and(|s| !s.is_empty()) {
                return Err(self.invalid(
                    "cluster.spare_hosts",
                    "cluster.spare_hosts and cluster.launcher = \"slurm\" exclude each other: Slurm picks the \
                     nodes (and replaces a down one at the next allocation); remove cluster.spare_hosts"
                        .to_string(),
                ));
            }
            let spare_hosts = Vec::new();
            return Ok(Cluster {
                hosts: Vec::new(),
                spare_hosts,
                ranks_per_node: rpn,
                device,
                ssh: ssh?,
                launcher,
                slurm,
            });
        }
        let hosts = raw.hosts.unwrap_or_else(|| vec!["local".to_string()]);
        let forms = r#"hosts are "local" or SSH destinations like "node-a" or "user@node-b:2222""#;
        if hosts.is_empty() {
            return Err(self.invalid(
                "cluster.hosts",
                format!("{} lists no host; {forms}, e.g. hosts = [\"local\"]", self.ctx.show("cluster.hosts", "[]")),
            ));
        }
        for (i, host) in hosts.iter().enumerate() {
            if let Some(problem) = host_problem(host) {
                return Err(self.invalid(
                    "cluster.hosts",
                    format!(
                        "{} {problem}; {forms}",
                        self.ctx.show(&format!("cluster.hosts[{i}]"), format!("{host:?}"))
                    ),
                ));
            }
            if hosts[..i].contains(host) {
                return Err(self.invalid("cluster.hosts", format!(
                    "cluster.hosts lists {host:?} twice; list each node once and raise cluster.ranks_per_node for more ranks on it"
                )));
            }
        }
        let spare_hosts = self.spare_hosts(raw.spare_hosts.unwrap_or_default(), &hosts)?;
        let rpn = self.int_in("cluster.ranks_per_node", raw.ranks_per_node.unwrap_or(1), 1, MAX_U32)? as u32;
        let device =
            self.choice("cluster.device", raw.device, Device::Cpu, &[("cpu", Device::Cpu), ("cuda", Device::Cuda)])?;
        let ssh = ssh?;
        Ok(Cluster { hosts, spare_hosts, ranks_per_node: rpn, device, ssh, launcher, slurm })
    }

    /// `cluster.spare_hosts`: SSH destinations, each once, none of them in `cluster.hosts`, and
    /// only beside SSH hosts (recovery swaps one in for a host that failed twice).
    fn spare_hosts(&self, spares: Vec<String>, hosts: &[String]) -> R<Vec<String>> {
        if !spares.is_empty() && hosts.iter().any(|h| h == "local") {
            return Err(self.invalid(
                "cluster.spare_hosts",
                format!(
                    "{} needs SSH hosts in cluster.hosts: a spare replaces a host that failed, and \"local\" \
                     (this machine) has nothing to replace it with; list the nodes as SSH destinations",
                    self.ctx.show("cluster.spare_hosts", format!("{spares:?}"))
                ),
            ));
        }
        for (i, host) in spares.iter().enumerate() {
            let shown = self.ctx.show(&format!("cluster.spare_hosts[{i}]"), format!("{host:?}"));
            let problem = match host_problem(host) {
                _ if host == "local" => Some("is this machine, which cannot stand in for an SSH node".to_string()),
                Some(p) => Some(p),
                None if hosts.contains(host) => {
                    Some("is also in cluster.hosts; a spare is a host the run does not use".into())
                }
                None if spares[..i].contains(host) => Some("is listed twice".into()),
                None => None,
            };
            if let Some(problem) = problem {
                return Err(self.invalid(
                    "cluster.spare_hosts",
                    format!("{shown} {problem}; spares are SSH destinations like \"node-c\" or \"user@node-d:2222\""),
                ));
            }
        }
        Ok(spares)
    }

    /// `cluster.nodes`, `partition`, `time_limit`, `account`, `sbatch_args`, `slurm_job` and
    /// `grace_s`: only with `launcher = "slurm"` (elsewhere they would be silently ignored).
    fn cluster_slurm(&self, raw: &RawCluster, launcher: ClusterLauncher) -> R<ClusterSlurm> {
        let given = [
            ("cluster.nodes", raw.nodes.is_some()),
            ("cluster.partition", raw.partition.is_some()),
            ("cluster.time_limit", raw.time_limit.is_some()),
            ("cluster.account", raw.account.is_some()),
            ("cluster.sbatch_args", raw.sbatch_args.is_some()),
            ("cluster.slurm_job", raw.slurm_job.is_some()),
            ("cluster.grace_s", raw.grace_s.is_some()),
        ];
        if launcher != ClusterLauncher::Slurm {
            if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
                return Err(self.invalid(
                    key,
                    format!("{key} is a Slurm setting; add cluster.launcher = \"slurm\", or remove {key}"),
                ));
            }
            return Ok(ClusterSlurm::default());
        }
        let d = ClusterSlurm::default();
        // Each of these reaches sbatch's command line as one argument: no control characters.
        let word = |key: &str, v: &Option<String>, example: &str| -> R<Option<String>> {
            match v {
                Some(w) if w.trim().is_empty() || w.chars().any(|c| c.is_control() || c.is_whitespace()) => Err(self
                    .invalid(
                        key,
                        format!(
                            "{} is empty or contains a space or control character; e.g. {example}",
                            self.ctx.show(key, format!("{w:?}"))
                        ),
                    )),
                other => Ok(other.clone()),
            }
        };
        let nodes = self.int_in("cluster.nodes", raw.nodes.unwrap_or(1), 1, 65_536)? as u32;
        let partition = word("cluster.partition", &raw.partition, r#"partition = "gpu""#)?;
        let account = word("cluster.account", &raw.account, r#"account = "my-project""#)?;
        let time_limit = word("cluster.time_limit", &raw.time_limit, r#"time_limit = "4:00:00""#)?;
        let time_limit_s = match &time_limit {
            None => None,
            Some(t) => Some(slurm_time_s(t).ok_or_else(|| {
                self.invalid(
                    "cluster.time_limit",
                    format!(
                        "{} is not a Slurm time; valid forms: \"MINUTES\", \"MINUTES:SECONDS\", \"HOURS:MINUTES:SECONDS\", \
                         \"DAYS-HOURS\", \"DAYS-HOURS:MINUTES\", \"DAYS-HOURS:MINUTES:SECONDS\" (e.g. \"4:00:00\")",
                        self.ctx.show("cluster.time_limit", format!("{t:?}"))
                    ),
                )
            })?),
        };
        let grace_s = self.int_in("cluster.grace_s", raw.grace_s.unwrap_or(d.grace_s as i64), 0, 86_400)? as u64;
        if let Some(limit) = time_limit_s.filter(|limit| grace_s >= *limit) {
            return Err(self.invalid(
                "cluster.grace_s",
                format!(
                    "{} is not shorter than cluster.time_limit ({limit} s): the run would be told to stop as it starts; \
                     choose a grace below {limit}, or a longer time_limit",
                    self.ctx.show("cluster.grace_s", grace_s)
                ),
            ));
        }
        let sbatch_args = raw.sbatch_args.clone().unwrap_or_default();
        for (i, arg) in sbatch_args.iter().enumerate() {
            let key = format!("cluster.sbatch_args[{i}]");
            if !arg.starts_with('-') || arg.chars().any(char::is_control) {
                return Err(self.invalid(
                    "cluster.sbatch_args",
                    format!(
                        "{} is not an sbatch option; give each option as one string starting with '-', \
                         e.g. sbatch_args = [\"--gres=gpu:8\", \"--exclusive\"]",
                        self.ctx.show(&key, format!("{arg:?}"))
                    ),
                ));
            }
        }
        let slurm_job = match &raw.slurm_job {
            Some(j) if j.is_empty() || !j.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(self.invalid(
                    "cluster.slurm_job",
                    format!(
                        "{} is not a Slurm job id; give the allocation's number (squeue's JOBID), e.g. slurm_job = \"4711\"",
                        self.ctx.show("cluster.slurm_job", format!("{j:?}"))
                    ),
                ))
            }
            other => other.clone(),
        };
        Ok(ClusterSlurm { nodes, partition, time_limit, time_limit_s, account, sbatch_args, slurm_job, grace_s })
    }

    fn cluster_ssh(&self, raw: &RawCluster) -> R<ClusterSsh> {
        let d = ClusterSsh::default();
        // These reach a remote shell (quoted); control characters are refused outright.
        let path = |key: &str, v: &Option<String>, example: &str| -> R<Option<String>> {
            match v {
                Some(p) if p.trim().is_empty() || p.chars().any(char::is_control) => Err(self.invalid(
                    key,
                    format!(
                        "{} is empty or contains a control character (a newline?); give a path on the nodes, e.g. {example}",
                        self.ctx.show(key, format!("{p:?}"))
                    ),
                )),
                other => Ok(other.clone()),
            }
        };
        let secs = |key: &str, v: Option<i64>, default: u64| -> R<u64> {
            Ok(self.int_in(key, v.unwrap_or(default as i64), 1, 86_400)? as u64)
        };
        Ok(ClusterSsh {
            remote_dir: path("cluster.remote_dir", &raw.remote_dir, r#"remote_dir = ".flightdeck""#)?
                .unwrap_or(d.remote_dir),
            libtorch: path(
                "cluster.libtorch",
                &raw.libtorch,
                r#"libtorch = "/opt/libtorch/lib" or "/usr/bin/python3""#,
            )?,
            connect_timeout_s: secs("cluster.connect_timeout_s", raw.connect_timeout_s, d.connect_timeout_s)?,
            command_timeout_s: secs("cluster.command_timeout_s", raw.command_timeout_s, d.command_timeout_s)?,
            link_timeout_s: secs("cluster.link_timeout_s", raw.link_timeout_s, d.link_timeout_s)?,
            accept_new_host_keys: raw.accept_new_host_keys.unwrap_or(false),
            ssh_config: path("cluster.ssh_config", &raw.ssh_config, r#"ssh_config = "/home/me/.ssh/cluster_config""#)?,
        })
    }

    /// One fault table; `at` is its name in messages: `fault`, or `fault[1]` in a list.
    pub(super) fn fault(&self, at: &str, raw: RawFault, world: u32, train: &Train, trains: bool) -> R<Fault> {
        let key = |k: &str| format!("{at}.{k}");
        use FaultKind as F;
        let kinds = [
            ("none", F::None),
            ("hang-before-collective", F::HangBeforeCollective),
            ("hang-in-collective", F::HangInCollective),
            ("crash", F::Crash),
            ("mismatch", F::Mismatch),
            ("slow", F::Slow),
            ("hold-join", F::HoldJoin),
            ("nan", F::Nan),
        ];
        let kind = self.choice(&key("kind"), raw.kind, F::None, &kinds)?;
        let rank = self.int_in(&key("rank"), raw.rank.unwrap_or(0), 0, MAX_U32)? as u32;
        if rank >= world {
            return Err(self.invalid(
                &key("rank"),
                format!(
                "{} is not a rank of this run: the world size (parallel.data) is {world}, so choose {} from 0 to {}",
                self.ctx.show(&key("rank"), rank),
                key("rank"),
                world - 1
            ),
            ));
        }
        // Steps count from 1 (the first optimizer update), as `ids::Step` does.
        let step = self.int_in(&key("step"), raw.step.unwrap_or(1), 1, MAX_I64)? as u64;
        if trains && kind != F::None && step > train.steps {
            return Err(self.invalid(
                &key("step"),
                format!(
                    "{} is after the last step ({}), so the fault would never fire; choose {} from 1 to {}",
                    self.ctx.show(&key("step"), step),
                    self.ctx.show("train.steps", train.steps),
                    key("step"),
                    train.steps
                ),
            ));
        }
        let slow_pct = raw.slow_pct.unwrap_or(50.0);
        let valid = "a positive percentage (50 = the slow rank's steps take 1.5x as long)";
        let slow_pct = self.float(&key("slow_pct"), slow_pct, slow_pct > 0.0, valid)?;
        Ok(Fault { kind, rank, step, slow_pct })
    }
}

impl Check<'_> {
    pub(super) fn analysis(&self, raw: RawAnalysis) -> R<Analysis> {
        let d = Analysis::default();
        let floor = raw.hang_floor_s.unwrap_or(d.hang_floor_s);
        let floor = self.float("analysis.hang_floor_s", floor, floor > 0.0, "a positive number of seconds, e.g. 5")?;
        let k = raw.hang_k.unwrap_or(d.hang_k);
        let k = self.float("analysis.hang_k", k, k >= 1.0, "at least 1 (times the median step time), e.g. 10")?;
        let margin = raw.straggler_margin_pct.unwrap_or(d.straggler_margin_pct);
        let valid = "a positive percentage (25 = a quarter slower than the median)";
        let margin = self.float("analysis.straggler_margin_pct", margin, margin > 0.0, valid)?;
        let key = "analysis.straggler_window_steps";
        let window =
            self.int_in(key, raw.straggler_window_steps.unwrap_or(d.straggler_window_steps as i64), 1, MAX_I64)?;
        Ok(Analysis {
            hang_floor_s: floor,
            hang_k: k,
            straggler_margin_pct: margin,
            straggler_window_steps: window as u64,
        })
    }
}

/// Most restarts a lineage may take: past this a recipe is refused (a run that fails a hundred
/// times needs a person, not another restart).
const MAX_RESTARTS: i64 = 100;
/// The longest first backoff; it doubles per restart up to `recovery::BACKOFF_CAP_S`.
const MAX_BACKOFF_S: f64 = 600.0;

impl Check<'_> {
    pub(super) fn recovery(&self, raw: RawRecovery) -> R<Recovery> {
        let max = self.int_in("recovery.max_restarts", raw.max_restarts.unwrap_or(0), 0, MAX_RESTARTS)? as u32;
        let backoff = raw.backoff_s.unwrap_or(1.0);
        let valid = "seconds from 0 to 600 (the first restart's wait; each further one doubles)";
        let backoff_s = self.float("recovery.backoff_s", backoff, (0.0..=MAX_BACKOFF_S).contains(&backoff), valid)?;
        // Each cause may take every restart unless the recipe says fewer.
        let cause = |key: &str, v: Option<i64>| -> R<u32> {
            Ok(self.int_in(key, v.unwrap_or(max.into()), 0, max.into())? as u32)
        };
        let on_nan = self.choice(
            "recovery.on_nan",
            raw.on_nan,
            OnNan::Ignore,
            &[("ignore", OnNan::Ignore), ("stop", OnNan::Stop), ("restart", OnNan::Restart)],
        )?;
        if on_nan == OnNan::Restart && max == 0 {
            let message = format!(
                "{} restarts nothing while {}: set recovery.max_restarts to 1 or more, or on_nan = \"stop\"",
                self.ctx.show("recovery.on_nan", "\"restart\""),
                self.ctx.show("recovery.max_restarts", 0)
            );
            return Err(self.invalid("recovery.on_nan", message));
        }
        Ok(Recovery {
            max_restarts: max,
            backoff_s,
            crash: cause("recovery.crash", raw.crash)?,
            hang: cause("recovery.hang", raw.hang)?,
            node_lost: cause("recovery.node_lost", raw.node_lost)?,
            nan: cause("recovery.nan", raw.nan)?,
            on_nan,
        })
    }
}

/// Why a `cluster.hosts` entry cannot be an SSH destination (`[user@]host[:port]`), if it cannot.
fn host_problem(host: &str) -> Option<String> {
    if host.is_empty() {
        return Some("is empty".to_string());
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("contains whitespace or a control character".to_string());
    }
    let target = match host.split_once('@') {
        Some(("", _)) => return Some("has no user name before '@'".to_string()),
        Some((_, target)) => target,
        None => host,
    };
    let (name, port) = match target.strip_prefix('[') {
        // `[v6-address]:port`
        Some(bracketed) => match bracketed.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, rest)) => match rest.strip_prefix(':') {
                Some(port) => (addr, Some(port)),
                None => return Some("has text after ']' that is not :PORT".to_string()),
            },
            None => return Some("opens '[' without a closing ']'".to_string()),
        },
        // One colon separates a port; more make a bare IPv6 address.
        None => match target.split_once(':') {
            Some((name, port)) if !port.contains(':') => (name, Some(port)),
            _ => (target, None),
        },
    };
    if name.is_empty() {
        return Some("has no host name".to_string());
    }
    match port.map(str::parse::<u16>) {
        Some(Ok(0) | Err(_)) => Some("has a port that is not a number from 1 to 65535".to_string()),
        _ => None,
    }
}

/// Seconds in a Slurm time (`--time`): "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"; None
/// for anything else (and for 0, which is no limit to plan a warning before).
pub fn slurm_time_s(text: &str) -> Option<u64> {
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
    };
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, text),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Option<_>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86_400 + h * 3600,
        (Some(d), [h, m]) => d * 86_400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86_400 + h * 3600 + m * 60 + s,
        _ => return None,
    };
    (secs > 0).then_some(secs)
}
