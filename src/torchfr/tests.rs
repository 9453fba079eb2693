//! The dumps in tests/fixtures/torchfr, recorded from the real PyTorch 2.11.0 on gloo by
//! tests/fixtures/torchfr/make_dumps.py.
use super::*;

pub fn fixture(case: &str, rank: u32) -> Dump {
    let path = format!("{}/tests/fixtures/torchfr/{case}/rank_{rank}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse(&bytes, &path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_gloo_dump_gives_its_groups_sequences_and_the_pending_all_reduce_with_its_call_site() {
    let d = fixture("sleep", 0);
    assert_eq!(d.version, "2.10");
    // Gloo's one config has no name: the group comes from the entries, its status by pg_id.
    let g = d.group("0").expect("the default group");
    assert_eq!((g.desc.as_str(), g.last_enqueued, g.last_completed), ("default_pg", 8, 7));
    assert!(g.ranks.is_empty(), "gloo's dump does not list the members: {g:?}");
    let pending: Vec<&Entry> = d.pending().collect();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let e = pending[0];
    assert_eq!(
        (e.seq, e.name.as_str(), e.op(), e.input_sizes.clone()),
        (8, "gloo:all_reduce", "all_reduce", vec![vec![81]])
    );
    assert_eq!((e.elements(), e.bytes(), e.collective_op()), (81, 324, Some(CollectiveOp::AllReduce)));
    assert_eq!(e.state, EntryState::Scheduled, "gloo never marks a state past scheduled");
    assert!(e.created_ns > 1_700_000_000_000_000_000, "epoch ns: {}", e.created_ns);
    // The frames start inside torch's backward; the call site is the script's line.
    assert!(!e.frames[0].is_user(), "{:?}", e.frames[0]);
    let site = e.call_site().expect("a frame of the script");
    assert_eq!((site.site().as_str(), site.name.as_str()), ("make_dumps.py:82", "rank_main"));
    assert_eq!(e.shape(), "all_reduce of 81 Float elements ([[81]])");
}

#[test]
fn the_rank_that_slept_shows_every_collective_retired_and_one_fewer_enqueued() {
    let d = fixture("sleep", 1);
    let g = d.group("0").expect("the default group");
    assert_eq!((g.last_enqueued, g.last_completed), (7, 7));
    assert_eq!(d.pending().count(), 0);
    let healthy = fixture("healthy", 1);
    assert!(healthy.entries.iter().all(|e| e.retired), "a finished run leaves nothing pending");
}

#[test]
fn the_json_variant_reads_the_same_sequences_without_frames() {
    let path = format!("{}/tests/fixtures/torchfr/sleep/rank_0.json", env!("CARGO_MANIFEST_DIR"));
    let json = parse(&std::fs::read(&path).expect("fixture"), &path).expect("parses");
    let pickle = fixture("sleep", 0);
    assert_eq!(json.groups, pickle.groups, "string statuses read as numbers");
    assert_eq!(json.entries.len(), pickle.entries.len());
    let (j, p) = (json.entries.last().expect("entries"), pickle.entries.last().expect("entries"));
    assert_eq!(
        (j.seq, &j.name, &j.input_sizes, j.retired, j.created_ns),
        (p.seq, &p.name, &p.input_sizes, p.retired, p.created_ns)
    );
    assert!(j.frames.is_empty() && j.duration_ms.is_none(), "0 in the JSON is no duration");
}

#[test]
fn several_groups_keep_their_own_sequences_under_the_names_every_member_shares() {
    // Rank 2 is in group "2" (its pg_id 1); rank 0 in group "1" (also its pg_id 1).
    let r2 = fixture("groups", 2);
    let tp = r2.group("2").expect("rank 2's tensor-parallel group");
    assert_eq!((tp.last_enqueued, tp.last_completed), (3, 2));
    assert!(r2.group("1").is_none(), "rank 2 is not in group 1");
    assert_eq!(r2.group("0").map(|g| (g.last_enqueued, g.last_completed)), Some((7, 7)));
    let r3 = fixture("groups", 3);
    assert_eq!(r3.group("2").map(|g| (g.last_enqueued, g.last_completed)), Some((2, 2)));
    let r0 = fixture("groups", 0);
    assert_eq!(r0.group("1").map(|g| (g.last_enqueued, g.last_completed)), Some((3, 3)));
    assert_eq!(r0.group("0").map(|g| g.last_enqueued), Some(8));
}

#[test]
fn recent_keeps_the_pending_and_the_last_entries_of_each_group() {
    let d = fixture("groups", 2);
    let r = d.recent(1);
    assert_eq!(r.groups, d.groups);
    let kept: Vec<(String, u64)> = r.entries.iter().map(|e| (e.group.clone(), e.seq)).collect();
    assert_eq!(kept, vec![("0".to_string(), 7), ("2".to_string(), 3)], "{kept:?}");
    assert!(d.entries.len() > r.entries.len());
}

#[test]
fn bad_bytes_name_the_input_and_what_a_dump_is() {
    for (bytes, want) in
        [(&b"\x80\x02}q\x00(X\x07"[..], "pickle"), (&b"{\"entries\": 7}"[..], "JSON"), (&b""[..], "pickle")]
    {
        let e = parse(bytes, "fr/shim_rank_3.pkl").expect_err("not a dump").to_string();
        assert!(e.starts_with("fr/shim_rank_3.pkl: not a flight-recorder dump"), "{e}");
        assert!(e.contains(want) && e.contains("_dump_fr_trace"), "{e}");
    }
    let bad = br#"{"pg_config": {"7": {"name": "7", "desc": "tp", "ranks": "0 and 1"}}}"#;
    let e = parse(bad, "dump.json").expect_err("bad ranks").to_string();
    assert!(e.contains("\"7\"") && e.contains("\"0 and 1\"") && e.contains("[0, 1]"), "{e}");
    let good = br#"{"pg_config": {"7": {"name": "7", "desc": "tp", "ranks": "[4, 5, 6, 7]"}}}"#;
    assert_eq!(parse(good, "dump.json").expect("parses").groups[0].ranks, vec![4, 5, 6, 7]);
}

#[test]
fn the_shims_stacks_give_the_main_threads_frames() {
    let json = br#"{"t_ms": 1, "pid": 9, "threads": [
        {"name": "flightdeck-shim", "id": 2, "main": false, "frames": [{"name": "run", "file": "/x/sitecustomize.py", "line": 3}]},
        {"name": "MainThread", "id": 1, "main": true, "frames": [{"name": "main", "file": "/w/torch_ddp.py", "line": 48}]}]}"#;
    let frames = parse_main_stack(json, "s.json").expect("parses");
    assert_eq!(frames, vec![Frame { name: "main".into(), file: "/w/torch_ddp.py".into(), line: 48 }]);
    let e = parse_main_stack(b"[1, 2]", "shim_rank_0.stacks.json").expect_err("not stacks").to_string();
    assert!(e.starts_with("shim_rank_0.stacks.json: not the shim's stacks"), "{e}");
}

