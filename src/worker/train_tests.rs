//! Training-loop tests: loss falls, runs repeat bit for bit, and two in-process ranks with a
//! test collective match one rank with twice the batch.
use super::*;
use crate::collective::solo::Solo;
use crate::collective::Collective;
use crate::ids::Rank;
use crate::protocol::message::RankMsg;
use crate::recipe::Fault;
use crate::worker::telemetry::Telemetry;
use crate::worker::testing::recipe;
use std::sync::{Arc, Barrier, Mutex};

fn losses(recipe: &Recipe, group: &mut dyn StepCollective) -> (Vec<f64>, Vec<StepMetrics>) {
    let tel = Telemetry::disabled();
    let mut seen = Vec::new();
    let out = train(recipe, group, tel.tx(), &mut |m| seen.push(m.clone())).unwrap();
    assert_eq!(out.steps, recipe.train.steps);
    assert_eq!(out.final_loss.to_bits(), seen.last().unwrap().loss.to_bits());
    (seen.iter().map(|m| m.loss).collect(), seen)
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn loss_falls_in_a_short_solo_run() {
    let r = recipe(1, 8, 40);
    let (l, metrics) = losses(&r, &mut Solo);
    let (first, last) = (mean(&l[..5]), mean(&l[35..]));
    assert!(last < 0.8 * first, "first5 {first:.4} last5 {last:.4}: {l:?}");
    let m = &metrics[39];
    assert_eq!(m.tokens, 8 * 32);
    assert_eq!(m.comm_ms, 0.0, "world 1 never communicates");
    assert!(m.mem_rss_bytes > 0 && m.grad_norm > 0.0 && m.lr > 0.0);
    let parts = m.data_ms + m.fwd_ms + m.bwd_ms + m.comm_ms + m.opt_ms;
    assert!((parts - m.step_time_ms).abs() < 1e-6, "{m:?}");
}

#[test]
fn same_recipe_twice_gives_bit_identical_losses() {
    let r = recipe(1, 4, 12);
    let (a, _) = losses(&r, &mut Solo);
    let (b, _) = losses(&r, &mut Solo);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn non_finite_loss_is_reported_and_training_goes_on() {
    let mut r = recipe(1, 2, 8);
    (r.train.lr, r.train.warmup, r.train.grad_clip) = (1e4, 0, 0.0);
    let (l, _) = losses(&r, &mut Solo);
    assert_eq!(l.len(), 8);
    assert!(l.iter().any(|x| !x.is_finite()), "{l:?}");
}

/// A test double for the math of data parallelism: ranks are threads that sum through shared
/// slots, in rank order so every rank gets the same bits. (The real ring is tested by its owner.)
struct ThreadGroup {
    rank: u32,
    world: u32,
    slots: Arc<Mutex<Vec<Vec<f32>>>>,
    barrier: Arc<Barrier>,
}

impl Collective for ThreadGroup {
    fn rank(&self) -> Rank {
        Rank(self.rank)
    }
    fn world_size(&self) -> u32 {
        self.world
    }
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.slots.lock().unwrap()[self.rank as usize] = buf.to_vec();
        self.barrier.wait();
        {
            let slots = self.slots.lock().unwrap();
            for (i, x) in buf.iter_mut().enumerate() {
                *x = slots.iter().map(|s| s[i]).sum();
            }
        }
        self.barrier.wait();
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.barrier.wait();
        Ok(())
    }
}

impl StepCollective for ThreadGroup {}

#[test]
fn two_ranks_with_batch_b_match_one_rank_with_batch_2b() {
    let steps = 20;
    let (one, _) = losses(&recipe(1, 8, steps), &mut Solo);
    let mut r2 = recipe(2, 4, steps);
    // Small buckets: several collectives per step, one parameter split across buckets.
    r2.parallel.bucket_bytes = 40_000;
    let slots = Arc::new(Mutex::new(vec![Vec::new(), Vec::new()]));
    let barrier = Arc::new(Barrier::new(2));
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let (r2, slots, barrier) = (r2.clone(), slots.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut g = ThreadGroup { rank, world: 2, slots, barrier };
                losses(&r2, &mut g)
            })
        })
        .collect();
    let per_rank: Vec<(Vec<f64>, Vec<StepMetrics>)> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(one.len(), steps as usize);
    for (s, &one) in one.iter().enumerate() {
        let two = (per_rank[0].0[s] + per_rank[1].0[s]) / 2.0;
        let rel = (two - one).abs() / one.abs();
        assert!(rel < 1e-4, "step {}: world 1 {one} vs world 2 mean {two} (rel {rel:e})", s + 1);
        // Averaged gradients are identical on both ranks, so are their norms.
        assert_eq!(per_rank[0].1[s].grad_norm, per_rank[1].1[s].grad_norm);
        assert_eq!(per_rank[0].1[s].tokens, 4 * 32);
    }
}

