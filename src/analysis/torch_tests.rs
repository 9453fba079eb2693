//! The torch verdicts over dumps recorded from the real PyTorch (tests/fixtures/torchfr).
use super::torch::judge;
use super::RankState;
use crate::protocol::VerdictKind;
use crate::torchfr::{parse, Frame, Snapshot};
use std::collections::BTreeMap;

fn ranks(case: &str, world: u32) -> BTreeMap<u32, RankState> {
    (0..world)
        .map(|k| {
            let path = format!("{}/tests/fixtures/torchfr/{case}/rank_{k}", env!("CARGO_MANIFEST_DIR"));
            let dump = parse(&std::fs::read(&path).expect("fixture"), &path).expect("parses");
            let r = RankState {
                host: "local".into(),
                pid: Some(100 + k),
                torch: Some(Snapshot { dump: dump.recent(4), main_stack: Vec::new() }),
                ..RankState::default()
            };
            (k, r)
        })
        .collect()
}

#[test]
fn a_rank_that_never_entered_the_all_reduce_is_named_with_group_seq_op_and_call_site() {
    let mut r = ranks("sleep", 2);
    // Where the shim saw rank 1's main thread: in the script's sleep.
    r.get_mut(&1).expect("rank 1").torch.as_mut().expect("dump").main_stack = vec![
        Frame { name: "rank_main".into(), file: "/w/make_dumps.py".into(), line: 70 },
        Frame { name: "<module>".into(), file: "/w/make_dumps.py".into(), line: 108 },
    ];
    let v = judge(&r, 1_000, 13_000).expect("a verdict");
    assert_eq!(v.kind, VerdictKind::NeverEntered, "{}", v.summary);
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![1]);
    assert_eq!(v.waiting, vec![0]);
    assert_eq!(v.collective.as_ref().map(|c| (c.seq, c.elements)), Some((8, 81)));
    for part in [
        "rank 1 (local, pid 101) never entered all_reduce of 81 Float elements ([[81]]) #8",
        "process group 0 (default_pg, ranks 0-1)",
        "called at make_dumps.py:82 (rank_main)",
        "rank 1 is at make_dumps.py:70 (rank_main)",
        "rank 0 waiting 12.0 s",
    ] {
        assert!(v.summary.contains(part), "{part:?} not in {:?}", v.summary);
    }
    assert!(v.culprits[0].detail.contains("its last was #7"), "{}", v.culprits[0].detail);
}

#[test]
fn a_different_size_at_the_same_seq_is_a_mismatch_naming_the_minority() {
    let v = judge(&ranks("size", 2), 0, 5_000).expect("a verdict");
    assert_eq!(v.kind, VerdictKind::Mismatch, "{}", v.summary);
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![1]);
    assert!(v.summary.contains("mismatch at #8 of process group 0"), "{}", v.summary);
    assert!(v.summary.contains("entered it as all_reduce of 5 Float elements ([[5]])"), "{}", v.summary);
    assert!(v.summary.contains("rank 0 as all_reduce of 81 Float elements"), "{}", v.summary);
    assert!(v.culprits[0].detail.contains("at make_dumps.py:"), "{}", v.culprits[0].detail);
}

#[test]
fn a_different_op_at_the_same_seq_is_a_mismatch() {
    let v = judge(&ranks("op", 2), 0, 5_000).expect("a verdict");
    assert_eq!(v.kind, VerdictKind::Mismatch, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, 1);
    assert!(v.summary.contains("entered it as broadcast of 73 Float elements"), "{}", v.summary);
}

#[test]
fn with_several_groups_the_idle_rank_of_the_smallest_stuck_group_is_the_culprit() {
    let v = judge(&ranks("groups", 4), 0, 5_000).expect("a verdict");
    assert_eq!(v.kind, VerdictKind::NeverEntered, "{}", v.summary);
    // Rank 2 is behind in the world group too, but it waits inside group 2's all-reduce.
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![3], "{}", v.summary);
    assert_eq!(v.waiting, vec![0, 1, 2], "every rank inside a collective is held up");
    assert!(v.summary.contains("#3 of process group 2 (ranks 2-3)"), "{}", v.summary);
    assert!(v.summary.contains("all_reduce of 4 Float elements"), "{}", v.summary);
}

#[test]
fn a_finished_run_or_no_dump_gives_no_torch_verdict() {
    assert!(judge(&ranks("healthy", 2), 0, 5_000).is_none());
    assert!(judge(&BTreeMap::new(), 0, 5_000).is_none());
}

#[test]
fn a_torch_job_that_hung_before_the_first_look_gets_no_start_up_slack_once_its_loop_repeats() {
    use super::Analyzer;
    use crate::protocol::AgentEvent;
    let cfg = super::tests::config();
    let ranks = ranks("sleep", 2);
    let mut a = Analyzer::new(cfg.clone(), 2, 1_000);
    // Rank 0 is inside all_reduce #8, which repeats the #7 it completed: past its start-up.
    let snapshot = Box::new(ranks[&0].torch.clone().expect("rank 0's dump"));
    a.observe(1_000, 0, &AgentEvent::TorchFlight { rank: crate::ids::Rank(0), snapshot });
    assert_eq!(a.hang_threshold_ms(), 5000, "the floor, not the start-up slack");
    // Only init collectives done and nothing open that repeats: still starting, slack applies.
    let mut b = Analyzer::new(cfg, 2, 1_000);
    let mut early = ranks[&1].torch.clone().expect("rank 1's dump");
    early.dump.entries.retain(|e| e.finished());
    b.observe(1_000, 0, &AgentEvent::TorchFlight { rank: crate::ids::Rank(1), snapshot: Box::new(early) });
    assert!(b.hang_threshold_ms() > 5000, "{}", b.hang_threshold_ms());
}
