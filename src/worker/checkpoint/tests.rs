//! In-process checkpoint tests on one rank: save and resume bit for bit, graceful stop, and the
//! refusals of a restore that would not be exact.
use super::*;
use crate::collective::solo::Solo;
use crate::worker::telemetry::Telemetry;
use crate::worker::testing::recipe;
use crate::worker::train::{train_session, Session, TrainOutcome};

fn plan(root: &Path, r: &Recipe) -> Plan {
    Plan {
        root: root.to_path_buf(),
        every: r.checkpoint.every,
        keep: r.checkpoint.keep,
        run: "test".into(),
        recipe_json: serde_json::to_vec(r).unwrap(),
        writes: true,
        node: "local".into(),
    }
}

/// Trains with checkpoints under `root`; returns (step, loss) of every step and the outcome.
fn run(r: &Recipe, root: &Path, resume: Option<PathBuf>, stop_at: Option<u64>) -> (Vec<(u64, f64)>, TrainOutcome) {
    let tel = Telemetry::disabled();
    let flag = AtomicBool::new(false);
    let mut seen = Vec::new();
    let session = Session { plan: Some(plan(root, r)), resume_from: resume, init_from: None, stop: &flag };
    let out = train_session(
        r,
        &mut Solo,
        tel.tx(),
        &mut |m| {
            seen.push((m.step.0, m.loss));
            if Some(m.step.0) == stop_at {
                flag.store(true, Ordering::SeqCst);
            }
        },
        session,
    )
    .unwrap();
    (seen, out)
}

fn bits(v: &[(u64, f64)]) -> Vec<(u64, u64)> {
    v.iter().map(|(s, l)| (*s, l.to_bits())).collect()
}

