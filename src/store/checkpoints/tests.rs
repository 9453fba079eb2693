//! The on-disk format without libtorch: commit, each corruption detected with its message,
//! pruning, and which checkpoint a resume chooses.
use super::commit::{commit, prune, CommitInfo};
use super::disk::*;
use super::*;

fn files(step: u64, world: u32) -> Vec<(String, Vec<u8>)> {
    let mut f = vec![
        (STATE.to_string(), format!("{{\"step\":{step}}}").into_bytes()),
        (MODEL.to_string(), vec![step as u8; 4096]),
        (OPTIM.to_string(), vec![(step as u8).wrapping_add(1); 8192]),
        (RECIPE.to_string(), b"{}".to_vec()),
    ];
    for r in 0..world {
        f.push((rank_file(r), format!("{{\"rank\":{r}}}").into_bytes()));
    }
    f
}

fn put(root: &Path, info: &CommitInfo, files: &[(String, Vec<u8>)]) -> Result<Manifest, super::commit::CommitError> {
    let views: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    commit(root, info, &views)
}

fn save(root: &Path, step: u64) -> Manifest {
    let info =
        CommitInfo { run: "r".into(), step, world_size: 2, loss: step as f64, saved_ms: 1, node: "local".into() };
    put(root, &info, &files(step, 2)).unwrap()
}

fn dir(root: &Path, step: u64) -> PathBuf {
    root.join(step_dir_name(step))
}

#[test]
fn a_committed_checkpoint_verifies_and_latest_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let m = save(tmp.path(), 10);
    assert_eq!(m.files.len(), 6);
    assert_eq!(m.bytes(), files(10, 2).iter().map(|(_, b)| b.len() as u64).sum::<u64>());
    assert_eq!(verify(&dir(tmp.path(), 10), 10, Depth::Sha256).unwrap(), m);
    assert_eq!(latest(tmp.path()), Some(10));
    save(tmp.path(), 20);
    assert_eq!(latest(tmp.path()), Some(20));
    assert_eq!(read_verified(&dir(tmp.path(), 20), &m_of(tmp.path(), 20), MODEL).unwrap(), vec![20u8; 4096]);
    // The same step twice is refused rather than silently replaced.
    let info = CommitInfo { run: "r".into(), step: 20, world_size: 2, loss: 0.0, saved_ms: 1, node: "local".into() };
    let err = put(tmp.path(), &info, &files(20, 2)).unwrap_err().to_string();
    assert!(err.contains("already committed"), "{err}");
}

fn m_of(root: &Path, step: u64) -> Manifest {
    read_manifest(&dir(root, step)).unwrap()
}

#[test]
fn each_corruption_is_detected_with_its_message() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for step in [1, 2, 3, 4, 5] {
        save(root, step);
    }
    // A flipped byte: sizes agree, only the hash can tell.
    let model = dir(root, 1).join(MODEL);
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&model, &bytes).unwrap();
    assert!(verify(&dir(root, 1), 1, Depth::Sizes).is_ok(), "a size check cannot see a flipped byte");
    let err = verify(&dir(root, 1), 1, Depth::Sha256).unwrap_err();
    assert!(matches!(err, Corrupt::Checksum { .. }), "{err:?}");
    assert!(err.to_string().contains("model.bin: sha256") && err.to_string().contains("changed after"), "{err}");
    // A missing file.
    std::fs::remove_file(dir(root, 2).join(OPTIM)).unwrap();
    let err = verify(&dir(root, 2), 2, Depth::Sizes).unwrap_err().to_string();
    assert_eq!(err, "optim.bin is missing");
    // No manifest.
    std::fs::remove_file(dir(root, 3).join(MANIFEST)).unwrap();
    let err = verify(&dir(root, 3), 3, Depth::Sha256).unwrap_err().to_string();
    assert!(err.starts_with("no MANIFEST.json: the save never committed"), "{err}");
    // A truncated file.
    std::fs::write(dir(root, 4).join(RECIPE), b"{").unwrap();
    let err = verify(&dir(root, 4), 4, Depth::Sizes).unwrap_err().to_string();
    assert_eq!(err, "recipe.json is 1 bytes, the manifest says 2");
    // A garbled manifest.
    std::fs::write(dir(root, 5).join(MANIFEST), b"{\"format\":").unwrap();
    let err = verify(&dir(root, 5), 5, Depth::Sizes).unwrap_err().to_string();
    assert!(err.starts_with("MANIFEST.json is unreadable"), "{err}");
}

