//! GRPO's pieces on their own: sampling, the reward, the advantages, the rollouts' layout and
//! the loss; the training loop's GRPO runs are in train_tests.rs.
use super::*;
use crate::worker::arith::{END, EQUALS, PLUS};

fn tiny() -> crate::recipe::Model {
    crate::recipe::Model { n_layer: 1, n_head: 2, d_model: 16, context: 16, vocab: 16 }
}

#[test]
fn pick_follows_temperature_and_the_nucleus() {
    let logits = [0.0f32, 3.0, 1.0, 0.0];
    // The most likely token comes first in the order the draw walks.
    assert_eq!(pick(&logits, 1.0, 1.0, 0.0), 1);
    // A nucleus of 0.5 holds only token 1 (p ≈ 0.79): every draw is 1.
    for u in [0.0, 0.3, 0.6, 0.999] {
        assert_eq!(pick(&logits, 1.0, 0.5, u), 1, "u {u}");
    }
    // The full distribution: the last sliver goes to the least likely (ties by id: 3 after 0).
    assert_eq!(pick(&logits, 1.0, 1.0, 0.999_999), 3);
    // A high temperature flattens: u = 0.5 falls past token 1.
    assert_eq!(pick(&logits, 1.0, 1.0, 0.5), 1);
    assert_ne!(pick(&logits, 100.0, 1.0, 0.5), 1);
    // Frequencies match the softmax.
    let mut rng = Rng::for_index(1, 2);
    let n = 20_000;
    let ones = (0..n).filter(|_| pick(&logits, 1.0, 1.0, rng.uniform()) == 1).count() as f64 / f64::from(n);
    let p1 = 3f64.exp() / (2.0 + 3f64.exp() + 1f64.exp());
    assert!((ones - p1).abs() < 0.015, "{ones} vs {p1}");
}

#[test]
fn advantages_are_normalised_within_the_group_as_trl_does() {
    let a = advantages(&[1.0, 0.0, 0.0, 1.0]);
    // mean 0.5, unbiased std √(1/3).
    let want = 0.5 / (1f64 / 3.0).sqrt();
    for (got, sign) in a.iter().zip([1.0, -1.0, -1.0, 1.0]) {
        assert!((got - sign * want).abs() < 1e-3, "{a:?}");
    }
    assert_eq!(advantages(&[1.0, 1.0, 1.0]), vec![0.0, 0.0, 0.0]);
}

#[test]
fn the_reward_is_the_exact_answer_plus_the_format_bonus() {
    let s = Source::ArithQa { seed: 1 };
    let answer = [1, 4, END];
    assert_eq!(reward(&s, &[1, 4, END], &answer, 0.0), 1.0);
    assert_eq!(reward(&s, &[1, 4, END], &answer, 0.1), 1.1);
    assert_eq!(reward(&s, &[1, 5, END], &answer, 0.1), 0.1);
    assert_eq!(reward(&s, &[1, 4], &answer, 0.1), 0.0, "no stop token: not an answer");
    assert_eq!(reward(&s, &[PLUS, END], &answer, 0.1), 0.0);
}

#[test]
fn a_group_is_a_pure_function_of_the_prompts_index_and_stops_at_the_stop_token() {
    let m = Gpt::new(&tiny(), 3).unwrap();
    let cfg = Grpo { group_size: 6, max_new_tokens: 5, ..Grpo::default() };
    let prompt = [3, PLUS, 4, EQUALS];
    let a = sample_group(&m, 17, &prompt, &cfg, 9, Some(END), Device::Cpu).unwrap();
    assert_eq!(a, sample_group(&m, 17, &prompt, &cfg, 9, Some(END), Device::Cpu).unwrap());
    assert_ne!(a, sample_group(&m, 18, &prompt, &cfg, 9, Some(END), Device::Cpu).unwrap());
    assert_eq!(a.len(), 6);
    for (tokens, truncated) in &a {
        assert!(!tokens.is_empty() && tokens.len() <= 5);
        let stopped = tokens.last() == Some(&END);
        // Ends at the first stop token, or runs to the limit and says so.
        assert_eq!(tokens.iter().filter(|&&t| t == END).count(), usize::from(stopped));
        assert_eq!(*truncated, !stopped, "{tokens:?}");
        assert!(stopped || tokens.len() == 5);
    }
    // An untrained model at temperature 1 does not give six equal completions.
    assert!(a.iter().any(|c| c != &a[0]), "{a:?}");
}

