//! The worker's CUDA seam: loads libtorch's CUDA half, picks this rank's GPU, bf16 autocast,
//! gradient averaging in device memory, and the end-of-run throughput line (with MFU).
//!
//! The binary links only libtorch_cpu (docs/decisions.md "Linking libtorch"); `init` dlopens
//! libtorch_cuda.so from the same directory before any CUDA use, which registers the CUDA
//! backend with the dispatcher, then LOCAL_RANK picks the device.
use super::group::StepCollective;
use super::train::TrainError;
use crate::collective::{DeviceBuf, DeviceDtype};
use crate::ids::Step;
use crate::protocol::message::StepMetrics;
use crate::recipe::{Dtype, Model};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tch::{Device, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("cannot find libtorch_cpu.so among this process's libraries (/proc/self/maps), so not where libtorch_cuda.so is")]
    NoTorchDir,
    #[error("cluster.device = \"cuda\": loading {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error(
        "cluster.device = \"cuda\": libtorch sees no CUDA device after loading {path} \
         (is the NVIDIA driver installed and a GPU visible? CUDA_VISIBLE_DEVICES = {visible:?})"
    )]
    NotAvailable { path: PathBuf, visible: String },
    #[error("LOCAL_RANK = {local_rank} has no GPU: {count} visible (one rank per GPU; lower ranks_per_node)")]
    NoGpu { local_rank: u32, count: i64 },
}

/// This process's training device, set once by `init` (CPU until then).
static DEVICE: OnceLock<Device> = OnceLock::new();

/// The device `train` places tensors on.
pub fn device() -> Device {
    DEVICE.get().copied().unwrap_or(Device::Cpu)
}

/// Loads libtorch's CUDA backend and selects GPU `local_rank`. Call before any CUDA use.
pub fn init(local_rank: u32) -> Result<Device, CudaError> {
    if let Some(d) = DEVICE.get() {
        return Ok(*d);
    }
    let path = load_torch_cuda()?;
    if !tch::Cuda::is_available() {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "(unset)".into());
        return Err(CudaError::NotAvailable { path, visible });
    }
    let count = tch::Cuda::device_count();
    if i64::from(local_rank) >= count {
        return Err(CudaError::NoGpu { local_rank, count });
    }
    // Fixed shapes every step: let cuDNN pick its fastest kernels once.
    tch::Cuda::cudnn_set_benchmark(true);
    let device = Device::Cuda(local_rank as usize);
    Ok(*DEVICE.get_or_init(|| device))
}

/// The directory of the libtorch_cpu.so this process runs, from /proc/self/maps.
pub fn torch_lib_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| Path::new(p).file_name().is_some_and(|f| f == "libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// dlopen(RTLD_NOW | RTLD_GLOBAL) of libtorch_cuda.so next to libtorch_cpu.so; its static
/// initialisers register CUDA with the dispatcher. Returns the path loaded.
pub fn load_torch_cuda() -> Result<PathBuf, CudaError> {
    let path = torch_lib_dir().ok_or(CudaError::NoTorchDir)?.join("libtorch_cuda.so");
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes())
        .map_err(|e| CudaError::Load { path: path.clone(), reason: e.to_string() })?;
    // SAFETY: dlopen with a valid path; the handle is kept for the process's life on purpose
    // (unloading a library that registered dispatcher kernels would leave dangling pointers).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns the last error as a C string (or null).
        let err = unsafe { libc::dlerror() };
        let reason = if err.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null dlerror strings are valid C strings until the next dl call.
            unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy().into_owned()
        };
        return Err(CudaError::Load { path, reason });
    }
    Ok(path)
}

/// `at::autocast::set_autocast_dtype(c10::DeviceType, c10::ScalarType)`, which tch does not bind
/// (its `autocast` uses the CUDA default, fp16). Looked up by its mangled name in libtorch_cpu.
type SetAutocastDtype = unsafe extern "C" fn(i8, i8);
const SET_AUTOCAST_DTYPE: &std::ffi::CStr = c"_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE";
/// c10::DeviceType::CUDA and c10::ScalarType::BFloat16 (c10/core/{DeviceType,ScalarType}.h).
const C10_CUDA: i8 = 1;
const C10_BFLOAT16: i8 = 15;

fn set_autocast_bf16() -> bool {
    static FN: OnceLock<Option<usize>> = OnceLock::new();
    let f = FN.get_or_init(|| {
        // SAFETY: dlsym on the global namespace with a valid C string.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SET_AUTOCAST_DTYPE.as_ptr()) };
        (!p.is_null()).then_some(p as usize)
    });
    match f {
        Some(addr) => {
            // SAFETY: the symbol is that C++ function; both enums are int8_t-based and passed as
            // integers in registers by the SysV ABI. The setting is thread-local, so this runs on
            // the training thread every time.
            unsafe { std::mem::transmute::<usize, SetAutocastDtype>(*addr)(C10_CUDA, C10_BFLOAT16) };
            true
        }
        None => false,
    }
}

/// Runs `f` (the forward pass) under bf16 autocast when the recipe asks for bf16 on CUDA;
/// otherwise runs it as is. Fails rather than silently running fp16 if bf16 cannot be set.
pub fn autocast<T>(
    device: Device,
    dtype: Dtype,
    f: impl FnOnce() -> Result<T, tch::TchError>,
) -> Result<T, TrainError> {
    if !(device.is_cuda() && dtype == Dtype::Bf16) {
        return Ok(f()?);
    }
    if !set_autocast_bf16() {
        return Err(TrainError::Recipe(format!(
            "train.dtype = \"bf16\": this libtorch has no {} to make autocast use bf16",
            SET_AUTOCAST_DTYPE.to_string_lossy()
        )));
    }
    Ok(tch::autocast(true, f)?)
}