#[test]
fn resume_from_a_checkpoint_repeats_the_straight_run_bit_for_bit() {
    let mut r = recipe(1, 4, 24);
    (r.checkpoint.every, r.checkpoint.keep) = (8, 3);
    let straight = tempfile::tempdir().unwrap();
    let (all, out) = run(&r, straight.path(), None, None);
    assert_eq!((all.len(), out.steps, out.stopped), (24, 24, false));
    let saved: Vec<u64> = disk::scan(straight.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(saved, vec![8, 16, 24]);
    assert_eq!(disk::latest(straight.path()), Some(24));

    let child = tempfile::tempdir().unwrap();
    let from = straight.path().join(disk::step_dir_name(8));
    let (resumed, out) = run(&r, child.path(), Some(from), None);
    assert_eq!(resumed.first().map(|x| x.0), Some(9));
    assert_eq!(bits(&resumed), bits(&all[8..]), "steps 9..=24 must match by bits");
    assert_eq!(out.final_loss.to_bits(), all[23].1.to_bits());
    // The child saves its own checkpoints from where it took over.
    let saved: Vec<u64> = disk::scan(child.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(saved, vec![16, 24]);
}

#[test]
fn a_stop_request_ends_after_the_step_and_saves_it() {
    let mut r = recipe(1, 2, 50);
    r.checkpoint.every = 0;
    let tmp = tempfile::tempdir().unwrap();
    let (seen, out) = run(&r, tmp.path(), None, Some(5));
    assert_eq!((seen.len(), out.steps, out.stopped), (5, 5, true));
    let m = disk::verify(&tmp.path().join(disk::step_dir_name(5)), 5, Depth::Sha256).unwrap();
    assert_eq!((m.step, m.world_size), (5, 1));
    // The manifest's loss is informational (it went through JSON): equal to within an ulp.
    assert!((m.loss - seen[4].1).abs() <= 1e-12 * seen[4].1.abs(), "{} vs {}", m.loss, seen[4].1);
    let rank: RankState = serde_json::from_slice(
        &disk::read_verified(&tmp.path().join(disk::step_dir_name(5)), &m, &disk::rank_file(0)).unwrap(),
    )
    .unwrap();
    assert_eq!((rank.step, rank.data_position), (5, 5 * 2));
}

#[test]
fn resuming_at_the_last_step_trains_nothing_and_is_refused() {
    let mut r = recipe(1, 2, 6);
    r.checkpoint.every = 6;
    let tmp = tempfile::tempdir().unwrap();
    run(&r, tmp.path(), None, None);
    let tel = Telemetry::disabled();
    let flag = AtomicBool::new(false);
    let from = tmp.path().join(disk::step_dir_name(6));
    let session = Session { plan: None, resume_from: Some(from), init_from: None, stop: &flag };
    let err = train_session(&r, &mut Solo, tel.tx(), &mut |_| {}, session).err().unwrap().to_string();
    assert!(err.contains("nothing remains to train"), "{err}");
}

#[test]
fn a_restore_refuses_another_model_world_or_a_damaged_file() {
    let mut r = recipe(1, 2, 4);
    r.checkpoint.every = 4;
    let tmp = tempfile::tempdir().unwrap();
    run(&r, tmp.path(), None, None);
    let dir = tmp.path().join(disk::step_dir_name(4));
    let mut other = r.model.clone();
    other.d_model = 64;
    let mut model = Gpt::new(&other, 1).unwrap();
    let mut opt = AdamW::from_recipe(model.params_mut(), &r.train).unwrap();
    let err = restore(&dir, 0, 1, &mut model, &mut opt).unwrap_err().to_string();
    assert!(err.contains("tensor wte has shape [16, 32]") && err.contains("[16, 64]"), "{err}");
    let mut model = Gpt::new(&r.model, 1).unwrap();
    let mut opt = AdamW::from_recipe(model.params_mut(), &r.train).unwrap();
    let err = restore(&dir, 0, 2, &mut model, &mut opt).unwrap_err().to_string();
    assert!(err.contains("saved by 1 ranks, this run has 2"), "{err}");
    // One flipped byte in the weights: the loader's own hash refuses it.
    let path = dir.join(disk::MODEL);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let err = restore(&dir, 0, 1, &mut model, &mut opt).unwrap_err().to_string();
    assert!(err.contains("FLIGHTDECK_RESUME_FROM") && err.contains("model.bin: sha256"), "{err}");
}

/// `recipe` as a fine-tuning run on arithmetic questions with a small eval.
fn sft(steps: u64) -> Recipe {
    let mut r = recipe(1, 4, steps);
    r.kind = crate::recipe::Kind::Sft;
    r.data.source = crate::recipe::DataSource::Synthetic { generator: "arith-qa".into() };
    r.eval = crate::recipe::Eval { every: 8, prompts: 8, max_new_tokens: 4 };
    r
}

#[test]
fn an_sft_run_resumes_bit_for_bit() {
    let mut r = sft(16);
    (r.checkpoint.every, r.checkpoint.keep) = (8, 2);
    let straight = tempfile::tempdir().unwrap();
    let (all, _) = run(&r, straight.path(), None, None);
    let child = tempfile::tempdir().unwrap();
    let (resumed, out) = run(&r, child.path(), Some(straight.path().join(disk::step_dir_name(8))), None);
    assert_eq!(bits(&resumed), bits(&all[8..]), "sft steps 9..=16 must match by bits");
    assert_eq!(out.data_position, 16 * 4);
}

#[test]
fn init_starts_from_the_checkpoints_weights_whatever_the_seed_and_refuses_another_shape() {
    let mut pre = recipe(1, 4, 8);
    pre.checkpoint.every = 8;
    let parent = tempfile::tempdir().unwrap();
    run(&pre, parent.path(), None, None);
    let dir = parent.path().join(disk::step_dir_name(8));

    // Two fine-tuning runs that differ only in train.seed (which draws the initial weights):
    // from the same checkpoint, their losses are the same bits; without it, they differ.
    let first_losses = |seed: u64, init: Option<PathBuf>| {
        let mut r = sft(3);
        r.train.seed = seed;
        let tel = Telemetry::disabled();
        let flag = AtomicBool::new(false);
        let mut seen = Vec::new();
        let session = Session { plan: None, resume_from: None, init_from: init, stop: &flag };
        train_session(&r, &mut Solo, tel.tx(), &mut |m| seen.push((m.step.0, m.loss)), session).unwrap();
        bits(&seen)
    };
    assert_eq!(first_losses(1, Some(dir.clone())), first_losses(2, Some(dir.clone())));
    assert_ne!(first_losses(1, None), first_losses(2, None));
    assert_ne!(first_losses(1, None), first_losses(1, Some(dir.clone())));

    let mut other = pre.model.clone();
    other.n_layer = 3;
    let mut model = Gpt::new(&other, 1).unwrap();
    let err = init_weights(&dir, &mut model).unwrap_err().to_string();
    assert!(err.contains("init.from") && err.contains("holds 28 tensors, this model has 40"), "{err}");
    let err = init_weights(parent.path(), &mut model).unwrap_err().to_string();
    assert!(err.contains("is not a checkpoint step directory"), "{err}");
}
