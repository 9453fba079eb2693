//! Samples each rank from procfs (CPU %, RSS) and each GPU from NVML, off the async thread.
use super::nvml::NvmlReader;
use super::nvml_decode::{decode, decode_event, throttle_change, RawGpuReading};
use super::Input;
use crate::ids::unix_us;
use crate::ids::Rank;
use crate::protocol::{AgentEvent, GpuSample};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The fastest sampling period: NVML's own counters update about every 100 ms, and sampling
/// many GPUs faster than this costs the node more than it tells.
pub const MIN_INTERVAL_MS: u64 = 250;

/// Starts the sampling thread; it ends when the agent's input channel closes.
pub fn spawn(pids: Arc<Mutex<Vec<(Rank, u32)>>>, tx: mpsc::Sender<Input>, interval_ms: u64) {
    let interval = Duration::from_millis(interval_ms.max(MIN_INTERVAL_MS));
    std::thread::spawn(move || {
        let nvml = match crate::agent::nvml::open() {
            Ok(n) => Some(n),
            Err(e) => {
                let text = super::nvml::unavailable(&e);
                if tx.blocking_send(Input::Event(AgentEvent::Notice { text })).is_err() {
                    return;
                }
                None
            }
        };
        let mut gpus = nvml.as_ref().map(GpuState::new);
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
            if let Some(gpus) = &mut gpus {
                let ranks = lock(&pids).clone();
                for event in gpus.tick(&ranks) {
                    if tx.blocking_send(Input::Event(event)).is_err() {
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

/// The NVML side of the sampler: handles, and each GPU's previous reading and sample (for
/// counter rates and throttle changes).
struct GpuState<'n> {
    reader: NvmlReader<'n>,
    prev_raw: Vec<Option<RawGpuReading>>,
    prev: Vec<Option<GpuSample>>,
}

impl<'n> GpuState<'n> {
    fn new(nvml: &'n nvml_wrapper::Nvml) -> GpuState<'n> {
        let reader = NvmlReader::new(nvml);
        let n = reader.gpu_count();
        GpuState { reader, prev_raw: vec![None; n], prev: vec![None; n] }
    }

    /// This tick's events: XID/ECC events first (they happened before the sample), then per GPU
    /// a throttle change if any, then its sample.
    fn tick(&mut self, ranks: &[(Rank, u32)]) -> Vec<AgentEvent> {
        let mut out: Vec<AgentEvent> = self.reader.drain_events().iter().map(decode_event).collect();
        for (i, raw) in self.reader.read(unix_us()).into_iter().enumerate() {
            let sample = decode(self.prev_raw[i].as_ref(), &raw, ranks);
            out.extend(throttle_change(self.prev[i].as_ref(), &sample));
            out.push(AgentEvent::GpuSample(Box::new(sample.clone())));
            self.prev_raw[i] = Some(raw);
            self.prev[i] = Some(sample);
        }
        out
    }
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
