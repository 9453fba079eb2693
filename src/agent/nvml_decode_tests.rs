//! Decoding and rendering of recorded NVML readings (`tests/fixtures/nvml/`).
use super::*;
use crate::protocol::AgentEvent;

#[derive(serde::Deserialize)]
struct Recording {
    ranks: Vec<(u32, u32)>,
    readings: Vec<RawGpuReading>,
    events: Vec<RawGpuEvent>,
}

fn recording(name: &str) -> Recording {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvml").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ranks(r: &Recording) -> Vec<(Rank, u32)> {
    r.ranks.iter().map(|(rank, pid)| (Rank(*rank), *pid)).collect()
}

#[test]
fn h200_readings_decode_with_units_rates_and_ranks() {
    let rec = recording("h200-training.json");
    let ranks = ranks(&rec);
    let first = decode(None, &rec.readings[0], &ranks);
    assert_eq!((first.index, first.name.as_str()), (0, "NVIDIA H200"));
    assert_eq!((first.util_pct, first.mem_util_pct), (100.0, Some(54.0)));
    assert!((first.power_w - 612.345).abs() < 1e-9, "{}", first.power_w);
    assert_eq!((first.sm_clock_mhz, first.mem_clock_mhz), (Some(1980), Some(3201)));
    assert_eq!((first.sm_active_pct, first.tensor_active_pct), (Some(83.5), Some(41.25)));
    assert_eq!((first.pcie_rx_bytes_per_s, first.pcie_tx_bytes_per_s), (Some(2048 * 1024), Some(1024 * 1024)));
    // NVLink rates need two readings: none on the first.
    assert_eq!((first.nvlink_rx_bytes_per_s, first.nvlink_tx_bytes_per_s), (None, None));
    assert!(first.throttle.is_empty());
    assert_eq!(first.processes.len(), 2);
    assert_eq!(first.processes[0], GpuProcess { pid: 4121, rank: Some(Rank(0)), mem_used_bytes: Some(104152956928) });
    assert_eq!(first.processes[1], GpuProcess { pid: 999, rank: None, mem_used_bytes: None });

    let second = decode(Some(&rec.readings[0]), &rec.readings[1], &ranks);
    // 2.5e6 KiB in one second.
    assert_eq!(second.nvlink_rx_bytes_per_s, Some(2_500_000 * 1024));
    assert_eq!(second.nvlink_tx_bytes_per_s, Some(0));
    assert_eq!(second.throttle, [ThrottleReason::SwPowerCap, ThrottleReason::SwThermal]);
    assert_eq!((second.ecc_corrected, second.ecc_uncorrected), (Some(2), Some(1)));
}

#[test]
fn a_counter_that_went_backwards_gives_no_rate() {
    let rec = recording("h200-training.json");
    let rate = decode(Some(&rec.readings[1]), &rec.readings[0], &[]);
    assert_eq!(rate.nvlink_rx_bytes_per_s, None, "readings out of order: dt < 0 and counter < before");
}

#[test]
fn a_gpu_without_gpm_nvlink_or_ecc_reports_none_not_zero() {
    let rec = recording("l4-no-gpm.json");
    let s = decode(None, &rec.readings[0], &ranks(&rec));
    assert_eq!((s.index, s.name.as_str()), (1, "NVIDIA L4"));
    assert_eq!((s.sm_active_pct, s.tensor_active_pct, s.mem_util_pct), (None, None, None));
    assert_eq!((s.nvlink_rx_bytes_per_s, s.ecc_uncorrected), (None, None));
    assert_eq!(s.throttle, [ThrottleReason::GpuIdle]);
    assert_eq!(
        fields_present(&s),
        ["util_pct", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "pcie_rx_bytes_per_s"]
    );
    // Idle is not alarming: no event, even on the first sample.
    assert_eq!(throttle_change(None, &s), None);
}

#[test]
fn throttle_events_fire_on_alarming_changes_only() {
    let rec = recording("h200-training.json");
    let a = decode(None, &rec.readings[0], &[]);
    let b = decode(Some(&rec.readings[0]), &rec.readings[1], &[]);
    assert_eq!(
        throttle_change(Some(&a), &b),
        Some(AgentEvent::GpuThrottle { index: 0, reasons: vec![ThrottleReason::SwThermal] })
    );
    assert_eq!(throttle_change(Some(&b), &b), None, "unchanged: no event");
    assert_eq!(throttle_change(Some(&b), &a), Some(AgentEvent::GpuThrottle { index: 0, reasons: vec![] }), "cleared");
    // A power cap alone is shown in samples but raises nothing.
    let mut capped = a.clone();
    capped.throttle = throttle_reasons(0x4);
    assert_eq!(throttle_change(Some(&a), &capped), None);
    assert_eq!(throttle_reasons(0x1ff).len(), 9);
    assert_eq!(throttle_reasons(0x200), [], "unknown bits are ignored");
}

#[test]
fn recorded_events_decode_to_agent_events() {
    let rec = recording("h200-training.json");
    let got: Vec<AgentEvent> = rec.events.iter().map(decode_event).collect();
    assert_eq!(
        got,
        [
            AgentEvent::GpuXid { index: 0, xid: 79 },
            AgentEvent::GpuEcc { index: 0, uncorrected: true },
            AgentEvent::GpuEcc { index: 0, uncorrected: false },
        ]
    );
}

#[test]
fn text_form_reads_as_one_line() {
    let rec = recording("h200-training.json");
    let s = decode(Some(&rec.readings[0]), &rec.readings[1], &ranks(&rec));
    assert_eq!(
        render_text(&s),
        "gpu0 NVIDIA H200: util 99%, mem 98.0/140.4 GiB, 699 W, 87 C, sm active 80%, tensor 40%, \
         clocks 1755/3201 MHz, pcie rx/tx 0.00/0.00 GB/s, nvlink rx/tx 2.56/0.00 GB/s, \
         clocks held: sw-power-cap+sw-thermal, ECC uncorrected 1; rank 0 (pid 4121) 97.0 GiB"
    );
    let l4 = recording("l4-no-gpm.json");
    let s = decode(None, &l4.readings[0], &[]);
    assert_eq!(render_text(&s), "gpu1 NVIDIA L4: util 0%, mem 0.0/22.5 GiB, 16 W, 34 C, clocks 210/405 MHz, pcie rx/tx 0.00/0.00 GB/s, clocks held: idle");
}

#[test]
fn json_form_names_fields_with_units_and_round_trips() {
    let rec = recording("h200-training.json");
    let s = decode(Some(&rec.readings[0]), &rec.readings[1], &ranks(&rec));
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["sm_active_pct"], 80.0);
    assert_eq!(v["throttle"], serde_json::json!(["sw-power-cap", "sw-thermal"]));
    assert_eq!(v["processes"][0], serde_json::json!({"pid": 4121, "rank": 0, "mem_used_bytes": 104152956928u64}));
    assert_eq!(v["nvlink_rx_bytes_per_s"], 2_560_000_000u64);
    let back: GpuSample = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
    // The agent → server wire form (bincode) carries every field too.
    let bytes = bincode::serialize(&AgentEvent::GpuSample(Box::new(s.clone()))).unwrap();
    assert_eq!(bincode::deserialize::<AgentEvent>(&bytes).unwrap(), AgentEvent::GpuSample(Box::new(s)));
    // A JSON sample with only the old fields still reads (new fields default to unknown).
    let old: GpuSample = serde_json::from_str(r#"{"index":2,"name":"x","util_pct":5.0}"#).unwrap();
    assert_eq!((old.index, old.sm_active_pct, old.processes.len()), (2, None, 0));
}