#[test]
fn slow_fault_stretches_backward_from_its_step() {
    let mut r = recipe(1, 4, 6);
    r.faults = vec![Fault { kind: FaultKind::Slow, rank: 0, step: 4, slow_pct: 300.0 }];
    let (_, m) = losses(&r, &mut Solo);
    for m in &m[3..] {
        // bwd_ms = backward + 3 × (forward + backward) ≥ 3 × forward.
        assert!(m.bwd_ms >= 3.0 * m.fwd_ms, "step {}: {m:?}", m.step.0);
    }
}

#[test]
fn bad_recipes_are_refused_up_front() {
    let mut r = recipe(1, 4, 6);
    for kind in [FaultKind::Mismatch, FaultKind::HangInCollective] {
        r.faults = vec![Fault { kind, rank: 0, step: 1, slow_pct: 0.0 }];
        assert!(check(&r, 1).is_ok(), "{kind:?} is implemented");
    }
    let r = recipe(2, 4, 6);
    let err = check(&r, 1).unwrap_err().to_string();
    assert!(err.contains("parallel.data = 2 but WORLD_SIZE = 1"), "{err}");
    let mut r = recipe(1, 4, 6);
    r.model.vocab = 8;
    let tel = Telemetry::disabled();
    let err = train(&r, &mut Solo, tel.tx(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("model.vocab = 8"), "{err}");
}

/// An agent's side of the telemetry socket: a listener and a reader of everything after Hello.
fn agent() -> (tempfile::TempDir, std::path::PathBuf, std::sync::mpsc::Receiver<RankMsg>) {
    use crate::protocol::frame::read_frame;
    use crate::protocol::message::Hello;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _: Hello = read_frame(&mut s).unwrap().unwrap();
        while let Ok(Some(m)) = read_frame::<RankMsg, _>(&mut s) {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
    (dir, path, rx)
}

#[test]
fn telemetry_carries_phases_in_order_then_steps_then_finished() {
    let (_dir, path, rx) = agent();
    let mut r = recipe(1, 2, 3);
    r.telemetry.step_interval = 2;
    let tel = Telemetry::connect(Some(&path), "local", Rank(0), &r.telemetry);
    let out = train(&r, &mut Solo, tel.tx(), &mut |_| {}).unwrap();
    tel.finish(Some((out.steps, out.final_loss)));
    let msgs: Vec<RankMsg> = rx.iter().collect();
    let seen: Vec<String> = msgs
        .iter()
        .map(|m| match m {
            RankMsg::Register { .. } => "register".to_string(),
            RankMsg::Phase { step, phase, .. } => format!("{}:{}", step.0, phase.name()),
            RankMsg::Step(m) => format!("step{}", m.step.0),
            RankMsg::Collective(_) => "collective".to_string(),
            RankMsg::Finished { steps, .. } => format!("finished{steps}"),
            RankMsg::CheckpointSaved(c) => format!("ckpt{}", c.step.0),
            RankMsg::CheckpointFailed { .. } => "ckpt-failed".to_string(),
            RankMsg::Refused(_) => "refused".to_string(),
            RankMsg::Metrics { step, .. } => format!("metrics{}", step.0),
        })
        .collect();
    let want = "register 1:data 1:fwd 1:bwd 1:opt 2:data 2:fwd 2:bwd 2:opt step2 \
                3:data 3:fwd 3:bwd 3:opt step3 3:done finished3";
    assert_eq!(seen.join(" "), want.split_whitespace().collect::<Vec<_>>().join(" "));
}

#[test]
fn an_sft_run_reports_token_accuracy_each_step_and_the_eval_before_during_and_after() {
    let (_dir, path, rx) = agent();
    let mut r = recipe(1, 4, 6);
    r.kind = crate::recipe::Kind::Sft;
    r.data.source = crate::recipe::DataSource::Synthetic { generator: "arith-qa".into() };
    r.eval = crate::recipe::Eval { every: 4, prompts: 6, max_new_tokens: 4 };
    let tel = Telemetry::connect(Some(&path), "local", Rank(0), &r.telemetry);
    let out = train(&r, &mut Solo, tel.tx(), &mut |_| {}).unwrap();
    tel.finish(Some((out.steps, out.final_loss)));
    let mut evals = Vec::new();
    let mut accuracy_steps = Vec::new();
    for m in rx.iter() {
        if let RankMsg::Metrics { step, metrics } = m {
            for (name, v) in metrics {
                match name.as_str() {
                    "eval/exact_match" => evals.push((step.0, v)),
                    "mean_token_accuracy" => {
                        assert!((0.0..=1.0).contains(&v), "{v}");
                        accuracy_steps.push(step.0);
                    }
                    "num_tokens" => assert!((8.0..=12.0).contains(&v), "2 or 3 answer tokens a row: {v}"),
                    other => panic!("unexpected metric {other}"),
                }
            }
        }
    }
    assert_eq!(accuracy_steps, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 4, 6]);
    // Six prompts: a share in sixths.
    assert!(evals.iter().all(|(_, v)| (v * 6.0 - (v * 6.0).round()).abs() < 1e-9), "{evals:?}");
}

#[test]
fn hang_before_collective_parks_after_reporting_data() {
    let (_dir, path, rx) = agent();
    let mut r = recipe(1, 2, 10);
    r.faults = vec![Fault { kind: FaultKind::HangBeforeCollective, rank: 0, step: 3, slow_pct: 0.0 }];
    std::thread::spawn(move || {
        let tel = Telemetry::connect(Some(&path), "local", Rank(0), &r.telemetry);
        let _ = train(&r, &mut Solo, tel.tx(), &mut |_| {});
        panic!("a hung rank never returns");
    });
    let hung = |m: &RankMsg| matches!(m, RankMsg::Phase { step: Step(3), phase: Phase::Data, .. });
    let timeout = std::time::Duration::from_secs(30);
    while !hung(&rx.recv_timeout(timeout).unwrap()) {}
    // Nothing after it: the rank stays in step 3's data phase (the thread is left parked).
    let quiet = rx.recv_timeout(std::time::Duration::from_millis(300));
    assert!(quiet.is_err(), "{quiet:?}");
}

/// A GRPO recipe the tests can afford: 4 completions of each prompt, answers of at most 3
/// tokens, and a format reward so that an untrained policy already sees rewards that differ.
fn grpo_recipe(world: u32, batch_per_rank: u32, steps: u64) -> Recipe {
    let mut r = recipe(world, batch_per_rank, steps);
    r.kind = crate::recipe::Kind::Grpo;
    r.data.source = crate::recipe::DataSource::Synthetic { generator: "arith-qa".into() };
    r.grpo = crate::recipe::Grpo { group_size: 4, max_new_tokens: 3, format_reward: 1.0, ..Default::default() };
    r.train.lr = 1e-2;
    r
}

/// Runs `recipe` as `group`'s rank with a telemetry socket: every step's metrics, the kind's
/// metrics by step, and the phases in order.
#[allow(clippy::type_complexity)]
fn run_reporting(
    recipe: &Recipe,
    group: &mut dyn StepCollective,
) -> (Vec<StepMetrics>, Vec<Vec<(String, f64)>>, Vec<String>) {
    let (_dir, path, rx) = agent();
    let tel = Telemetry::connect(Some(&path), "local", group.rank(), &recipe.telemetry);
    let mut steps = Vec::new();
    let out = train(recipe, group, tel.tx(), &mut |m| steps.push(m.clone())).unwrap();
    tel.finish(Some((out.steps, out.final_loss)));
    let mut kind = vec![Vec::new(); recipe.train.steps as usize + 1];
    let mut phases = Vec::new();
    for m in rx.iter() {
        match m {
            RankMsg::Metrics { step, metrics } => kind[step.0 as usize].extend(metrics),
            RankMsg::Phase { step, phase, .. } => phases.push(format!("{}:{}", step.0, phase.name())),
            _ => {}
        }
    }
    (steps, kind, phases)
}

fn metric(m: &[(String, f64)], name: &str) -> f64 {
    m.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name} in {m:?}")).1
}

