//! Pure decoding of raw NVML readings into `GpuSample`s and GPU events, and their text form.
//!
//! `nvml.rs` reads the hardware into `RawGpuReading` (NVML's own units, `None` where a query
//! failed); everything here is a pure function of those readings, so it is tested on recorded
//! readings (`tests/fixtures/nvml/`) on machines without a GPU.
use crate::ids::Rank;
use crate::protocol::{AgentEvent, GpuProcess, GpuSample, ThrottleReason};
use serde::{Deserialize, Serialize};

/// What NVML said about one GPU at one instant, in NVML's units.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RawGpuReading {
    /// When it was read (unix µs): rates from cumulative counters divide by its change.
    pub t_us: u64,
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_mw: Option<u32>,
    pub temp_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// `nvmlDeviceGetCurrentClocksEventReasons`' bit mask.
    pub clock_event_mask: Option<u64>,
    /// `nvmlDeviceGetPcieThroughput`: KiB/s over NVML's last 20 ms window.
    pub pcie_rx_kib_per_s: Option<u32>,
    pub pcie_tx_kib_per_s: Option<u32>,
    /// NVLink data counters (KiB since driver load), summed over the active links.
    pub nvlink_rx_kib: Option<u64>,
    pub nvlink_tx_kib: Option<u64>,
    /// GPM metrics over the interval since the previous reading (Hopper and newer).
    pub gpm_sm_util_pct: Option<f64>,
    pub gpm_tensor_util_pct: Option<f64>,
    /// Volatile ECC counts: single-bit (corrected) and double-bit (uncorrected).
    pub ecc_sbe: Option<u64>,
    pub ecc_dbe: Option<u64>,
    pub processes: Vec<RawProcess>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RawProcess {
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// An event from NVML's event set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawGpuEvent {
    Xid { index: u32, xid: u64 },
    SingleBitEcc { index: u32 },
    DoubleBitEcc { index: u32 },
}

/// NVML's clock event reason bits (nvml.h `nvmlClocksEventReason*`), in bit order.
const REASON_BITS: [(u64, ThrottleReason); 9] = [
    (0x1, ThrottleReason::GpuIdle),
    (0x2, ThrottleReason::ApplicationClocks),
    (0x4, ThrottleReason::SwPowerCap),
    (0x8, ThrottleReason::HwSlowdown),
    (0x10, ThrottleReason::SyncBoost),
    (0x20, ThrottleReason::SwThermal),
    (0x40, ThrottleReason::HwThermal),
    (0x80, ThrottleReason::HwPowerBrake),
    (0x100, ThrottleReason::DisplayClocks),
];

/// The reasons set in NVML's mask; unknown bits (newer drivers) are ignored.
pub fn throttle_reasons(mask: u64) -> Vec<ThrottleReason> {
    REASON_BITS.iter().filter(|(bit, _)| mask & bit != 0).map(|(_, r)| *r).collect()
}

/// Decodes `cur` (with `prev`, the same GPU's previous reading, for counter rates). `ranks`
/// maps our ranks' pids, so each process on the GPU is named by its rank where it is ours.
pub fn decode(prev: Option<&RawGpuReading>, cur: &RawGpuReading, ranks: &[(Rank, u32)]) -> GpuSample {
    let rate = |now: Option<u64>, before: Option<u64>| -> Option<u64> {
        let p = prev?;
        let dt_us = cur.t_us.checked_sub(p.t_us).filter(|dt| *dt > 0)?;
        // A counter that went backwards was reset (driver reload): no rate this time.
        let d_kib = now?.checked_sub(before?)?;
        Some((u128::from(d_kib) * 1024 * 1_000_000 / u128::from(dt_us)) as u64)
    };
    GpuSample {
        index: cur.index,
        name: cur.name.clone(),
        util_pct: cur.util_gpu_pct.map_or(0.0, f64::from),
        mem_used_bytes: cur.mem_used_bytes.unwrap_or(0),
        mem_total_bytes: cur.mem_total_bytes.unwrap_or(0),
        power_w: cur.power_mw.map_or(0.0, |mw| f64::from(mw) / 1000.0),
        temp_c: cur.temp_c.map_or(0.0, f64::from),
        uuid: cur.uuid.clone(),
        mem_util_pct: cur.util_mem_pct.map(f64::from),
        sm_active_pct: cur.gpm_sm_util_pct,
        tensor_active_pct: cur.gpm_tensor_util_pct,
        sm_clock_mhz: cur.sm_clock_mhz,
        mem_clock_mhz: cur.mem_clock_mhz,
        throttle: cur.clock_event_mask.map(throttle_reasons).unwrap_or_default(),
        pcie_rx_bytes_per_s: cur.pcie_rx_kib_per_s.map(|k| u64::from(k) * 1024),
        pcie_tx_bytes_per_s: cur.pcie_tx_kib_per_s.map(|k| u64::from(k) * 1024),
        nvlink_rx_bytes_per_s: rate(cur.nvlink_rx_kib, prev.and_then(|p| p.nvlink_rx_kib)),
        nvlink_tx_bytes_per_s: rate(cur.nvlink_tx_kib, prev.and_then(|p| p.nvlink_tx_kib)),
        ecc_corrected: cur.ecc_sbe,
        ecc_uncorrected: cur.ecc_dbe,
        processes: cur
            .processes
            .iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                rank: ranks.iter().find(|(_, pid)| *pid == p.pid).map(|(r, _)| *r),
                mem_used_bytes: p.used_bytes,
            })
            .collect(),
    }
}

