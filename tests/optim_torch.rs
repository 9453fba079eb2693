//! The worker's flat AdamW and clipping against PyTorch's own `torch.optim.AdamW` and
//! `clip_grad_norm_` (the real package in `$FD_VENV`), step for step on the same values: decay
//! and no-decay groups, a warmup-shaped learning rate, gradients that clip and that do not.
mod common;

use flightdeck::worker::model::Param;
use flightdeck::worker::optim::AdamW;
use tch::{Kind, Tensor};

const SHAPES: [(&[i64], bool); 3] = [(&[8, 5], true), (&[5], false), (&[3, 4], true)];
const LRS: [f64; 6] = [1e-3, 2e-3, 3e-3, 3e-3, 2.5e-3, 1e-3];
const MAX_NORM: f64 = 1.0;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.95;
const WEIGHT_DECAY: f64 = 0.1;

/// Deterministic values in [-1, 1): parameter `i`'s start (`step` 0) or its gradient at `step`,
/// scaled by `scale` so some steps clip and some do not.
fn values(i: usize, step: usize, n: usize, scale: f64) -> Vec<f32> {
    (0..n).map(|j| ((((i * 7919 + step * 104_729 + j * 31) % 2003) as f64 / 1001.5 - 1.0) * scale) as f32).collect()
}

fn grad_scale(step: usize) -> f64 {
    if step.is_multiple_of(2) {
        0.05
    } else {
        2.0
    }
}

const PYTHON: &str = r#"
import json, sys, torch
spec = json.loads(sys.stdin.read())
params = [torch.tensor(p["start"], dtype=torch.float32).reshape(p["shape"]).requires_grad_() for p in spec["params"]]
groups = [
    {"params": [t for t, p in zip(params, spec["params"]) if p["decay"]], "weight_decay": spec["weight_decay"]},
    {"params": [t for t, p in zip(params, spec["params"]) if not p["decay"]], "weight_decay": 0.0},
]
opt = torch.optim.AdamW(groups, lr=spec["lrs"][0], betas=(spec["beta1"], spec["beta2"]), eps=1e-8)
norms = []
for step, lr in enumerate(spec["lrs"], start=1):
    opt.zero_grad()
    for t, p in zip(params, spec["params"]):
        t.grad = torch.tensor(p["grads"][step - 1], dtype=torch.float32).reshape(p["shape"])
    norms.append(float(torch.nn.utils.clip_grad_norm_(params, spec["max_norm"])))
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
print(json.dumps({"params": [t.detach().reshape(-1).tolist() for t in params], "norms": norms}))
"#;

/// `python -c script` with `input` on stdin; its stdout, or a panic with its stderr.
fn python_with_stdin(python: &std::path::Path, script: &str, input: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn flat_adamw_and_clipping_match_torch_optim_adamw() {
    let Some(python) = common::venv_python() else {
        common::skipped(file!(), "FD_VENV is not set (make test sets it): no PyTorch to compare with");
        return;
    };
    let numel = |shape: &[i64]| shape.iter().product::<i64>() as usize;
    let mut params: Vec<Param> = SHAPES
        .iter()
        .enumerate()
        .map(|(i, (shape, decay))| Param {
            name: format!("p{i}"),
            tensor: Tensor::from_slice(&values(i, 0, numel(shape), 1.0)).reshape(*shape).set_requires_grad(true),
            decay: *decay,
        })
        .collect();
    let spec = serde_json::json!({
        "params": SHAPES.iter().enumerate().map(|(i, (shape, decay))| serde_json::json!({
            "shape": shape,
            "decay": decay,
            "start": values(i, 0, numel(shape), 1.0),
            "grads": (1..=LRS.len()).map(|s| values(i, s, numel(shape), grad_scale(s))).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "lrs": LRS, "beta1": BETA1, "beta2": BETA2, "weight_decay": WEIGHT_DECAY, "max_norm": MAX_NORM,
    });

    let mut opt = AdamW::new(&mut params, BETA1, BETA2, WEIGHT_DECAY).unwrap();
    let mut norms = Vec::new();
    for (s, lr) in LRS.iter().enumerate().map(|(i, lr)| (i + 1, *lr)) {
        opt.zero_grad(&params).unwrap();
        for (i, p) in params.iter().enumerate() {
            // d/dp Σ p·g = g, accumulated by autograd as in training.
            let g = Tensor::from_slice(&values(i, s, p.tensor.numel(), grad_scale(s))).reshape(p.tensor.size());
            (&p.tensor * g).sum(Kind::Float).backward();
        }
        opt.gather_grads(&params).unwrap();
        norms.push(opt.clip_grad_norm(MAX_NORM).unwrap());
        opt.step(lr).unwrap();
    }

    let out = python_with_stdin(&python, PYTHON, &spec.to_string());
    let theirs: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-3);
    for (s, (ours, theirs)) in norms.iter().zip(theirs["norms"].as_array().unwrap()).enumerate() {
        let theirs = theirs.as_f64().unwrap();
        assert!(close(*ours, theirs), "step {}: grad norm {ours} vs torch's {theirs}", s + 1);
    }
    assert!(norms.iter().any(|n| *n > MAX_NORM) && norms.iter().any(|n| *n < MAX_NORM), "{norms:?}");
    for (i, p) in params.iter().enumerate() {
        let ours = Vec::<f32>::try_from(&p.tensor.detach().reshape([-1])).unwrap();
        let want = theirs["params"][i].as_array().unwrap();
        assert_eq!(ours.len(), want.len());
        for (j, (a, b)) in ours.iter().zip(want).enumerate() {
            let b = b.as_f64().unwrap();
            assert!(close(f64::from(*a), b), "parameter {i} element {j}: {a} vs torch's {b}");
        }
        // And the values moved: a test that compared unchanged starts would pass vacuously.
        assert_ne!(ours, values(i, 0, ours.len(), 1.0), "parameter {i} never moved");
    }
}
