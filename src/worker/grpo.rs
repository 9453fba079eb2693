//! Group relative policy optimisation with a rule reward: sample a group of completions per
//! prompt from the current policy (KV-cached), score them exactly, normalise the rewards within
//! each group, and update with the clipped policy-ratio loss plus a k3 KL penalty to the frozen
//! reference. TRL's `GRPOTrainer` is the model, metric names included.
//!
//! Sampling is seeded per prompt by its global index, so a rollout is the same whichever rank
//! draws it, on any world size, and after a resume (the data position is the whole RNG state).
use super::data::{Pair, Rng, Source, IGNORE};
use super::model::{Gpt, KvCache};
use crate::recipe::Grpo;
use crate::record::SampleLine;
use tch::{Device, Kind, TchError, Tensor};

/// Mixed into train.seed for the sampling streams, so they are not the data's.
const SAMPLING_STREAM: u64 = 0x6e90_5a3f;
/// TRL's guard against a zero standard deviation in the advantage.
const STD_EPS: f64 = 1e-4;

/// One completion, as sampled and scored.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub tokens: Vec<i64>,
    /// It ran to `max_new_tokens` without the stop token.
    pub truncated: bool,
    pub reward: f64,
}

/// A prompt's group of completions.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub index: u64,
    pub prompt: Vec<i64>,
    pub answer: Vec<i64>,
    pub completions: Vec<Completion>,
}

/// A rank's scored rollouts as the update reads them: rows of prompt + completion, targets only
/// on the completion's tokens, one advantage per row, and the log-probabilities the update
/// compares against (the reference's for the KL, the sampling policy's for the ratio).
pub struct Rollouts {
    pub inputs: Tensor,
    pub targets: Tensor,
    /// [rows, 1].
    pub advantages: Tensor,
    pub ref_logps: Option<Tensor>,
    pub old_logps: Option<Tensor>,
    /// reward, reward_std, frac_reward_zero_std, completions/*: what scoring measured.
    pub stats: Vec<(String, f64)>,
    pub samples: Vec<SampleLine>,
}

/// Samples `cfg.group_size` completions of `prompt` (global index `index`) from `model`:
/// temperature, then top-p, one token at a time through the KV cache, each row until the stop
/// token or `cfg.max_new_tokens`.
pub fn sample_group(
    model: &Gpt,
    index: u64,
    prompt: &[i64],
    cfg: &Grpo,
    seed: u64,
    stop: Option<i64>,
    device: Device,
) -> Result<Vec<(Vec<i64>, bool)>, TchError> {
    let _no_grad = tch::no_grad_guard();
    let g = cfg.group_size as usize;
    let vocab = model.config().vocab as usize;
    let mut rng = Rng::for_index(seed ^ SAMPLING_STREAM, index);
    let mut cache = KvCache::default();
    let idx =
        Tensor::f_from_slice(prompt)?.f_view([1, prompt.len() as i64])?.f_repeat([g as i64, 1])?.f_to_device(device)?;
    let mut logits = model.forward_cached(&idx, &mut cache)?.f_select(1, prompt.len() as i64 - 1)?;
    let mut rows: Vec<(Vec<i64>, bool)> = vec![(Vec::new(), true); g];
    let mut next = vec![0i64; g];
    for t in 0..cfg.max_new_tokens as usize {
        let host: Vec<f32> =
            Vec::try_from(logits.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?.f_contiguous()?.f_view([-1])?)?;
        for (j, (tokens, open)) in rows.iter_mut().enumerate() {
            // One draw per row per position, whether or not the row is still open: the stream
            // does not depend on what was sampled.
            let u = rng.uniform();
            if !*open {
                continue;
            }
            next[j] = pick(&host[j * vocab..(j + 1) * vocab], cfg.temperature, cfg.top_p, u);
            tokens.push(next[j]);
            *open = Some(next[j]) != stop;
        }
        if t + 1 == cfg.max_new_tokens as usize || rows.iter().all(|(_, open)| !open) {
            break;
        }
        let step = Tensor::f_from_slice(&next)?.f_view([g as i64, 1])?.f_to_device(device)?;
        logits = model.forward_cached(&step, &mut cache)?.f_select(1, 0)?;
    }
    // Open at the end means cut off by the length limit.
    Ok(rows.into_iter().map(|(tokens, open)| (tokens, open && stop.is_some())).collect())
}