/// A `GpuThrottle` event when the alarming reasons of a GPU differ from the previous sample's
/// (the first sample raises one only if something is already alarming).
pub fn throttle_change(prev: Option<&GpuSample>, cur: &GpuSample) -> Option<AgentEvent> {
    let alarming = |s: &GpuSample| s.throttle.iter().copied().filter(|r| r.is_alarming()).collect::<Vec<_>>();
    let now = alarming(cur);
    let before = prev.map(alarming).unwrap_or_default();
    (now != before).then_some(AgentEvent::GpuThrottle { index: cur.index, reasons: now })
}

pub fn decode_event(raw: &RawGpuEvent) -> AgentEvent {
    match *raw {
        RawGpuEvent::Xid { index, xid } => AgentEvent::GpuXid { index, xid },
        RawGpuEvent::SingleBitEcc { index } => AgentEvent::GpuEcc { index, uncorrected: false },
        RawGpuEvent::DoubleBitEcc { index } => AgentEvent::GpuEcc { index, uncorrected: true },
    }
}

/// One line per GPU, for `doctor` and logs: what a person reads first.
pub fn render_text(s: &GpuSample) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    let mut out = format!(
        "gpu{} {}: util {:.0}%, mem {:.1}/{:.1} GiB, {:.0} W, {:.0} C",
        s.index,
        s.name,
        s.util_pct,
        s.mem_used_bytes as f64 / GIB,
        s.mem_total_bytes as f64 / GIB,
        s.power_w,
        s.temp_c
    );
    if let Some(sm) = s.sm_active_pct {
        out += &format!(", sm active {sm:.0}%");
    }
    if let Some(tc) = s.tensor_active_pct {
        out += &format!(", tensor {tc:.0}%");
    }
    if let (Some(sm), Some(mem)) = (s.sm_clock_mhz, s.mem_clock_mhz) {
        out += &format!(", clocks {sm}/{mem} MHz");
    }
    let gbps = |b: u64| b as f64 / 1e9;
    if let (Some(rx), Some(tx)) = (s.pcie_rx_bytes_per_s, s.pcie_tx_bytes_per_s) {
        out += &format!(", pcie rx/tx {:.2}/{:.2} GB/s", gbps(rx), gbps(tx));
    }
    if let (Some(rx), Some(tx)) = (s.nvlink_rx_bytes_per_s, s.nvlink_tx_bytes_per_s) {
        out += &format!(", nvlink rx/tx {:.2}/{:.2} GB/s", gbps(rx), gbps(tx));
    }
    if !s.throttle.is_empty() {
        let names: Vec<&str> = s.throttle.iter().map(|r| r.name()).collect();
        out += &format!(", clocks held: {}", names.join("+"));
    }
    if let Some(dbe) = s.ecc_uncorrected.filter(|n| *n > 0) {
        out += &format!(", ECC uncorrected {dbe}");
    }
    for p in &s.processes {
        let who = p.rank.map_or(format!("pid {}", p.pid), |r| format!("rank {r} (pid {})", p.pid));
        let mem = p.mem_used_bytes.map_or(String::new(), |b| format!(" {:.1} GiB", b as f64 / GIB));
        out += &format!("; {who}{mem}");
    }
    out
}

/// The names of the optional fields a sample carries, for "fields seen" reports.
pub fn fields_present(s: &GpuSample) -> Vec<&'static str> {
    let mut f = vec!["util_pct", "mem_used_bytes", "power_w", "temp_c"];
    let opt = [
        ("mem_util_pct", s.mem_util_pct.is_some()),
        ("sm_active_pct", s.sm_active_pct.is_some()),
        ("tensor_active_pct", s.tensor_active_pct.is_some()),
        ("sm_clock_mhz", s.sm_clock_mhz.is_some()),
        ("mem_clock_mhz", s.mem_clock_mhz.is_some()),
        ("pcie_rx_bytes_per_s", s.pcie_rx_bytes_per_s.is_some()),
        ("nvlink_rx_bytes_per_s", s.nvlink_rx_bytes_per_s.is_some()),
        ("ecc_uncorrected", s.ecc_uncorrected.is_some()),
        ("processes", !s.processes.is_empty()),
    ];
    f.extend(opt.iter().filter(|(_, on)| *on).map(|(n, _)| *n));
    f
}

#[cfg(test)]
#[path = "nvml_decode_tests.rs"]
mod tests;