#[test]
fn a_manifest_must_list_every_rank_and_name_only_plain_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let info = CommitInfo { run: "r".into(), step: 7, world_size: 3, loss: 0.0, saved_ms: 1, node: "local".into() };
    put(root, &info, &files(7, 2)).unwrap();
    let err = verify(&dir(root, 7), 7, Depth::Sizes).unwrap_err().to_string();
    assert_eq!(err, "the manifest does not list rank-2.json");
    let mut m = m_of(root, 7);
    m.world_size = 2;
    m.files.push(FileEntry { name: "../escape".into(), bytes: 0, sha256: String::new() });
    std::fs::write(dir(root, 7).join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
    let err = verify(&dir(root, 7), 7, Depth::Sizes).unwrap_err().to_string();
    assert!(err.contains("not a plain file name"), "{err}");
}

#[test]
fn prune_keeps_the_newest_committed_and_drops_older_torn_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for step in [10, 20, 30] {
        save(root, step);
    }
    // A torn step between committed ones (no manifest), and one corrupt by size.
    std::fs::create_dir(dir(root, 15)).unwrap();
    std::fs::write(dir(root, 15).join(MODEL), b"partial").unwrap();
    std::fs::remove_file(dir(root, 30).join(OPTIM)).unwrap();
    save(root, 40);
    assert_eq!(prune(root, 2).unwrap(), vec![10, 15]);
    let left: Vec<u64> = scan(root).unwrap().into_iter().map(|(s, _)| s).collect();
    // 30 is broken, so it does not count as kept: 20 and 40 are the two committed ones.
    assert_eq!(left, vec![20, 30, 40]);
    assert_eq!(prune(root, 2).unwrap(), Vec::<u64>::new());
}

#[test]
fn resume_takes_the_newest_verified_and_says_what_it_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    assert!(matches!(choose(root, None), Err(ChooseError::NoCheckpoints { .. })));
    for step in [10, 20, 30, 40] {
        save(root, step);
    }
    let c = choose(root, None).unwrap();
    assert_eq!((c.step, c.skipped.len()), (40, 0));
    let model = dir(root, 40).join(MODEL);
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[0] ^= 0x80;
    std::fs::write(&model, &bytes).unwrap();
    std::fs::remove_file(dir(root, 30).join(rank_file(1))).unwrap();
    std::fs::remove_file(dir(root, 20).join(MANIFEST)).unwrap();
    let c = choose(root, None).unwrap();
    assert_eq!(c.step, 10);
    let skipped: Vec<u64> = c.skipped.iter().map(|s| s.step).collect();
    assert_eq!(skipped, vec![40, 30, 20]);
    assert!(c.skipped[0].reason.contains("sha256"), "{:?}", c.skipped);
    assert_eq!(c.skipped[1].reason, "rank-1.json is missing");
    assert!(c.skipped[2].reason.contains("no MANIFEST.json"), "{:?}", c.skipped);
    // --step on a bad one is refused with the reason; on a missing one with what exists.
    let err = choose(root, Some(40)).unwrap_err().to_string();
    assert!(err.starts_with("checkpoint step 40 (") && err.contains("sha256"), "{err}");
    let err = choose(root, Some(25)).unwrap_err().to_string();
    assert!(err.contains("no checkpoint at step 25") && err.contains("10, 20, 30, 40"), "{err}");
    assert_eq!(choose(root, Some(10)).unwrap().step, 10);
    std::fs::remove_file(dir(root, 10).join(MANIFEST)).unwrap();
    let err = choose(root, None).unwrap_err().to_string();
    assert!(err.starts_with("no checkpoint in") && err.contains("step 10: no MANIFEST.json"), "{err}");
}

