//! Samples each rank from procfs (CPU %, RSS) and each GPU from NVML, off the async thread.
use super::{lock, Input};
use crate::ids::Rank;
use crate::protocol::{AgentEvent, GpuSample};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Starts the sampling thread; it ends when the agent's input channel closes.
pub fn spawn(pids: Arc<Mutex<Vec<(Rank, u32)>>>, tx: mpsc::Sender<Input>, interval_ms: u64) {
    let interval = Duration::from_millis(interval_ms.max(100));
    std::thread::spawn(move || {
        let nvml = match nvml_wrapper::Nvml::init() {
            Ok(n) => Some(n),
            Err(e) => {
                let text = format!("no NVML ({e}): CPU-only sampling");
                if tx.blocking_send(Input::Event(AgentEvent::Notice { text })).is_err() {
                    return;
                }
                None
            }
        };
        let ticks_per_s = clock_ticks_per_s();
        let page_bytes = page_size_bytes();
        let mut last: HashMap<u32, (u64, Instant)> = HashMap::new();
        loop {
            std::thread::sleep(interval);
            let now = Instant::now();
            for (rank, pid) in lock(&pids).clone() {
                let Some(cpu_ticks) = proc_cpu_ticks(pid) else {
                    continue;
                };
                let rss_bytes = proc_rss_pages(pid).unwrap_or(0) * page_bytes;
                let cpu_pct = match last.insert(pid, (cpu_ticks, now)) {
                    Some((t0, i0)) => {
                        let wall_s = now.duration_since(i0).as_secs_f64().max(1e-3);
                        (cpu_ticks.saturating_sub(t0)) as f64 / ticks_per_s / wall_s * 100.0
                    }
                    None => continue,
                };
                if tx.blocking_send(Input::Event(AgentEvent::ProcSample { rank, cpu_pct, rss_bytes })).is_err() {
                    return;
                }
            }
            if let Some(nvml) = &nvml {
                for sample in gpu_samples(nvml) {
                    if tx.blocking_send(Input::Event(AgentEvent::GpuSample(sample))).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// utime + stime of a process, in clock ticks, from /proc/PID/stat.
pub fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// Fields after the command name (which may hold spaces and parentheses): utime is the 12th.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn proc_rss_pages(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    statm.split_whitespace().nth(1)?.parse().ok()
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

pub fn page_size_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// One sample per GPU; a field NVML cannot read is left at zero rather than failing the sample.
fn gpu_samples(nvml: &nvml_wrapper::Nvml) -> Vec<GpuSample> {
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            let mem = d.memory_info().ok();
            Some(GpuSample {
                index: i,
                name: d.name().unwrap_or_default(),
                util_pct: d.utilization_rates().map(|u| f64::from(u.gpu)).unwrap_or(0.0),
                mem_used_bytes: mem.as_ref().map(|m| m.used).unwrap_or(0),
                mem_total_bytes: mem.as_ref().map(|m| m.total).unwrap_or(0),
                power_w: d.power_usage().map(|mw| f64::from(mw) / 1000.0).unwrap_or(0.0),
                temp_c: d
                    .temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu)
                    .map(f64::from)
                    .unwrap_or(0.0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_ticks_with_a_tricky_command_name() {
        let stat = "4121 (fd (worker) 1) S 1 4121 4121 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(280));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn reads_this_process() {
        assert!(proc_cpu_ticks(std::process::id()).is_some());
        assert!(proc_rss_pages(std::process::id()).unwrap_or(0) > 0);
    }
}