/// The token that `u` ∈ [0, 1) picks from `logits` at `temperature`, among the most likely
/// tokens whose probabilities first reach `top_p` (nucleus sampling).
pub fn pick(logits: &[f32], temperature: f64, top_p: f64, u: f64) -> i64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<(usize, f64)> =
        logits.iter().enumerate().map(|(i, &l)| (i, ((f64::from(l) - f64::from(max)) / temperature).exp())).collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    // Most likely first; ties by token id, so the order is total.
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = 0.0;
    let mut nucleus = 0;
    for (_, p) in &probs {
        kept += p / total;
        nucleus += 1;
        if kept >= top_p {
            break;
        }
    }
    let mass: f64 = probs[..nucleus].iter().map(|p| p.1).sum();
    let mut left = u * mass;
    for &(i, p) in &probs[..nucleus] {
        left -= p;
        if left < 0.0 {
            return i as i64;
        }
    }
    probs[nucleus - 1].0 as i64
}

/// The rule reward: 1 for the exact answer (with a stop token, the whole completion; without,
/// its first tokens), plus `format_reward` for an answer's form.
pub fn reward(source: &Source, completion: &[i64], answer: &[i64], format_reward: f64) -> f64 {
    let correct = match source.stop_token() {
        Some(_) => completion == answer,
        None => completion.starts_with(answer),
    };
    let form = if format_reward > 0.0 && source.well_formed(completion) { format_reward } else { 0.0 };
    f64::from(u8::from(correct)) + form
}

/// Each reward's advantage within its group: (r − mean) / (std + 1e-4), std unbiased (TRL's).
pub fn advantages(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let std = group_std(rewards);
    rewards.iter().map(|r| (r - mean) / (std + STD_EPS)).collect()
}

fn group_std(rewards: &[f64]) -> f64 {
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt()
}

/// Lays scored `groups` out for the update. `samples` groups (the first ones) give their first
/// completion to the history, as step `step`'s samples.
pub fn rollouts(
    source: &Source,
    groups: &[Group],
    samples: usize,
    step: u64,
    device: Device,
) -> Result<Rollouts, TchError> {
    let rows: Vec<(&Group, &Completion)> =
        groups.iter().flat_map(|g| g.completions.iter().map(move |c| (g, c))).collect();
    // Row t predicts token t + 1: a row is the prompt and completion less its last token.
    let cols = rows.iter().map(|(g, c)| g.prompt.len() + c.tokens.len() - 1).max().unwrap_or(1);
    let mut inputs = Vec::with_capacity(rows.len() * cols);
    let mut targets = Vec::with_capacity(rows.len() * cols);
    let mut adv = Vec::with_capacity(rows.len());
    for g in groups {
        let rewards: Vec<f64> = g.completions.iter().map(|c| c.reward).collect();
        adv.extend(advantages(&rewards).into_iter().map(|a| a as f32));
    }
    for (g, c) in &rows {
        let seq: Vec<i64> = g.prompt.iter().chain(&c.tokens).copied().collect();
        let p = g.prompt.len();
        for t in 0..cols {
            inputs.push(seq.get(t).copied().unwrap_or(source.pad()));
            targets.push(if t + 1 >= p && t + 1 < seq.len() { seq[t + 1] } else { IGNORE });
        }
    }
    let shape = [rows.len() as i64, cols as i64];
    let n = rows.len().max(1) as f64;
    let stds: Vec<f64> =
        groups.iter().map(|g| group_std(&g.completions.iter().map(|c| c.reward).collect::<Vec<_>>())).collect();
    let groups_n = groups.len().max(1) as f64;
    let stats = vec![
        ("reward".to_string(), rows.iter().map(|(_, c)| c.reward).sum::<f64>() / n),
        ("reward_std".to_string(), stds.iter().sum::<f64>() / groups_n),
        ("frac_reward_zero_std".to_string(), stds.iter().filter(|&&s| s == 0.0).count() as f64 / groups_n),
        ("completions/mean_length".to_string(), rows.iter().map(|(_, c)| c.tokens.len() as f64).sum::<f64>() / n),
        ("completions/clipped_ratio".to_string(), rows.iter().filter(|(_, c)| c.truncated).count() as f64 / n),
    ];
    let samples = groups
        .iter()
        .take(samples)
        .filter_map(|g| {
            g.completions.first().map(|c| SampleLine {
                step,
                prompt: source.render(&g.prompt),
                completion: source.render(&c.tokens),
                reward: c.reward,
            })
        })
        .collect();
    Ok(Rollouts {
        inputs: Tensor::f_from_slice(&inputs)?.f_view(shape)?.f_to_device(device)?,
        targets: Tensor::f_from_slice(&targets)?.f_view(shape)?.f_to_device(device)?,
        advantages: Tensor::f_from_slice(&adv)?.f_view([rows.len() as i64, 1])?.f_to_device(device)?,
        ref_logps: None,
        old_logps: None,
        stats,
        samples,
    })
}