#[test]
fn inspect_merges_disk_and_store_and_marks_torn_and_gone_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let run = RunId("r".into());
    save(root, 10);
    std::fs::create_dir(dir(root, 20)).unwrap();
    let gone = CheckpointRecord {
        run: run.clone(),
        step: 5,
        path: "/nowhere/step-00000005".into(),
        bytes: 1,
        loss: Some(2.0),
        saved_ms: 1,
        blocking_ms: 0.5,
        write_ms: 3.0,
        verified: true,
        checked: "sha256".into(),
        checked_ms: 1,
        problem: None,
        nodes: Vec::new(),
    };
    let recs = inspect(&run, root, vec![gone], Depth::Sha256);
    let v: Vec<(u64, bool)> = recs.iter().map(|r| (r.step, r.verified)).collect();
    assert_eq!(v, vec![(5, false), (10, true), (20, false)]);
    assert!(recs[0].problem.as_deref().unwrap().contains("is gone"));
    assert_eq!(recs[1].loss, Some(10.0));
    assert!(recs[2].problem.as_deref().unwrap().contains("never committed"));
}

#[test]
fn a_run_without_checkpoints_is_told_why_it_has_none() {
    let early = why_none(10, 100, "/r/checkpoints");
    assert!(early.contains("stopped at step 10, before its first save at step 100"), "{early}");
    let never = why_none(10, 0, "/r/checkpoints");
    assert!(never.contains("checkpoint.every = 0 saves only on a graceful stop"), "{never}");
    let gone = why_none(300, 100, "/r/checkpoints");
    assert!(gone.contains("no checkpoints in /r/checkpoints") && gone.contains("removed"), "{gone}");
}

#[test]
fn a_save_that_fails_midway_removes_what_it_wrote_and_latest_stays() {
    let tmp = tempfile::tempdir().unwrap();
    save(tmp.path(), 10);
    // The third file cannot be created (as a full disk refuses the next write): the model and
    // optimizer files written before it must not stay behind.
    let mut broken = files(20, 2);
    broken.insert(2, ("no/such/dir/file".to_string(), b"x".to_vec()));
    let info = CommitInfo { run: "r".into(), step: 20, world_size: 2, loss: 0.0, saved_ms: 1, node: "local".into() };
    let err = put(tmp.path(), &info, &broken).unwrap_err().to_string();
    assert!(err.contains("no/such/dir/file") && err.contains("was removed"), "{err}");
    assert!(!dir(tmp.path(), 20).exists(), "the partial step directory is gone");
    assert_eq!(latest(tmp.path()), Some(10), "the last good checkpoint is still the latest");
}

#[test]
fn room_refuses_when_one_checkpoint_cannot_fit_and_warns_below_keep_plus_one() {
    let root = Path::new("/db/runs/r/checkpoints");
    let mb = 1u64 << 20;
    let none = super::room(4 * mb, 5 * mb, 3, root).unwrap_err();
    assert!(none.contains("no room for one checkpoint") && none.contains("/db/runs/r/checkpoints"), "{none}");
    let short = super::room(12 * mb, 5 * mb, 3, root).unwrap().expect("a warning");
    assert!(short.contains("checkpoint.keep = 3 needs about 20.0 MiB (4 saves"), "{short}");
    assert_eq!(super::room(20 * mb, 5 * mb, 3, root), Ok(None));
    assert!(super::free_bytes(&std::env::temp_dir().join("not/made/yet")).is_ok(), "the nearest ancestor counts");
}
