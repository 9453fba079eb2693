//! The agent's NVML reader: device handles acquired once, one raw reading per GPU per tick.
//!
//! Reading is all this file does; turning readings into messages is `nvml_decode` (pure, tested
//! on recorded readings). Every query may fail on some GPU or driver; a failed query leaves its
//! field `None`, it never fails the sample.
use super::nvml_decode::{RawGpuEvent, RawGpuReading, RawProcess};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml};

/// NVML_NVLINK_MAX_LINKS (nvml.h): H100/H200 SXM use 18.
const MAX_NVLINKS: u32 = 18;
/// nvml.h field ids: NVLink data throughput counters, KiB, one value per link (scopeId = link).
const FI_NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
const FI_NVLINK_THROUGHPUT_DATA_RX: u32 = 139;

struct Gpu<'n> {
    index: u32,
    device: Device<'n>,
    name: String,
    uuid: String,
    /// Links found active when the reader started (links do not come up mid-run).
    nvlinks: Vec<u32>,
    /// The previous GPM sample; GPM metrics are computed between two samples.
    gpm_prev: Option<GpmSample<'n>>,
    gpm: bool,
    events: Option<EventSet<'n>>,
}

pub struct NvmlReader<'n> {
    gpus: Vec<Gpu<'n>>,
    nvml: &'n Nvml,
}

impl<'n> NvmlReader<'n> {
    /// Acquires every GPU's handle (and its event set, NVLink list and GPM support) once.
    pub fn new(nvml: &'n Nvml) -> NvmlReader<'n> {
        let count = nvml.device_count().unwrap_or(0);
        let gpus = (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let nvlinks =
                    (0..MAX_NVLINKS).filter(|l| device.link_wrapper_for(*l).is_active().unwrap_or(false)).collect();
                let events = nvml.create_event_set().ok().and_then(|set| {
                    let kinds = EventTypes::CRITICAL_XID_ERROR
                        | EventTypes::SINGLE_BIT_ECC_ERROR
                        | EventTypes::DOUBLE_BIT_ECC_ERROR;
                    // ECC events are refused where ECC is off; XIDs alone are still worth having.
                    device.register_events(kinds, set).ok().or_else(|| {
                        let set = nvml.create_event_set().ok()?;
                        device.register_events(EventTypes::CRITICAL_XID_ERROR, set).ok()
                    })
                });
                Some(Gpu {
                    index,
                    name: device.name().unwrap_or_default(),
                    uuid: device.uuid().unwrap_or_default(),
                    nvlinks,
                    gpm_prev: None,
                    gpm: device.gpm_support().unwrap_or(false),
                    events,
                    device,
                })
            })
            .collect();
        NvmlReader { gpus, nvml }
    }

    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// One reading per GPU, stamped `t_us`.
    pub fn read(&mut self, t_us: u64) -> Vec<RawGpuReading> {
        let nvml = self.nvml;
        self.gpus.iter_mut().map(|g| read_one(nvml, g, t_us)).collect()
    }

    /// Every XID / ECC event NVML queued since the last call, without waiting.
    pub fn drain_events(&mut self) -> Vec<RawGpuEvent> {
        let mut out = Vec::new();
        for g in &self.gpus {
            let Some(set) = &g.events else { continue };
            // wait(0) returns Timeout once the queue is empty.
            while let Ok(e) = set.wait(0) {
                if e.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    let xid = match e.event_data {
                        Some(XidError::Value(v)) => v,
                        Some(XidError::Unknown) | None => 0,
                    };
                    out.push(RawGpuEvent::Xid { index: g.index, xid });
                }
                if e.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    out.push(RawGpuEvent::DoubleBitEcc { index: g.index });
                }
                if e.event_type.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
                    out.push(RawGpuEvent::SingleBitEcc { index: g.index });
                }
            }
        }
        out
    }
}

