//! Telemetry client tests against a real Unix socket.
use super::*;
use crate::protocol::frame::read_frame;
use std::os::unix::net::UnixListener;

fn cfg(enabled: bool, step_interval: u64) -> crate::recipe::Telemetry {
    crate::recipe::Telemetry { step_interval, sample_interval_ms: 1000, enabled }
}

fn metrics(step: u64) -> StepMetrics {
    StepMetrics {
        step: Step(step),
        loss: f64::NAN,
        lr: 0.1,
        grad_norm: 1.0,
        tokens: 64,
        step_time_ms: 1.0,
        data_ms: 0.1,
        fwd_ms: 0.2,
        bwd_ms: 0.3,
        comm_ms: 0.0,
        opt_ms: 0.4,
        mem_rss_bytes: 1,
    }
}

/// Runs a client against a real socket and returns what the agent side read.
fn session(enabled: bool, body: impl FnOnce(&TelemetryTx)) -> (Hello, Vec<RankMsg>, TelemetryReport) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello: Hello = read_frame(&mut s).unwrap().unwrap();
        let mut msgs = Vec::new();
        while let Some(m) = read_frame::<RankMsg, _>(&mut s).unwrap() {
            msgs.push(m);
        }
        (hello, msgs)
    });
    let tel = Telemetry::connect(Some(&path), "node-a", Rank(3), &cfg(enabled, 2));
    body(tel.tx());
    let report = tel.finish(Some((4, 0.5)));
    let (hello, msgs) = reader.join().unwrap();
    (hello, msgs, report)
}

#[test]
fn frames_arrive_in_order_with_hello_register_and_finished() {
    let (hello, msgs, report) = session(true, |tx| {
        tx.phase(Step(1), Phase::Data);
        for s in 1..=4 {
            tx.step(&metrics(s), s == 3);
        }
    });
    assert_eq!((hello.role, hello.node.as_str()), (Role::Rank, "node-a"));
    assert_eq!(msgs[0], RankMsg::Register { rank: Rank(3), pid: std::process::id() });
    assert!(matches!(msgs[1], RankMsg::Phase { step: Step(1), phase: Phase::Data, .. }));
    let steps: Vec<u64> = msgs
        .iter()
        .filter_map(|m| match m {
            RankMsg::Step(s) => Some(s.step.0),
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec![2, 3, 4], "every 2nd step, and the one marked last");
    assert_eq!(msgs.last(), Some(&RankMsg::Finished { steps: 4, final_loss: 0.5 }));
    assert_eq!(report, TelemetryReport { sent: 6, dropped: 0, lost: 0 });
}

#[test]
fn disabled_telemetry_sends_only_register_and_finished() {
    let (_, msgs, _) = session(false, |tx| {
        tx.phase(Step(1), Phase::Fwd);
        tx.step(&metrics(2), true);
    });
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(matches!(msgs[0], RankMsg::Register { .. }));
    assert!(matches!(msgs[1], RankMsg::Finished { .. }));
}

#[test]
fn unreachable_socket_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tel = Telemetry::connect(Some(&dir.path().join("nobody")), "n", Rank(0), &cfg(true, 1));
    tel.tx().phase(Step(1), Phase::Data);
    tel.tx().flush(Duration::from_millis(10));
    assert_eq!(tel.finish(Some((1, 1.0))).sent, 0);
}
