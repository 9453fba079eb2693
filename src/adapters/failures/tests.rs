//! The failure families against lines of their own, and random input against the multi-line states.
use super::*;

fn read(text: &str) -> Vec<Record> {
    let mut f = Failures::default();
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        out.extend(f.push(i as u64 + 1, l).unwrap_or_default());
    }
    out.extend(f.finish());
    out
}

#[test]
fn smoke() {
    assert!(read("step 1 loss 2.0").is_empty());
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
            std::hint::black_box(l.contains("ChildFailedError") || l.contains("Watchdog caught collective operation timeout") || l.contains("CUDA out of memory"));
        }
        let three = (cpu_ns() - t0) as f64 / n as f64;
        println!("round {round}: reader {all:.0} ns/line ({:.0} lines/s CPU), failures {ours:.0} ns/line, the old three searches {three:.0} ns/line", 1e9 / all);
    }
}

#[test]
#[ignore = "a measurement: cargo test --release -- --ignored failures_cost_by_line --nocapture"]
fn failures_cost_by_line() {
    let lines = fixture_lines();
    let reps = 20_000;
    let mut costs: Vec<(f64, f64, String)> = lines
        .iter()
        .map(|l| {
            let t0 = cpu_ns();
            for i in 0..reps {
                std::hint::black_box(classify(i, std::hint::black_box(l)));
            }
            let c = (cpu_ns() - t0) as f64 / reps as f64;
            let t0 = cpu_ns();
            for _ in 0..reps {
                std::hint::black_box(Bytes::of(std::hint::black_box(l)));
            }
            let b = (cpu_ns() - t0) as f64 / reps as f64;
            (c, b, l.chars().take(100).collect())
        })
        .collect();
    let total: f64 = costs.iter().map(|c| c.0).sum();
    let bytes: f64 = costs.iter().map(|c| c.1).sum();
    costs.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("classify mean {:.0} ns, of which the byte pass {:.0} ns, over {} lines", total / costs.len() as f64, bytes / costs.len() as f64, costs.len());
    for (ns, b, l) in costs.iter().take(25) {
        println!("{ns:6.0} {b:4.0} ns  {l}");
    }
}
