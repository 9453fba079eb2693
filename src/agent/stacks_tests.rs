//! Parsers on recorded tool output, grouping, and a live dump of a process this test starts.
use super::*;
use crate::protocol::stacks::group;

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stacks").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn names(t: &ThreadStack) -> Vec<&str> {
    t.frames.iter().map(|f| f.function.as_str()).collect()
}

#[test]
fn eu_stack_output_of_a_worker_parses_into_clean_frames() {
    let threads = parse_eu_stack(&fixture("eu-stack-worker.txt"));
    assert_eq!(threads.iter().map(|t| t.tid).collect::<Vec<_>>(), [30338, 30354]);
    let main = names(&threads[0]);
    assert_eq!(main[0], "__poll");
    assert_eq!(main[1], "flightdeck::collective::ring::Ring::run");
    assert_eq!(
        main[2],
        "<flightdeck::collective::recorder::FlightRecorder<C> as flightdeck::collective::Collective>::all_reduce_sum"
    );
    assert_eq!(main[3], "flightdeck::worker::train::train");
    assert!(main.iter().all(|f| !f.contains("::h") && !f.contains(".llvm.") && !f.contains('$')), "{main:?}");
    assert!(main.contains(&"std::rt::lang_start_internal"), "v0 symbols are demangled: {main:?}");
    assert_eq!(names(&threads[1])[4], "flightdeck::worker::telemetry::pump");
}

#[test]
fn gdb_output_parses_names_locations_and_thread_names() {
    let threads = parse_gdb(&fixture("gdb-worker.txt"));
    assert_eq!(threads.len(), 2);
    assert_eq!((threads[0].tid, threads[0].name.as_deref()), (30354, Some("telemetry")));
    let t = &threads[0].frames;
    assert_eq!(t[0].function, "syscall");
    assert_eq!(t[1].function, "std::sys::pal::unix::futex::futex_wait");
    assert_eq!(t[1].location.as_deref(), Some("library/std/src/sys/pal/unix/futex.rs:73"));
    assert_eq!(threads[1].frames[0].function, "mkl_blas_def_sgemm_mscale");
    assert_eq!(threads[1].frames[0].location, None);
}

#[test]
fn py_spy_output_parses_python_frames() {
    let text = "Process 4121: python train.py\nPython v3.11.2 (/usr/bin/python3.11)\n\n\
                Thread 0x7F3A2C1B4740 (active): \"MainThread\"\n    \
                all_reduce (torch/distributed/distributed_c10d.py:2501)\n    \
                train_step (train.py:88)\n    <module> (train.py:120)\n\
                Thread 0x7F3A1B7FE6C0 (idle): \"pin_memory\"\n    wait (threading.py:324)\n";
    let threads = parse_py_spy(text);
    assert_eq!(threads.len(), 2);
    assert_eq!(threads[0].name.as_deref(), Some("MainThread"));
    assert_eq!(names(&threads[0]), ["all_reduce", "train_step", "<module>"]);
    assert_eq!(threads[0].frames[1].location.as_deref(), Some("train.py:88"));
    // py-spy names threads by pthread id; the low 32 bits keep them apart within a process.
    assert_eq!(threads[0].tid, 0x2C1B4740);
    assert_eq!(parse_py_spy("Thread 4121 (idle)\n    f (a.py:1)\n")[0].tid, 4121);
}

#[test]
fn py_spy_native_frames_keep_their_library_and_lose_their_addresses() {
    // `py-spy dump --native --pid P` of `python -c "import time; time.sleep(30)"`, py-spy 0.4.
    let text = "Process 3228: python -c import time; time.sleep(30)\nPython v3.11.7 (/usr/bin/python3.11)\n\n\
                Thread 3228 (idle)\n    clock_nanosleep (libc.so.6)\n    time_sleep (libpython3.11.so.1.0)\n    \
                <module> (<string>:1)\n    0x7fd5f304524a (libc.so.6)\n";
    let threads = parse_py_spy(text);
    assert_eq!(names(&threads[0]), ["clock_nanosleep", "time_sleep", "<module>", "??"]);
    assert_eq!(threads[0].frames[0].location.as_deref(), Some("libc.so.6"));
    assert_eq!(threads[0].frames[3].location.as_deref(), Some("libc.so.6"));
    // A function whose name only starts like an address keeps it.
    assert_eq!(names(&parse_py_spy("Thread 1 (idle)\n    0xdeadline_fn (a.py:1)\n")[0]), ["0xdeadline_fn"]);
}