/// Each target token's log-probability under `model` sampled at `temperature` ([rows, cols];
/// 0 where the target is `IGNORE`), and the (tempered) logits it came from. The ratio, the KL
/// and the entropy are of the policy that sampled, as TRL computes them; at temperature 1 the
/// logits are used as they are.
pub fn token_logps(
    model: &Gpt,
    inputs: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> Result<(Tensor, Tensor), TchError> {
    let logits = model.forward(inputs)?;
    let logits = if temperature == 1.0 { logits } else { logits.f_div_scalar(temperature)? };
    let mask = targets.f_ne(IGNORE)?;
    let safe = targets.f_where_scalarother(&mask, 0)?;
    let logp = logits.f_log_softmax(-1, Kind::Float)?.f_gather(2, &safe.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    Ok((logp.f_mul(&mask.f_to_kind(Kind::Float)?)?, logits))
}

/// The GRPO loss of one pass over `r` (a scalar to backpropagate) and its metrics: per token
/// −min(ρ·A, clip(ρ, 1 ± ε)·A) + β·(e^(ref−π) − (ref−π) − 1), averaged over each completion's
/// tokens, then over the completions.
pub fn loss(policy: &Gpt, r: &Rollouts, cfg: &Grpo) -> Result<(Tensor, Vec<(String, f64)>), TchError> {
    let (logp, logits) = token_logps(policy, &r.inputs, &r.targets, cfg.temperature)?;
    let mask = r.targets.f_ne(IGNORE)?.f_to_kind(Kind::Float)?;
    let old = match &r.old_logps {
        Some(old) => old.shallow_clone(),
        None => logp.f_detach()?,
    };
    let ratio = logp.f_sub(&old)?.f_exp()?;
    let clipped = ratio.f_clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)?;
    let pg = ratio.f_mul(&r.advantages)?.f_minimum(&clipped.f_mul(&r.advantages)?)?.f_neg()?;
    let kl = match &r.ref_logps {
        Some(reference) => {
            let d = reference.f_sub(&logp)?;
            Some(d.f_exp()?.f_sub(&d)?.f_sub_scalar(1.0)?)
        }
        None => None,
    };
    let per_token = match &kl {
        Some(kl) if cfg.beta > 0.0 => pg.f_add(&kl.f_mul_scalar(cfg.beta)?)?,
        _ => pg,
    };
    let per_row = per_token.f_mul(&mask)?.f_sum_dim_intlist([1i64].as_slice(), false, Kind::Float)?;
    let lengths = mask.f_sum_dim_intlist([1i64].as_slice(), false, Kind::Float)?.f_clamp_min(1.0)?;
    let loss = per_row.f_div(&lengths)?.f_mean(Kind::Float)?;

    let _no_grad = tch::no_grad_guard();
    let tokens = mask.f_sum(Kind::Float)?.f_double_value(&[])?.max(1.0);
    let token_mean =
        |t: &Tensor| -> Result<f64, TchError> { Ok(t.f_mul(&mask)?.f_sum(Kind::Float)?.f_double_value(&[])? / tokens) };
    let logits = logits.f_detach()?;
    let entropy = logits
        .f_softmax(-1, Kind::Float)?
        .f_mul(&logits.f_log_softmax(-1, Kind::Float)?)?
        .f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Float)?
        .f_neg()?;
    let low = ratio.f_lt(1.0 - cfg.clip_eps)?.f_logical_and(&r.advantages.f_lt(0.0)?)?;
    let high = ratio.f_gt(1.0 + cfg.clip_eps)?.f_logical_and(&r.advantages.f_gt(0.0)?)?;
    let clip = low.f_logical_or(&high)?.f_to_kind(Kind::Float)?;
    let mut metrics =
        vec![("entropy".to_string(), token_mean(&entropy)?), ("clip_ratio".to_string(), token_mean(&clip)?)];
    if let Some(kl) = &kl {
        metrics.push(("kl".to_string(), token_mean(&kl.f_detach()?)?));
    }
    Ok((loss, metrics))
}

/// The rank's groups: `cfg.group_size` completions sampled for each of its prompts, not yet
/// scored.
pub fn generate(
    model: &Gpt,
    source: &Source,
    prompts: &[(u64, Pair)],
    cfg: &Grpo,
    seed: u64,
    device: Device,
) -> Result<Vec<Group>, TchError> {
    prompts
        .iter()
        .map(|(index, pair)| {
            let sampled = sample_group(model, *index, &pair.prompt, cfg, seed, source.stop_token(), device)?;
            let completions =
                sampled.into_iter().map(|(tokens, truncated)| Completion { tokens, truncated, reward: 0.0 }).collect();
            Ok(Group { index: *index, prompt: pair.prompt.clone(), answer: pair.response.clone(), completions })
        })
        .collect()
}

/// Gives every completion its rule reward.
pub fn score(source: &Source, groups: &mut [Group], format_reward: f64) {
    for g in groups {
        for c in &mut g.completions {
            c.reward = reward(source, &c.tokens, &g.answer, format_reward);
        }
    }
}

#[cfg(test)]
#[path = "grpo_tests.rs"]
mod tests;
