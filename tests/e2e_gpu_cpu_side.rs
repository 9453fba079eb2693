//! The GPU path's CPU-side parts: doctor's GPU lines on a machine without a GPU, a CUDA recipe
//! refused with a clear reason where there is no CUDA, and scripts/gpu-check.sh's dry run.
mod common;
use common::*;
use std::process::Command;

#[test]
fn doctor_prints_cuda_nvml_and_nccl_lines_without_failing() {
    let db = Db::new();
    let out = db.run(&["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for check in ["torch-cuda", "cuda", "nvml", "nccl", "nccl-test"] {
        assert!(text.lines().any(|l| l.split_whitespace().next() == Some(check)), "no {check} line:\n{text}");
    }
    let cuda = text.lines().find(|l| l.starts_with("cuda ")).unwrap_or_default();
    if cuda.contains(" ok ") {
        common::skipped(file!(), &format!("the no-driver wording: this machine has a CUDA driver ({cuda})"));
    } else {
        assert!(cuda.contains("libcuda (the NVIDIA driver) could not be loaded: searched libcuda.so"), "{cuda}");
    }
}

#[test]
fn a_cuda_recipe_without_cuda_fails_naming_what_is_missing() {
    let db = Db::new();
    let doctor = String::from_utf8_lossy(&db.run(&["doctor"]).stdout).to_string();
    if doctor.lines().any(|l| l.starts_with("torch-cuda") && l.contains(" ok ")) {
        common::skipped(file!(), "this machine has a CUDA GPU, so the no-CUDA failure cannot be seen");
        return;
    }
    let out = db.run(&[
        "run",
        recipe("gpt-small-cuda.toml").to_str().unwrap(),
        "--headless",
        "--set",
        "train.steps=2",
        "--set",
        "train.warmup=0",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("rank 0 (local, pid") && stdout.contains("exit code 1"), "{stdout}{stderr}");
    // The rank says why on stderr, which lands in its log.
    let runs = std::fs::read_dir(db.path().join("runs")).unwrap();
    let run_dir = runs.map(|e| e.unwrap().path()).next().expect("one run directory");
    let log = std::fs::read_to_string(run_dir.join("logs/rank-0.log")).unwrap();
    assert!(log.contains("rank 0: cluster.device = \"cuda\": libtorch sees no CUDA device after loading"), "{log}");
    assert!(log.contains("libtorch_cuda.so"), "{log}");
    db.finish();
}

#[test]
fn gpu_check_script_parses_and_its_dry_run_prints_the_table() {
    let script = repo().join("scripts/gpu-check.sh");
    let syntax = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));

    // The dry run needs a Python with PyTorch: the one scripts/env.sh points at.
    let Some(python) = common::venv_python() else {
        common::skipped(file!(), "the dry run: FD_VENV is not set (source scripts/env.sh, or run through make test)");
        return;
    };
    let out = Command::new("bash")
        .arg(&script)
        .env("GPU_CHECK_DRY_RUN", "1")
        .env("GPU_CHECK_STEPS", "5")
        .env("FLIGHTDECK_BIN", bin())
        .env("PYTHON", &python)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let row = |name: &str| -> String {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name} ")))
            .unwrap_or_else(|| panic!("no {name} row:\n{stdout}"))
            .rsplit('|')
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(row("run"), "succeeded, 5 steps");
    assert_eq!(row("device"), "cpu");
    for number in ["flightdeck tokens/s", "eager tokens/s", "ratio flightdeck/eager", "flightdeck step ms"] {
        let v: f64 = row(number).parse().unwrap_or_else(|_| panic!("{number} is not a number:\n{stdout}"));
        assert!(v > 0.0, "{number} = {v}");
    }
    assert!(row("flightdeck MFU").starts_with("n/a"), "{stdout}");
    assert!(row("nvml samples in store").starts_with("0 gpu_util_pct points"), "{stdout}");
    assert!(row("nccl all-reduce, 1 rank").contains("skipped"), "{stdout}");
    // The table is the last thing printed.
    assert!(stdout.trim_end().lines().last().unwrap_or_default().starts_with("| ratio flightdeck/eager"), "{stdout}");
}