#[test]
fn rollouts_put_targets_on_the_completion_only_and_advantages_per_row() {
    let s = Source::ArithQa { seed: 1 };
    let group = |index, rewards: [f64; 2]| Group {
        index,
        prompt: vec![2, PLUS, 2, EQUALS],
        answer: vec![4, END],
        completions: rewards
            .iter()
            .map(|&reward| Completion { tokens: vec![4, END], truncated: false, reward })
            .collect(),
    };
    let r = rollouts(&s, &[group(0, [1.0, 0.0]), group(1, [1.0, 1.0])], 1, 7, Device::Cpu).unwrap();
    // Rows of prompt + completion less the last token: 5 columns.
    assert_eq!(r.inputs.size(), vec![4, 5]);
    let t: Vec<i64> = Vec::try_from(r.targets.view([-1])).unwrap();
    let i = IGNORE;
    assert_eq!(&t[..5], &[i, i, i, 4, END]);
    let adv: Vec<f32> = Vec::try_from(r.advantages.view([-1])).unwrap();
    assert!(adv[0] > 0.7 && adv[1] < -0.7 && adv[2] == 0.0 && adv[3] == 0.0, "{adv:?}");
    let stat = |name: &str| r.stats.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(stat("reward"), 0.75);
    assert_eq!(stat("frac_reward_zero_std"), 0.5);
    assert_eq!(stat("completions/mean_length"), 2.0);
    assert_eq!(r.samples, vec![SampleLine { step: 7, prompt: "2+2=".into(), completion: "4;".into(), reward: 1.0 }]);
}

#[test]
fn on_policy_against_itself_the_loss_has_no_kl_no_clipping_and_a_gradient() {
    let m = Gpt::new(&tiny(), 4).unwrap();
    let s = Source::ArithQa { seed: 1 };
    let cfg = Grpo { group_size: 4, max_new_tokens: 3, beta: 0.1, ..Grpo::default() };
    let prompts = vec![(0u64, crate::worker::data::Pair { prompt: vec![2, PLUS, 2, EQUALS], response: vec![4, END] })];
    let mut groups = generate(&m, &s, &prompts, &cfg, 1, Device::Cpu).unwrap();
    // Rewards by hand so the group has a spread.
    for (c, r) in groups[0].completions.iter_mut().zip([1.0, 0.0, 0.0, 0.0]) {
        c.reward = r;
    }
    let mut r = rollouts(&s, &groups, 0, 1, Device::Cpu).unwrap();
    r.ref_logps = Some(tch::no_grad(|| token_logps(&m, &r.inputs, &r.targets, 1.0)).unwrap().0);
    let (loss, metrics) = loss(&m, &r, &cfg).unwrap();
    let get = |name: &str| metrics.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(get("kl").abs() < 1e-6, "{metrics:?}");
    assert_eq!(get("clip_ratio"), 0.0);
    assert!(get("entropy") > 0.0);
    loss.backward();
    let g = m.params()[0].tensor.grad();
    assert!(g.abs().sum(tch::Kind::Float).double_value(&[]) > 0.0, "the advantages push the policy");
}