#[test]
fn a_grpo_step_generates_scores_and_references_before_its_update_and_reports_trls_metrics() {
    let mut r = grpo_recipe(1, 2, 2);
    r.grpo.ppo_epochs = 2;
    let (steps, kind, phases) = run_reporting(&r, &mut Solo);
    let want = "1:data 1:generate 1:score 1:reference 1:fwd 1:bwd 1:opt 1:fwd 1:bwd 1:opt 2:data";
    assert!(phases.join(" ").starts_with(want), "{phases:?}");
    for name in [
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "clip_ratio",
        "completions/mean_length",
        "completions/clipped_ratio",
        "time/generate_ms",
        "time/score_ms",
        "time/reference_ms",
        "time/update_ms",
    ] {
        let v = metric(&kind[1], name);
        assert!(v.is_finite() && v >= 0.0, "{name} = {v}");
    }
    assert!((1.0..=3.0).contains(&metric(&kind[1], "completions/mean_length")));
    // The parts of the step still add up to its time, over both passes.
    let m = &steps[1];
    let parts = m.data_ms + m.fwd_ms + m.bwd_ms + m.comm_ms + m.opt_ms;
    assert!((parts - m.step_time_ms).abs() < 1e-6, "{m:?}");
    // Two passes: the second is off-policy, so its ratio can leave the clip range; the first
    // pass alone (ppo_epochs = 1) never clips.
    r.grpo.ppo_epochs = 1;
    let (_, kind, _) = run_reporting(&r, &mut Solo);
    assert_eq!(metric(&kind[1], "clip_ratio"), 0.0);
}

