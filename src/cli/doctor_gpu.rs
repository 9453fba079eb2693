//! `doctor`'s GPU lines: libtorch's CUDA support, the CUDA driver and its GPUs, NVML (with one
//! decoded sample per GPU), NCCL's version, and a single-rank all-reduce through the backend.
//!
//! Each line is (check name, ok, detail); none fails doctor, since CPU-only machines train too.
use crate::agent::{nvml, nvml_decode};
use crate::collective::nccl;

type Line = (&'static str, bool, String);

/// Elements of the NCCL self-test's all-reduce (64 MiB of f32): large enough for a bandwidth
/// figure, small enough to stay well under a second.
const SELF_TEST_ELEMENTS: usize = 16 << 20;

pub fn checks() -> Vec<Line> {
    let mut out = vec![torch_cuda()];
    let gpus = match nccl::driver_info() {
        Ok((version, names)) => {
            let detail = format!("CUDA driver API {version}; {} GPU(s): {}", names.len(), names.join(", "));
            out.push(("cuda", !names.is_empty(), detail));
            names.len()
        }
        Err(e) => {
            out.push(("cuda", false, format!("{e}: no GPU training here")));
            0
        }
    };
    out.extend(nvml_lines());
    let nccl_ok = match nccl::nccl_version() {
        Ok(v) => {
            let from = nccl::loadable_path("libnccl.so", "ncclGetVersion").unwrap_or_default();
            out.push(("nccl", true, format!("NCCL {v} ({from})")));
            true
        }
        Err(e) => {
            out.push(("nccl", false, format!("{e}: ring backend only")));
            false
        }
    };
    if nccl_ok && gpus > 0 {
        out.push(nccl_self_test());
    } else {
        out.push(("nccl-test", false, "skipped: needs NCCL and a CUDA GPU".into()));
    }
    out
}

#[cfg(feature = "torch")]
fn torch_cuda() -> Line {
    use crate::worker::cuda;
    match cuda::load_torch_cuda() {
        Ok(path) if tch::Cuda::is_available() => (
            "torch-cuda",
            true,
            format!(
                "{}: {} CUDA device(s), cuDNN {}",
                path.display(),
                tch::Cuda::device_count(),
                if tch::Cuda::cudnn_is_available() { "available" } else { "missing" }
            ),
        ),
        Ok(path) => ("torch-cuda", false, format!("{} loads, but libtorch sees no CUDA device", path.display())),
        Err(e) => ("torch-cuda", false, e.to_string()),
    }
}

#[cfg(not(feature = "torch"))]
fn torch_cuda() -> Line {
    ("torch-cuda", false, "built without the `torch` feature".into())
}

fn nvml_lines() -> Vec<Line> {
    let n = match crate::agent::nvml::open() {
        Ok(n) => n,
        Err(e) => return vec![("nvml", false, nvml::unavailable(&e))],
    };
    let (driver, version, cuda) = nvml::versions(&n);
    let cuda = cuda.map_or("?".into(), |v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    let mut reader = nvml::NvmlReader::new(&n);
    let readings = reader.read(crate::ids::unix_us());
    let mut out = vec![(
        "nvml",
        true,
        format!("NVML {version}, driver {driver} (CUDA {cuda}), {} GPU(s) sampled", readings.len()),
    )];
    for raw in &readings {
        let sample = nvml_decode::decode(None, raw, &[]);
        let fields = nvml_decode::fields_present(&sample).join(",");
        out.push(("gpu", true, format!("{} [fields: {fields}]", nvml_decode::render_text(&sample))));
    }
    out
}

fn nccl_self_test() -> Line {
    match nccl::self_test(0, SELF_TEST_ELEMENTS) {
        Ok((correct, ms, bytes)) => {
            let gbps = bytes as f64 / (ms / 1e3) / 1e9;
            let verdict = if correct { "correct" } else { "WRONG RESULT" };
            let detail = format!(
                "single-rank all-reduce of {} MiB on GPU 0: {verdict}, {ms:.3} ms (CUDA events), algbw {gbps:.1} GB/s",
                bytes >> 20
            );
            ("nccl-test", correct, detail)
        }
        Err(e) => ("nccl-test", false, format!("single-rank all-reduce failed: {e}")),
    }
}
