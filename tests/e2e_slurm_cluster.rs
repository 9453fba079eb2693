//! The fake Slurm cluster of tests/common/slurm.rs itself: it starts, runs steps and batch jobs
//! across its nodes, fakes a node death, scales to 128 nodes, and two clusters run side by side.
//! Slots 10 to 15 are this file's.
#[allow(dead_code)]
#[path = "common/slurm.rs"]
mod slurm;
use slurm::Cluster;
use std::collections::BTreeSet;
use std::process::Output;
use std::time::{Duration, Instant};

/// A command's stdout, after asserting it succeeded (its stderr in the message if not).
fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Submits `sbatch --parsable ARGS` and waits until squeue shows the job RUNNING; its id.
fn running_batch_job(c: &Cluster, args: &[&str]) -> String {
    let job = ok(&c.cmd("sbatch", &[&["--parsable"], args].concat())).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = ok(&c.cmd("squeue", &["-h", "-j", &job, "-o", "%T"])).trim().to_string();
        if state == "RUNNING" {
            return job;
        }
        assert!(Instant::now() < deadline, "job {job} is still {state:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until slurmctld no longer lists `job` (cancelled jobs pass through COMPLETING).
fn wait_job_gone(c: &Cluster, job: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.jobs().iter().any(|j| j == job) {
        assert!(Instant::now() < deadline, "job {job} is still listed: {:?}", c.jobs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn steps_span_nodes_and_batch_jobs_run_and_cancel() {
    let Some(c) = Cluster::start_or_skip("steps_span_nodes_and_batch_jobs_run_and_cancel", 4, 10) else { return };
    assert_eq!(c.node_names(), ["n1", "n2", "n3", "n4"]);
    assert_eq!(c.node_addr("n3"), "127.0.20.3");
    assert_eq!(c.node_state("n1"), "idle");

    let out = ok(&c.cmd("srun", &["-N2", "--ntasks-per-node=1", "-l", "hostname"]));
    let ranks: BTreeSet<&str> = out.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(ranks, ["0", "1"].into(), "{out}");

    // 8 ranks a node on a machine with fewer cores: the configured CPUs hold.
    let out = ok(&c.cmd("srun", &["-N4", "--ntasks-per-node=8", "printenv", "SLURMD_NODENAME"]));
    for node in c.node_names() {
        assert_eq!(out.lines().filter(|l| *l == node).count(), 8, "{out}");
    }

    let job = running_batch_job(&c, &["-N2", "--wrap", "sleep infinity"]);
    assert_eq!(c.jobs(), [job.as_str()]);
    // One of n1's 8 CPUs is taken: `mixed`, though 22.05's sinfo may go on showing `allocated` (its
    // cached per-node allocation is refreshed on whole-second timestamps).
    let state = c.node_state("n1");
    assert!(state == "mixed" || state == "allocated", "{state}");
    ok(&c.cmd("scancel", &[&job]));
    wait_job_gone(&c, &job);
    assert!(c.node_processes("n1").is_empty(), "{:?}", c.node_processes("n1"));
}

#[test]
fn a_killed_node_loses_its_processes_and_goes_down_then_comes_back() {
    let test = "a_killed_node_loses_its_processes_and_goes_down_then_comes_back";
    let Some(c) = Cluster::start_or_skip(test, 2, 12) else { return };
    let job = running_batch_job(&c, &["-N2", "--no-requeue", "--wrap", "srun sleep 600"]);
    // The step's task on n2 (the batch script itself runs on n1).
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.node_processes("n2").len() < 2 {
        assert!(Instant::now() < deadline, "no step on n2: {:?}", c.node_processes("n2"));
        std::thread::sleep(Duration::from_millis(100));
    }

    let began = Instant::now();
    c.kill_slurmd("n2");
    let killed = c.kill_node_processes("n2");
    assert!(killed >= 2, "a stepd and its sleep on n2; killed {killed}");
    assert!(c.node_processes("n2").is_empty());
    assert!(!c.node_processes("n1").is_empty(), "n1's share of the job is untouched");
    assert_eq!(c.kill_node_processes("n2"), 0);

    let state = c.wait_node_state("n2", Duration::from_secs(60), |s| s.starts_with("down")).unwrap();
    eprintln!("{test}: n2 {state} {} ms after its death", began.elapsed().as_millis());
    wait_job_gone(&c, &job);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.node_processes("n1").is_empty() {
        assert!(Instant::now() < deadline, "n1 still runs {:?}", c.node_processes("n1"));
        std::thread::sleep(Duration::from_millis(100));
    }

    c.restart_slurmd("n2");
    c.wait_node_state("n2", Duration::from_secs(60), |s| s == "idle").unwrap();
    ok(&c.cmd("srun", &["-N2", "true"]));
}

#[test]
fn a_128_node_cluster_is_idle_and_runs_a_step_on_every_node() {
    let began = Instant::now();
    let Some(c) = Cluster::start_or_skip("a_128_node_cluster_is_idle_and_runs_a_step_on_every_node", 128, 13) else {
        return;
    };
    let started = began.elapsed();
    assert_eq!(ok(&c.cmd("sinfo", &["-h", "-t", "idle", "-o", "%D"])).trim(), "128");

    let step = Instant::now();
    assert_eq!(ok(&c.cmd("srun", &["-N128", "hostname"])).lines().count(), 128);
    let out = ok(&c.cmd("srun", &["-N128", "printenv", "SLURMD_NODENAME"]));
    let nodes: BTreeSet<&str> = out.lines().collect();
    assert_eq!(nodes.len(), 128, "{out}");
    let steps = step.elapsed();
    let stop = Instant::now();
    drop(c);
    eprintln!(
        "128 nodes: idle after {} ms, two 128-node steps in {} ms, stopped in {} ms",
        started.as_millis(),
        steps.as_millis(),
        stop.elapsed().as_millis()
    );
}

#[test]
fn two_clusters_on_different_slots_run_side_by_side() {
    let test = "two_clusters_on_different_slots_run_side_by_side";
    // Once for the test, not once for each cluster.
    if slurm::skip(test) {
        return;
    }
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Cluster::start_or_skip(test, 2, 14));
        let b = s.spawn(|| Cluster::start_or_skip(test, 2, 15));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (Some(a), Some(b)) = (a, b) else { return };
    assert_ne!(a.conf(), b.conf());
    assert_eq!((a.node_addr("n1"), b.node_addr("n1")), ("127.0.24.1".to_string(), "127.0.25.1".to_string()));

    running_batch_job(&a, &["-N2", "-J", "in-a", "--wrap", "sleep infinity"]);
    assert_eq!(ok(&b.cmd("squeue", &["-h", "-o", "%j"])).trim(), "", "b sees a's job");
    running_batch_job(&b, &["-N1", "-J", "in-b", "--wrap", "sleep infinity"]);
    assert_eq!(ok(&a.cmd("squeue", &["-h", "-o", "%j"])).trim(), "in-a");
    assert_eq!(ok(&b.cmd("squeue", &["-h", "-o", "%j"])).trim(), "in-b");
    // Steps in both at once; each cluster's nodes answer only to it.
    std::thread::scope(|s| {
        for c in [&a, &b] {
            s.spawn(move || ok(&c.cmd("srun", &["-N2", "hostname"])));
        }
    });
}