#[test]
fn a_gradient_step_on_the_loss_makes_the_better_completions_more_likely() {
    let m = Gpt::new(&tiny(), 5).unwrap();
    let s = Source::ArithQa { seed: 1 };
    let cfg = Grpo { group_size: 4, max_new_tokens: 3, beta: 0.0, ..Grpo::default() };
    let prompt = crate::worker::data::Pair { prompt: vec![2, PLUS, 2, EQUALS], response: vec![4, END] };
    let group = Group {
        index: 0,
        prompt: prompt.prompt.clone(),
        answer: prompt.response.clone(),
        completions: [(vec![4, END], 1.0), (vec![5, END], 0.0), (vec![7, 1, END], 0.0), (vec![4, END], 1.0)]
            .into_iter()
            .map(|(tokens, reward)| Completion { tokens, truncated: false, reward })
            .collect(),
    };
    let r = rollouts(&s, &[group], 0, 1, Device::Cpu).unwrap();
    let row_logps = |m: &Gpt| -> Vec<f64> {
        let (lp, _) = tch::no_grad(|| token_logps(m, &r.inputs, &r.targets, 1.0)).unwrap();
        let sums = lp.sum_dim_intlist([1i64].as_slice(), false, tch::Kind::Double);
        (0..4).map(|i| sums.double_value(&[i])).collect()
    };
    let before = row_logps(&m);
    let (l, _) = loss(&m, &r, &cfg).unwrap();
    l.backward();
    tch::no_grad(|| {
        for p in m.params() {
            let g = p.tensor.grad();
            let mut t = p.tensor.shallow_clone();
            let _ = t.f_sub_(&(g * 0.05)).unwrap();
        }
    });
    let after = row_logps(&m);
    // The answer the group rewarded gains; what the advantages weigh gains overall (a shared
    // token such as ';' may rise in a wrong row too).
    assert!(after[0] > before[0] && after[3] > before[3], "rewarded: {before:?} -> {after:?}");
    let adv: Vec<f32> = Vec::try_from(r.advantages.view([-1])).unwrap();
    let gain: f64 = (0..4).map(|i| f64::from(adv[i]) * (after[i] - before[i])).sum();
    assert!(gain > 0.0, "{before:?} -> {after:?}");
    assert!(after[2] < before[2], "the longest wrong answer loses: {before:?} -> {after:?}");
}

#[test]
fn at_a_temperature_near_zero_every_sample_is_the_greedy_answer() {
    let m = Gpt::new(&tiny(), 6).unwrap();
    let cfg = Grpo { group_size: 3, max_new_tokens: 6, temperature: 1e-6, ..Grpo::default() };
    for (i, prompt) in [vec![3, PLUS, 4, EQUALS], vec![1, 2, PLUS, 9, EQUALS, 2, 1, END, 2, EQUALS]].iter().enumerate()
    {
        let greedy = crate::worker::eval::greedy(&m, prompt, 6, Some(END), Device::Cpu).unwrap();
        for (tokens, _) in sample_group(&m, i as u64, prompt, &cfg, 1, Some(END), Device::Cpu).unwrap() {
            assert_eq!(tokens, greedy, "prompt {prompt:?}");
        }
    }
}

#[test]
fn log_probabilities_are_of_the_tempered_policy_that_sampled() {
    let m = Gpt::new(&tiny(), 3).unwrap();
    let x = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let y = Tensor::from_slice(&[IGNORE, 3, 4, 5]).view([1, 4]);
    let (at1, _) = tch::no_grad(|| token_logps(&m, &x, &y, 1.0)).unwrap();
    let (at_half, _) = tch::no_grad(|| token_logps(&m, &x, &y, 0.5)).unwrap();
    // By hand: log_softmax(logits / 0.5) at the targets.
    let logits = tch::no_grad(|| m.forward(&x)).unwrap().divide_scalar(0.5).log_softmax(-1, Kind::Float);
    for (t, target) in [(1i64, 3i64), (2, 4), (3, 5)] {
        let want = logits.double_value(&[0, t, target]);
        assert!((at_half.double_value(&[0, t]) - want).abs() < 1e-6, "position {t}");
        assert_ne!(at1.double_value(&[0, t]), at_half.double_value(&[0, t]));
    }
    assert_eq!(at_half.double_value(&[0, 0]), 0.0, "an ignored target adds nothing");
}