#[test]
fn grpo_on_two_ranks_with_b_prompts_each_updates_as_one_rank_with_2b_and_repeats_bit_for_bit() {
    let steps = 4;
    let one = grpo_recipe(1, 4, steps);
    let (solo, solo_kind, _) = run_reporting(&one, &mut Solo);
    // The same seed twice: the same rewards, bit for bit.
    let (_, again, _) = run_reporting(&one, &mut Solo);
    for s in 1..=steps as usize {
        assert_eq!(metric(&solo_kind[s], "reward").to_bits(), metric(&again[s], "reward").to_bits(), "step {s}");
    }
    let r2 = grpo_recipe(2, 2, steps);
    let slots = Arc::new(Mutex::new(vec![Vec::new(), Vec::new()]));
    let barrier = Arc::new(Barrier::new(2));
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let (r2, slots, barrier) = (r2.clone(), slots.clone(), barrier.clone());
            std::thread::spawn(move || run_reporting(&r2, &mut ThreadGroup { rank, world: 2, slots, barrier }))
        })
        .collect();
    let per_rank: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let mut rewarded = 0.0;
    for s in 1..=steps as usize {
        // The rollouts are the same completions: each rank's reward is its half of the batch's.
        let two = (metric(&per_rank[0].1[s], "reward") + metric(&per_rank[1].1[s], "reward")) / 2.0;
        let want = metric(&solo_kind[s], "reward");
        assert!((two - want).abs() < 1e-12, "step {s}: reward {two} on 2 ranks, {want} on 1");
        rewarded += want;
        // The update: the averaged gradient has the same norm as one rank's over the whole batch.
        let (g1, g2) = (solo[s - 1].grad_norm, per_rank[0].0[s - 1].grad_norm);
        assert!((g1 - g2).abs() <= 1e-4 * g1.abs(), "step {s}: grad norm {g1} vs {g2}");
        assert_eq!(per_rank[0].0[s - 1].grad_norm, per_rank[1].0[s - 1].grad_norm);
        let l2 = (per_rank[0].0[s - 1].loss + per_rank[1].0[s - 1].loss) / 2.0;
        assert!((l2 - solo[s - 1].loss).abs() < 1e-5, "step {s}: loss {l2} vs {}", solo[s - 1].loss);
    }
    // Not a vacuous match: the format reward gave the groups something to compare.
    assert!(rewarded > 0.0 && solo.iter().all(|m| m.grad_norm > 0.0), "{solo:?}");
}

/// Not a test: the tiny-gpt measurement (ms/step at 1 torch thread, loss ratio over 200 steps).
/// `cargo test --release --lib worker::train::tests::measure_tiny_gpt -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_tiny_gpt() {
    tch::set_num_threads(1);
    for (lr, warmup) in [(3e-3, 5), (1e-3, 20)] {
        let mut r = recipe(1, 16, 200);
        r.model = crate::recipe::Model { n_layer: 2, n_head: 4, d_model: 128, context: 64, vocab: 16 };
        (r.train.lr, r.train.min_lr, r.train.warmup) = (lr, lr / 10.0, warmup);
        let (l, m) = losses(&r, &mut Solo);
        let ms: Vec<f64> = m[10..].iter().map(|m| m.step_time_ms).collect();
        let (first, last) = (mean(&l[..10]), mean(&l[190..]));
        println!(
            "tiny-gpt lr {lr} warmup {warmup}: {:.1} ms/step (mean of steps 11-200), first10 {first:.4} last10 {last:.4} ratio {:.3}",
            mean(&ms),
            last / first
        );
        let curve: Vec<String> = (0..200).step_by(20).map(|s| format!("{}:{:.3}", s + 1, l[s])).collect();
        println!("  {}", curve.join(" "));
    }
}
