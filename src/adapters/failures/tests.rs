//! The failure families against lines of their own, and random input against the multi-line states.
use super::*;
use proptest::strategy::Strategy;

fn read(text: &str) -> Vec<Record> {
    let mut f = Failures::default();
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        out.extend(f.push(i as u64 + 1, l).unwrap_or_default());
    }
    out.extend(f.finish());
    out
}

fn label<'a>(r: &'a Record, key: &str) -> Option<&'a Label> {
    r.label(key)
}

fn text(s: &str) -> Label {
    Label::Text(s.into())
}

/// One line alone: its records.
fn one(line: &str) -> Vec<Record> {
    read(line)
}

#[test]
fn each_family_reads_its_lines_into_the_named_event() {
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, Label)]);
    let cases: &[Case] = &[
        (
            "[PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.",
            "watchdog_exception",
            &[("rank", Label::Int(1)), ("pg_id", Label::Int(0)), ("pg_desc", text("default_pg")), ("seq", Label::Int(808)), ("last_completed", Label::Int(807))],
        ),
        (
            "[PG ID 2 PG GUID 9 Rank 4] Timeout at NCCL work: 610, last enqueued NCCL work: 616, last completed NCCL work: 609.",
            "nccl_timeout",
            &[("pg_rank", Label::Int(4)), ("pg_id", Label::Int(2)), ("last_enqueued", Label::Int(616))],
        ),
        ("[PG 0 Rank 25] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=2", "heartbeat_timeout", &[("work_list_size", Label::Int(2))]),
        ("[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.", "nccl_ops_failed", &[("rank", Label::Int(1))]),
        ("To avoid data inconsistency, we are taking the entire process down.", "process_teardown", &[]),
        ("node1:2840:2901 [0] misc/ibvwrap.cc:252 NCCL WARN Call to ibv_create_qp failed", "nccl_warn", &[("host", text("node1")), ("gpu", Label::Int(0)), ("reason", text("Call to ibv_create_qp failed"))]),
        ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:121, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.14.3", "nccl_error", &[("reason", text("unhandled cuda error")), ("nccl_version", text("2.14.3")), ("error", text("RuntimeError"))]),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error", &[("reason", text("an illegal memory access was encountered"))]),
        ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` failed.", "device_assert", &[("src_line", Label::Int(92)), ("func", text("operator()"))]),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "xid", &[("xid", Label::Int(79)), ("pid", Label::Int(1234)), ("pci", text("0000:3b:00"))]),
        ("srun: error: node01: task 3: Exited with exit code 1", "slurm_task_failed", &[("task", Label::Int(3)), ("exit_code", Label::Int(1)), ("host", text("node01"))]),
        ("slurmstepd: error: *** JOB 123 ON node01 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***", "slurm_cancelled", &[("job_id", Label::Int(123)), ("reason", text("TIME LIMIT"))]),
        ("slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of the step tasks have been OOM Killed.", "oom_kill", &[("step_id", text("123.0")), ("oom_kills", Label::Int(1))]),
        ("failed (exitcode: -6) local_rank: 3 (pid: 77) of binary: /usr/bin/python3", "elastic_worker_failed", &[("signal", Label::Int(6)), ("signal_name", text("SIGABRT")), ("local_rank", Label::Int(3))]),
        ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 4243 got signal: 15", "signal_exception", &[("pid", Label::Int(4243)), ("signal_name", text("SIGTERM"))]),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.1]:5643", "gloo_error", &[("peer", text("[10.0.0.1]:5643")), ("src_line", Label::Int(598))]),
        ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.", "store_timeout", &[("clients_joined", Label::Int(1)), ("clients_expected", Label::Int(2))]),
        ("terminate called after throwing an instance of 'c10::DistBackendError'", "cpp_exception", &[("error", text("c10::DistBackendError"))]),
    ];
    for (line, event, labels) in cases {
        let got = one(line);
        assert_eq!(got.len(), 1, "{line}: {got:?}");
        assert_eq!(label(&got[0], "event"), Some(&text(event)), "{line}");
        for (k, v) in labels.iter() {
            assert_eq!(label(&got[0], k), Some(v), "{line}: {k}");
        }
    }
}

#[test]
fn nccl_info_facts_are_of_kind_info_and_the_rest_is_kept_from_the_metric_adapters() {
    let got =
        one("node1:2840:2901 [0] NCCL INFO comm 0x55d3c1a0d8f0 rank 0 nranks 8 cudaDev 0 busId 18000 - Init COMPLETE");
    assert_eq!(got[0].kind, RecordKind::Info);
    assert!(got[0].failure(0).is_none(), "a fact is no failure");
    let mut f = Failures::default();
    assert_eq!(
        f.push(1, "node1:2840:2901 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1"),
        Some(Vec::new())
    );
}

#[test]
fn lines_that_only_mention_failures_give_nothing() {
    let prose = [
        "export NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=eth0",
        "Set TORCH_NCCL_ENABLE_MONITORING=0 to disable the heartbeat monitor if you suspect a false positive timeout.",
        "UserWarning: torch.distributed._all_gather_base is a private function and will be deprecated. Please use torch.distributed.all_gather_into_tensor instead.",
        "ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3, TORCH_NCCL_DUMP_ON_TIMEOUT: 1",
        "[PG ID 0 PG GUID 0(default_pg) Rank 0] NCCL Work update periodically: last enqueued NCCL work: 10, last completed NCCL work: 10.",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "timeout: 1800  # seconds before the watchdog aborts a collective",
        "[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
        "srun: job 4242 queued and waiting for resources",
        "*** Training finished ***",
        "If you see Xid errors in dmesg, reseat the GPU.",
        "KeyError: 'foo' is not raised here, this is a note",
        "Epoch 3: the loss had an error of 0.01",
        "Received a batch of 32 samples",
        "WARNING: the collective took 2 seconds, watch out",
        "torch.distributed.elastic.agent.server.api: [WARNING] Received 15 death signals so far",
        "Closing process group cleanly",
        "The above exception was the direct cause of the following exception:",
        "Set NCCL_DEBUG=WARN to see the NCCL WARN lines of the transport",
        "grep for NCCL INFO lines in the log to find the ring",
    ];
    for t in prose {
        assert!(one(t).is_empty(), "{t}: {:?}", one(t));
    }
}

#[test]
fn a_chained_traceback_is_one_record_whose_reason_is_the_last_exception() {
    let tb = "Traceback (most recent call last):\n  File \"/job/a.py\", line 3, in f\n    g()\nKeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"/job/a.py\", line 5, in f\n    raise ValueError('y')\nValueError: y\nstep 1 loss 2.0";
    let got = read(tb);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].line, 1);
    assert_eq!(got[0].end_line, Some(11));
    assert_eq!(label(&got[0], "error"), Some(&text("ValueError")));
    assert_eq!(label(&got[0], "src_line"), Some(&Label::Int(5)));
}

#[test]
fn the_line_that_ends_a_traceback_is_still_read_by_the_metric_adapters() {
    let mut reader = crate::adapters::LogReader::new(crate::adapters::Choice::Auto);
    let lines = [
        "Traceback (most recent call last):",
        "  File \"/job/a.py\", line 3, in f",
        "ValueError: boom",
        "iter 10: loss 9.3812, time 1201.33ms, mfu 30.12%",
    ];
    let mut got = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        got.extend(reader.push(i as u64 + 1, l.as_bytes()));
    }
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].label("event"), Some(&text("python_exception")));
    assert_eq!(got[1].step, Some(10));
}

#[test]
fn multi_line_states_are_bounded() {
    let mut f = Failures::default();
    assert!(f.push(1, "Traceback (most recent call last):").is_some());
    for n in 2..20_000u64 {
        let _ = f.push(n, "    x = compute()");
    }
    // Given up long before: an ordinary line is not the traceback's.
    assert_eq!(f.push(20_000, "iter 10: loss 9.3812"), None);
    assert!(f.push(20_001, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:").is_some());
    for n in 20_002..50_000u64 {
        let _ = f.push(n, "  time      : 2026-01-01_00:00:00");
    }
    assert_eq!(f.push(50_000, "iter 11: loss 9.3"), None);
}

proptest::proptest! {
    #[test]
    fn random_lines_through_the_multi_line_states_never_panic(
        lines in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::sample::select(vec![
                    "Traceback (most recent call last):",
                    "  File \"/job/x.py\", line 1, in f",
                    "    y()",
                    "During handling of the above exception, another exception occurred:",
                    "-- Process 0 terminated with the following error:",
                    "ValueError: v",
                    "ncclSystemError: System call failed. ",
                    "Last error:",
                    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                    "============================================================",
                    "------------------------------------------------------------",
                    "***************",
                    "[0]:",
                    "  rank      : 1 (local_rank: 1)",
                    "  exitcode  : -9 (pid: 1)",
                    "  traceback : Traceback (most recent call last):",
                    "Root Cause (first observed failure):",
                    "",
                ]).prop_map(str::to_string),
                "[ -~]{0,120}",
                "\\PC{0,40}",
            ],
            0..60,
        ),
    ) {
        let mut f = Failures::default();
        for (i, l) in lines.iter().enumerate() {
            let _ = f.push(i as u64 + 1, l);
            let _ = f.take_ready();
        }
        let _ = f.finish();
        for l in &lines {
            let _ = classify(1, l);
        }
    }
}

/// This thread's CPU time in ns (`/proc/thread-self/schedstat`): a loaded machine's waits left out.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn fixture_lines() -> Vec<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "log") {
                out.extend(std::fs::read_to_string(&p).unwrap().lines().map(str::to_string));
            }
        }
    }
    let mut lines = Vec::new();
    walk(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/logs")), &mut lines);
    lines
}

#[test]
#[ignore = "a measurement: cargo test --release -- --ignored failures_cost --nocapture"]
fn failures_cost() {
    let lines = fixture_lines();
    let n = 1_000_000;
    for round in 0..3 {
        let mut reader = crate::adapters::LogReader::new(crate::adapters::Choice::Auto);
        let t0 = cpu_ns();
        for i in 0..n {
            std::hint::black_box(reader.push(i as u64, lines[i % lines.len()].as_bytes()));
        }
        let all = (cpu_ns() - t0) as f64 / n as f64;
        let mut f = Failures::default();
        let t0 = cpu_ns();
        for i in 0..n {
            std::hint::black_box(f.push(i as u64, &lines[i % lines.len()]));
        }
        let ours = (cpu_ns() - t0) as f64 / n as f64;
        let t0 = cpu_ns();
        for i in 0..n {
            let l = std::hint::black_box(&lines[i % lines.len()]);
            std::hint::black_box(
                l.contains("ChildFailedError")
                    || l.contains("Watchdog caught collective operation timeout")
                    || l.contains("CUDA out of memory"),
            );
        }
        let three = (cpu_ns() - t0) as f64 / n as f64;
        println!("round {round}: reader {all:.0} ns/line ({:.0} lines/s CPU), failures {ours:.0} ns/line, the old three searches {three:.0} ns/line", 1e9 / all);
    }
}