/// Gradient averaging in device memory through the group's GPU all-reduce (NCCL), on the
/// optimizer's flat gradient (parameter order, on the device; autograd accumulates into it):
/// all-reduced in place `bucket_bytes` at a time (one flight record each), then divided by the
/// world size.
pub struct DeviceBuckets {
    bucket_elems: usize,
}

impl DeviceBuckets {
    pub fn new(parallel: &crate::recipe::Parallel) -> DeviceBuckets {
        DeviceBuckets { bucket_elems: (parallel.bucket_bytes as usize / 4).max(1) }
    }

    pub fn all_reduce_mean(
        &mut self,
        grads: &mut Tensor,
        group: &mut dyn StepCollective,
        step: Step,
    ) -> Result<(), TrainError> {
        let _no_grad = tch::no_grad_guard();
        let base = grads.data_ptr() as u64;
        let total = grads.numel();
        let mut off = 0;
        while off < total {
            let n = self.bucket_elems.min(total - off);
            let buf = DeviceBuf { ptr: base + (off * 4) as u64, elements: n, dtype: DeviceDtype::F32 };
            group.all_reduce_sum_device(buf).map_err(|source| TrainError::Collective { step: step.0, source })?;
            off += n;
        }
        let _ = grads.f_div_scalar_(f64::from(group.world_size()))?;
        Ok(())
    }
}

/// Collects step times and prints one throughput line at the end (the line
/// `scripts/gpu-check.sh` reads): median step, tokens/s and MFU where a peak is known.
pub struct Throughput {
    step_ms: Vec<f64>,
    tokens_per_step: u64,
}

impl Throughput {
    pub fn new() -> Throughput {
        Throughput { step_ms: Vec::new(), tokens_per_step: 0 }
    }

    pub fn add(&mut self, m: &StepMetrics) {
        self.step_ms.push(m.step_time_ms);
        self.tokens_per_step = m.tokens;
    }

    /// Median step time after warm-up (the first fifth of the steps, at least one when there
    /// are two or more: allocator growth and cuDNN autotuning land there).
    pub fn median_step_ms(&self) -> Option<f64> {
        let skip = (self.step_ms.len() / 5).max(usize::from(self.step_ms.len() > 1));
        let mut kept: Vec<f64> = self.step_ms[skip.min(self.step_ms.len())..].to_vec();
        kept.sort_by(f64::total_cmp);
        kept.get(kept.len() / 2).copied()
    }

    /// `rank R throughput: ...`; `gpu_name` picks the peak when none is configured.
    pub fn line(&self, rank: u32, model: &Model, gpu_name: &str, configured_peak: Option<f64>) -> String {
        let Some(ms) = self.median_step_ms() else { return format!("rank {rank} throughput: no steps") };
        let tokens_per_s = self.tokens_per_step as f64 / (ms / 1e3);
        let mfu = match crate::mfu::peak_tflops(configured_peak, gpu_name) {
            Some(peak) => {
                format!("{:.1}% of {peak} TFLOP/s", 100.0 * crate::mfu::mfu(model, tokens_per_s, peak))
            }
            None => "n/a (no known peak; set FLIGHTDECK_PEAK_TFLOPS)".into(),
        };
        format!(
            "rank {rank} throughput: step_ms {ms:.2} tokens_per_s {tokens_per_s:.0} mfu {mfu} on {gpu_name}; \
             {} params, {:.3e} FLOP/token, median of {} steps",
            crate::mfu::total_params(model),
            crate::mfu::flops_per_token(model),
            self.step_ms.len()
        )
    }
}

impl Default for Throughput {
    fn default() -> Self {
        Throughput::new()
    }
}

/// A GPU's name for MFU (from the CUDA driver), or "cpu".
pub fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => crate::collective::nccl::device_name(i as u32).unwrap_or_else(|e| format!("cuda:{i} ({e})")),
        _ => "cpu".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_cpu_is_found_in_this_process() {
        let dir = torch_lib_dir().expect("the test binary links libtorch_cpu");
        assert!(dir.join("libtorch_cpu.so").exists(), "{}", dir.display());
    }

    #[test]
    fn throughput_skips_warmup_and_reads_the_median() {
        let mut t = Throughput::new();
        for (i, ms) in [900.0, 100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 100.0, 100.0, 250.0].iter().enumerate() {
            t.add(&StepMetrics { step: Step(i as u64 + 1), step_time_ms: *ms, tokens: 2048, ..Default::default() });
        }
        assert_eq!(t.median_step_ms(), Some(100.0));
        let m = Model { n_layer: 12, n_head: 12, d_model: 768, context: 1024, vocab: 50304 };
        let line = t.line(0, &m, "NVIDIA H200", None);
        assert!(line.starts_with("rank 0 throughput: step_ms 100.00 tokens_per_s 20480 mfu "), "{line}");
        assert!(line.contains("of 989.4 TFLOP/s on NVIDIA H200"), "{line}");
        assert!(t.line(0, &m, "cpu", None).contains("mfu n/a"));
        assert_eq!(Throughput::new().line(3, &m, "cpu", None), "rank 3 throughput: no steps");
    }

    #[test]
    fn autocast_is_a_no_op_off_cuda() {
        let got = autocast(Device::Cpu, Dtype::Bf16, || Tensor::f_ones([2], (tch::Kind::Float, Device::Cpu))).unwrap();
        assert_eq!(got.kind(), tch::Kind::Float);
    }

    #[test]
    fn the_bf16_autocast_setter_is_in_this_libtorch() {
        // Without it bf16 training would fail up front on the GPU; check it here, on CPU.
        assert!(set_autocast_bf16(), "{SET_AUTOCAST_DTYPE:?} not found in libtorch_cpu");
    }
}
