//! torchrun's command line, finding its children in a fake /proc, its failure report and the tailed files.
use super::*;

fn spec(argv: &str, ranks: &[(u32, u32)], world: u32) -> AgentSpec {
    let text = format!("name = \"t\"\nkind = \"command\"\n[command]\nargv = {argv}\nlauncher = \"torchrun\"\n");
    AgentSpec {
        run: crate::ids::RunId("r-1".to_string()),
        node: "node-b".into(),
        ranks: ranks.iter().map(|(r, l)| (Rank(*r), *l)).collect(),
        world_size: world,
        master_addr: "10.0.0.1".into(),
        master_port: 4100,
        program_port: 4200,
        host_store: false,
        recipe: crate::recipe::parse_str(&text, "t.toml", &[]).expect("recipe"),
        exe: PathBuf::from("/bin/flightdeck"),
        stop_grace_ms: 1000,
        save_grace_ms: 1000,
        resume_from: None,
        init_from: None,
        secret: crate::collective::auth::RunSecret::generate().expect("secret"),
        listen_tcp: None,
    }
}

fn argv_of(spec: &AgentSpec) -> anyhow::Result<Vec<String>> {
    let paths = RunDirPaths::new(PathBuf::from("/db/runs/r-1"));
    argv(spec, &paths, &spec.recipe.command.as_ref().expect("command").argv)
}

#[test]
fn torchrun_gets_the_nodes_place_and_the_programs_port_from_the_spec() {
    let s = spec(r#"["/venv/bin/python", "train.py", "--lr", "3e-4"]"#, &[(2, 0), (3, 1)], 4);
    let want = [
        "/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=4200",
        "--rdzv-id=r-1",
        "--max-restarts=0",
        "--log-dir=/db/runs/r-1/torchrun",
        "--redirects=3",
        "train.py",
        "--lr",
        "3e-4",
    ];
    assert_eq!(argv_of(&s).expect("argv"), want);
    let s = spec(r#"["torchrun", "--monitor-interval=1", "t.py"]"#, &[(0, 0)], 1);
    let got = argv_of(&s).expect("argv");
    assert_eq!(got[..2], ["torchrun", "--nnodes=1"], "torchrun itself is not run through python -m");
    assert_eq!(got[got.len() - 2..], ["--monitor-interval=1", "t.py"], "the user's own options come after ours");
}

#[test]
fn ranks_torchrun_would_number_otherwise_are_refused() {
    let e = argv_of(&spec(r#"["python", "t.py"]"#, &[(1, 0), (2, 1)], 4)).expect_err("ranks 1-2 are no node");
    assert!(e.to_string().contains("node_rank × 2 + local_rank"), "{e}");
}

#[test]
fn parents_and_environments_are_read_as_proc_writes_them() {
    assert_eq!(parent_of("4243 (python3) S 4242 4243 4243 0 -1"), Some(4242));
    assert_eq!(parent_of("17 (a b) (c)) R 9 17 17"), Some(9), "a command with spaces and parentheses");
    assert_eq!(parent_of("garbage"), None);
    let environ = b"PATH=/bin\0LOCAL_RANK=1\0RANK=3\0GROUP_RANK=1\0";
    assert_eq!(env_value(environ, "RANK"), Some("3"));
    assert_eq!(env_value(environ, "LOCAL_RANK"), Some("1"));
    assert_eq!(env_value(environ, "MASTER_PORT"), None);
}

#[test]
fn only_torchruns_children_with_a_rank_are_found() {
    let proc = tempfile::tempdir().expect("tempdir");
    let process = |pid: u32, ppid: u32, environ: &[u8]| {
        let dir = proc.path().join(pid.to_string());
        std::fs::create_dir(&dir).expect("dir");
        std::fs::write(dir.join("stat"), format!("{pid} (python) S {ppid} {pid} {pid} 0")).expect("stat");
        std::fs::write(dir.join("environ"), environ).expect("environ");
    };
    process(100, 1, b"");
    process(101, 100, b"RANK=0\0LOCAL_RANK=0\0");
    process(102, 100, b"PATH=/bin\0");
    process(103, 77, b"RANK=1\0");
    process(104, 100, b"RANK=1\0");
    std::fs::create_dir(proc.path().join("self")).expect("not a pid");
    let mut found = children_with_rank(proc.path(), 100);
    found.sort();
    assert_eq!(found, [(101, 0), (104, 1)], "102 is between fork and exec, 103 is another parent's");
}

#[tokio::test]
async fn torchruns_failure_report_gives_each_named_ranks_status_and_passes_every_byte_on() {
    let text =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/logs/failures.log")).expect("fixture");
    let (write, mut read) = tokio::io::duplex(1 << 20);
    let failed = failed_ranks(&text[..], write).await;
    let statuses = BTreeMap::from([(2, ExitStatus::Code(1)), (3, ExitStatus::Signal(9))]);
    assert_eq!(failed, Failed { statuses, root: Some(2) }, "the root cause is printed last");
    let mut copied = Vec::new();
    read.read_to_end(&mut copied).await.expect("read");
    assert_eq!(copied, text);
}

#[tokio::test]
async fn a_closed_reader_never_stops_torchruns_stderr_from_being_read() {
    let (write, read) = tokio::io::duplex(16);
    drop(read);
    let big = vec![b'x'; 3 * MAX_LINE_BYTES];
    let failed = failed_ranks(&big[..], write).await;
    assert_eq!(failed, Failed::default());
}

#[tokio::test(start_paused = true)]
async fn a_tailed_file_is_read_as_it_grows_and_to_its_end_once_torchrun_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("stdout.log");
    std::fs::write(&path, b"one\n").expect("write");
    let (done_tx, done) = watch::channel(false);
    let (write, mut read) = tokio::io::duplex(1024);
    let task = tokio::spawn(tail(path.clone(), done, write));
    let mut got = vec![0u8; 4];
    read.read_exact(&mut got).await.expect("the first line");
    assert_eq!(got, b"one\n");
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
    std::io::Write::write_all(&mut file, b"two, without its newline").expect("append");
    done_tx.send(true).expect("the tail listens");
    task.await.expect("the tail ends");
    let mut rest = Vec::new();
    read.read_to_end(&mut rest).await.expect("read");
    assert_eq!(rest, b"two, without its newline");
}

#[test]
fn a_direct_rank_gets_its_nodes_place_as_group_rank() {
    let mut s = spec(r#"["python", "t.py"]"#, &[(2, 0), (3, 1)], 4);
    s.recipe.cluster.ranks_per_node = 2;
    assert_eq!((s.node_rank(), s.nodes()), (1, 2));
    s.ranks = vec![(Rank(0), 0), (Rank(1), 1)];
    assert_eq!(s.node_rank(), 0);
    // A last node with fewer ranks than the others is still counted.
    s.world_size = 5;
    assert_eq!(s.nodes(), 3);
}