fn read_one<'n>(nvml: &'n Nvml, g: &mut Gpu<'n>, t_us: u64) -> RawGpuReading {
    let d = &g.device;
    let util = d.utilization_rates().ok();
    let mem = d.memory_info().ok();
    let (nvlink_rx_kib, nvlink_tx_kib) = nvlink_counters_kib(d, &g.nvlinks);
    let (gpm_sm_util_pct, gpm_tensor_util_pct) = if g.gpm { gpm_metrics(nvml, g) } else { (None, None) };
    let d = &g.device;
    RawGpuReading {
        t_us,
        index: g.index,
        name: g.name.clone(),
        uuid: g.uuid.clone(),
        util_gpu_pct: util.as_ref().map(|u| u.gpu),
        util_mem_pct: util.as_ref().map(|u| u.memory),
        mem_used_bytes: mem.as_ref().map(|m| m.used),
        mem_total_bytes: mem.as_ref().map(|m| m.total),
        power_mw: d.power_usage().ok(),
        temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
        sm_clock_mhz: d.clock_info(Clock::SM).ok(),
        mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
        clock_event_mask: d.current_throttle_reasons().ok().map(|r| r.bits()),
        pcie_rx_kib_per_s: d.pcie_throughput(PcieUtilCounter::Receive).ok(),
        pcie_tx_kib_per_s: d.pcie_throughput(PcieUtilCounter::Send).ok(),
        nvlink_rx_kib,
        nvlink_tx_kib,
        gpm_sm_util_pct,
        gpm_tensor_util_pct,
        ecc_sbe: d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile).ok(),
        ecc_dbe: d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
        processes: d
            .running_compute_processes()
            .map(|ps| {
                ps.into_iter()
                    .map(|p| RawProcess {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// SM and tensor activity between the previous GPM sample and a new one (None on the first
/// tick, and wherever GPM refuses).
fn gpm_metrics<'n>(nvml: &'n Nvml, g: &mut Gpu<'n>) -> (Option<f64>, Option<f64>) {
    let Ok(now) = g.device.gpm_sample() else { return (None, None) };
    let got = g.gpm_prev.as_ref().and_then(|prev| {
        let metrics = [GpmMetricId::SmUtil, GpmMetricId::AnyTensorUtil];
        nvml_wrapper::gpm::gpm_metrics_get(nvml, prev, &now, &metrics).ok()
    });
    g.gpm_prev = Some(now);
    let Some(results) = got else { return (None, None) };
    let value = |i: usize| results.get(i).and_then(|r| r.as_ref().ok()).map(|m| m.value);
    (value(0), value(1))
}

/// `nvmlFieldValue_t` (nvml.h); nvml-wrapper does not let us set `scopeId`, which NVLink
/// throughput fields need (one link per value).
#[repr(C)]
#[derive(Clone, Copy)]
struct FieldValue {
    field_id: u32,
    scope_id: u32,
    timestamp: i64,
    latency_us: i64,
    value_type: u32,
    nvml_return: u32,
    value: u64,
}

type GetFieldValues = unsafe extern "C" fn(*mut std::ffi::c_void, i32, *mut FieldValue) -> u32;

/// The NVLink data counters summed over `links` (KiB), or None where the driver refuses.
fn nvlink_counters_kib(d: &Device<'_>, links: &[u32]) -> (Option<u64>, Option<u64>) {
    if links.is_empty() {
        return (None, None);
    }
    let Some(get) = field_values_fn() else { return (None, None) };
    let mut values: Vec<FieldValue> = links
        .iter()
        .flat_map(|&l| [FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_THROUGHPUT_DATA_TX].map(|f| (f, l)))
        .map(|(field_id, scope_id)| FieldValue {
            field_id,
            scope_id,
            timestamp: 0,
            latency_us: 0,
            value_type: 0,
            nvml_return: 0,
            value: 0,
        })
        .collect();
    // SAFETY: the handle is live for the reader's lifetime; `values` holds `len` initialised
    // structs of nvml.h's layout, which NVML fills in place.
    let rc = unsafe { get(d.handle().cast(), values.len() as i32, values.as_mut_ptr()) };
    if rc != 0 {
        return (None, None);
    }
    let sum = |field: u32| -> Option<u64> {
        let of_field: Vec<&FieldValue> = values.iter().filter(|v| v.field_id == field).collect();
        // All links or nothing: a partial sum would read as a drop in throughput.
        of_field.iter().all(|v| v.nvml_return == 0).then(|| of_field.iter().map(|v| v.value).sum())
    };
    (sum(FI_NVLINK_THROUGHPUT_DATA_RX), sum(FI_NVLINK_THROUGHPUT_DATA_TX))
}

/// `nvmlDeviceGetFieldValues` from the NVML library nvml-wrapper already loaded.
fn field_values_fn() -> Option<GetFieldValues> {
    static FN: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let addr = FN.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only returns a handle to a library already in the process.
        unsafe {
            let h = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if h.is_null() {
                return None;
            }
            let f = libc::dlsym(h, c"nvmlDeviceGetFieldValues".as_ptr());
            (!f.is_null()).then_some(f as usize)
        }
    });
    // SAFETY: the symbol has this C signature in every NVML since 2016.
    addr.map(|a| unsafe { std::mem::transmute::<usize, GetFieldValues>(a) })
}

/// NVML's versions and this machine's GPUs, for `doctor`: (driver, NVML, CUDA driver API).
pub fn versions(nvml: &Nvml) -> (String, String, Option<i32>) {
    (
        nvml.sys_driver_version().unwrap_or_default(),
        nvml.sys_nvml_version().unwrap_or_default(),
        nvml.sys_cuda_driver_version().ok(),
    )
}

/// Why NVML is unavailable, worded for the once-only notice.
pub fn unavailable(e: &NvmlError) -> String {
    let also: Vec<String> = crate::tools::NVML_PLACES.iter().map(|p| p.to_string()).collect();
    format!("no NVML ({e}; searched libnvidia-ml.so.1 on the loader path, then {}): CPU-only sampling", also.join(", "))
}

/// NVML from the loader's path (`libnvidia-ml.so.1` by name), else from where drivers and
/// container runtimes put it off that path (`tools::nvml_candidates`). The loader's error if
/// neither loads.
pub fn open() -> Result<Nvml, NvmlError> {
    let by_name = Nvml::init();
    if by_name.is_ok() {
        return by_name;
    }
    crate::tools::nvml_candidates()
        .into_iter()
        .find_map(|p| Nvml::builder().lib_path(p.as_os_str()).init().ok())
        .map_or(by_name, Ok)
}