#[test]
fn rust_symbols_lose_their_hashes_and_escapes() {
    let legacy = "_ZN10flightdeck6worker5train5train17hc59b2d361a0581e3E";
    assert_eq!(clean_function(legacy), "flightdeck::worker::train::train");
    let llvm = "_ZN3std2rt10lang_start17h0123456789abcdefE.llvm.123";
    assert_eq!(clean_function(llvm), "std::rt::lang_start");
    let v0 = "_RNvNtCsjrHSEGnQ3l9_3std2rt19lang_start_internal";
    assert_eq!(clean_function(v0), "std::rt::lang_start_internal");
    assert_eq!(clean_function("at::native::cpublas::gemm(long)"), "at::native::cpublas::gemm(long)");
    assert_eq!(clean_function("__poll"), "__poll");
}

fn rank(rank: u32, top: &str) -> RankStacks {
    let frame = |f: &str| Frame { function: f.into(), location: None };
    RankStacks {
        rank,
        host: "local".into(),
        pid: 100 + rank,
        tool: Some(StackTool::EuStack),
        elapsed_ms: 5,
        threads: vec![ThreadStack { tid: 100 + rank, name: None, frames: vec![frame(top), frame("train")] }],
        error: None,
    }
}

#[test]
fn identical_stacks_group_and_the_odd_rank_stands_apart() {
    let mut failed = rank(4, "x");
    failed.threads.clear();
    failed.error = Some("gone".into());
    let (groups, failures) = group(&[rank(0, "poll"), rank(1, "park"), rank(2, "poll"), rank(3, "poll"), failed]);
    let ranks: Vec<Vec<u32>> = groups.iter().map(|g| g.ranks.clone()).collect();
    assert_eq!(ranks, [vec![0, 2, 3], vec![1]]);
    assert_eq!(groups[1].threads[0].frames[0].function, "park");
    assert_eq!(failures, [(4, "gone".to_string())]);
}

#[test]
fn a_helper_thread_only_one_rank_has_does_not_split_the_group() {
    let mut zero = rank(0, "poll");
    let frame = |f: &str| Frame { function: f.into(), location: None };
    zero.threads.push(ThreadStack { tid: 999, name: Some("ckpt-writer".into()), frames: vec![frame("recv")] });
    let (groups, _) = group(&[zero, rank(1, "park"), rank(2, "poll")]);
    let ranks: Vec<Vec<u32>> = groups.iter().map(|g| g.ranks.clone()).collect();
    assert_eq!(ranks, [vec![0, 2], vec![1]]);
}

#[tokio::test]
async fn a_live_process_is_dumped_in_a_moment_and_keeps_running() {
    if native_tools().is_empty() {
        println!("skipped: neither eu-stack nor gdb is installed (scripts/install-deps.sh installs them)");
        return;
    }
    let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
    wait_asleep_in_sleep(child.id());
    let got = dump(7, "local", child.id(), false).await;
    assert!(got.error.is_none(), "{got:?}");
    assert_eq!((got.rank, got.pid), (7, child.id()));
    assert!(!got.threads.is_empty());
    let all: Vec<&str> = got.threads.iter().flat_map(|t| t.frames.iter().map(|f| f.function.as_str())).collect();
    assert!(all.iter().any(|f| f.contains("nanosleep") || f.contains("clock_nanosleep")), "{all:?}");
    println!("{} dumped `sleep` in {} ms", got.tool.map_or("?", |t| t.name()), got.elapsed_ms);
    assert!(child.try_wait().expect("try_wait").is_none(), "the process survives its dump");
    child.kill().expect("kill");
    let _ = child.wait();
}

/// Waits until `pid` has exec'd `sleep` and sleeps in it: a dump right after spawn can catch
/// the child before exec or inside the dynamic loader (eu-stack: "Exec format error").
fn wait_asleep_in_sleep(pid: u32) {
    let asleep = || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state is the field after the parenthesised command name.
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        exe.file_name().is_some_and(|n| n == "sleep") && state == Some('S')
    };
    // Bounded: a child that never gets there fails the dump's assertions with their message.
    for _ in 0..10_000 {
        if asleep() {
            return;
        }
        std::thread::yield_now();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