#[test]
fn a_dump_without_entries_is_read_with_the_groups_its_ranks_earlier_dumps_named() {
    // The shim's status-only dump: `_dump_fr_trace(False, False)`, as gloo writes it.
    let status = br#"{"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[2]"}},
        "pg_status": {"0": {"last_enqueued_collective": 9, "last_completed_collective": 9},
                      "1": {"last_enqueued_collective": 5, "last_completed_collective": 4}}}"#;
    let alone = parse(status, "status").expect("a valid dump");
    assert!(alone.groups.is_empty(), "alone it names no group: {alone:?}");
    let path = format!("{}/tests/fixtures/torchfr/groups/rank_2", env!("CARGO_MANIFEST_DIR"));
    let mut ids = GroupIds::new();
    parse_with(&std::fs::read(&path).expect("fixture"), &path, &mut ids).expect("rank 2's full dump");
    let d = parse_with(status, "status", &mut ids).expect("a valid dump");
    assert!(d.entries.is_empty());
    let tp = d.group("2").expect("rank 2's pg_id 1 is group 2");
    assert_eq!((tp.last_enqueued, tp.last_completed), (5, 4));
    let world = d.group("0").expect("the default group");
    assert_eq!((world.last_enqueued, world.desc.as_str()), (9, "default_pg"));
}
