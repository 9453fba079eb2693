//! The cockpit model on two nodes' frames: per-node sequence filtering, no gap and no double.
use super::*;
use crate::ids::{Rank, RunId, Step};
use crate::protocol::{SeriesSnapshot, StepMetrics};
use crate::store::{Bucket, RunDetail, RunMeta, RunRecord, Summary};

/// Rank 0 on node 0, rank 1 on node 1; each node's agent numbers its frames from 1: the rank's
/// start, then one frame per step.
fn node_frames(rank: u32) -> Vec<AgentFrame> {
    let started =
        AgentEvent::RankStarted { rank: Rank(rank), local_rank: 0, pid: 100 + rank, host: format!("n{rank}") };
    let mut frames = vec![AgentFrame { seq: 1, t_ms: 1, event: started }];
    for step in 1..=5u64 {
        let m = StepMetrics { step: Step(step), loss: step as f64, ..Default::default() };
        let event = AgentEvent::Rank { rank: Rank(rank), msg: RankMsg::Step(m) };
        frames.push(AgentFrame { seq: step + 1, t_ms: step + 1, event });
    }
    frames
}

/// The store as the server read it: node 0 durable up to step 3, node 1 only up to step 1.
fn snapshot(frames: &[Vec<AgentFrame>], acked: [u64; 2]) -> RunSnapshot {
    let meta = RunMeta {
        name: "two".into(),
        recipe_name: "two".into(),
        recipe_path: "two.toml".into(),
        recipe_json: "{}".into(),
        world_size: 2,
        steps_planned: 5,
    };
    let hosts = vec!["n0".into(), "n1".into()];
    let mut run = RunRecord::starting(RunId("two".into()), meta, hosts, vec![], None);
    run.acked_seq = acked.to_vec();
    let mut state = RunState::new(run.clone(), vec![]);
    let mut events = Vec::new();
    let mut series = Vec::new();
    for (node, fs) in frames.iter().enumerate() {
        let mut buckets = Vec::new();
        for f in fs.iter().filter(|f| f.seq <= acked[node]) {
            events.extend(state.apply(f).events);
            if let AgentEvent::Rank { msg: RankMsg::Step(m), .. } = &f.event {
                let v = m.loss;
                buckets.push(Bucket { min: v, max: v, sum: v, count: 1, last_step: m.step.0, last: v });
            }
        }
        series.push(SeriesSnapshot { metric: "loss".into(), rank: node as u32, buckets });
    }
    let detail = RunDetail {
        run,
        ranks: state.ranks.clone(),
        events,
        metrics: vec!["loss".into()],
        summary: Summary::default(),
        verdicts: vec![],
        attempts: Vec::new(),
        goodput: None,
    };
    RunSnapshot { detail, series, collectives: vec![], logs: vec![] }
}

#[test]
fn each_nodes_frames_are_filtered_by_that_nodes_own_acked_sequence() {
    let frames = [node_frames(0), node_frames(1)];
    // Node 1 is behind node 0: a filter on node 0's number would drop node 1's steps 2 and 3.
    let mut m = RunModel::from_snapshot(&snapshot(&frames, [4, 2]));
    assert_eq!(m.snapshot_seq, [4, 2]);
    // The server subscribes before it reads the store, so the live stream repeats frames the
    // snapshot holds; both nodes' streams arrive interleaved.
    m.apply_frames(1, &frames[1]);
    m.apply_frames(0, &frames[0]);
    for rank in 0..2 {
        let steps: Vec<u64> = m.metrics["loss"].per_rank[rank].entries().iter().map(|e| e.step).collect();
        assert_eq!(steps, [1, 2, 3, 4, 5], "rank {rank}: every step once");
    }
    let counts: Vec<u64> = m.metrics["loss"].cross.entries().iter().map(|e| e.count).collect();
    assert_eq!(counts, [2, 2, 2, 2, 2], "each step has both ranks exactly once");
    let started = m.events.iter().filter(|e| e.kind == EventKind::RankStarted).count();
    assert_eq!(started, 2, "a start the snapshot held is not shown twice: {:?}", m.events);
    assert_eq!(m.state.record.step, 5);
}

#[test]
fn a_node_the_snapshot_did_not_know_has_every_frame_applied() {
    let frames = [node_frames(0), node_frames(1)];
    let mut snap = snapshot(&frames, [6, 0]);
    snap.detail.run.acked_seq.truncate(1);
    let mut m = RunModel::from_snapshot(&snap);
    m.apply_frames(1, &frames[1]);
    let steps: Vec<u64> = m.metrics["loss"].per_rank[1].entries().iter().map(|e| e.step).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5]);
}
