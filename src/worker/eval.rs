//! The fine-tuning metrics: the token accuracy of a step, and the eval's greedy exact match on
//! held-out prompts, shared among the ranks and summed through the step's collective.
use super::data::{Pair, Source, IGNORE};
use super::group::StepCollective;
use super::model::Gpt;
use crate::collective::CollectiveError;
use crate::recipe::Eval;
use tch::{Device, Kind, TchError, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
    #[error("summing the ranks' eval counts: {0}")]
    Collective(#[from] CollectiveError),
}

/// The share of the response tokens (targets other than `IGNORE`) that the logits' argmax gets
/// right: TRL's `mean_token_accuracy`. NaN when the batch has none.
pub fn token_accuracy(logits: &Tensor, targets: &Tensor) -> Result<f64, TchError> {
    let _no_grad = tch::no_grad_guard();
    let mask = targets.f_ne(IGNORE)?;
    let right = logits.f_argmax(-1, false)?.f_eq_tensor(targets)?.f_logical_and(&mask)?;
    let n = mask.f_sum(Kind::Float)?.f_double_value(&[])?;
    Ok(right.f_sum(Kind::Float)?.f_double_value(&[])? / n)
}

/// What one eval measured, over every rank's share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub correct: u64,
    pub prompts: u64,
}

impl Scored {
    pub fn exact_match(&self) -> f64 {
        self.correct as f64 / self.prompts.max(1) as f64
    }
}

/// Every rank answers held-out prompts `rank, rank + world, ...` below `eval.prompts`, greedily;
/// the counts are summed over the ranks (every rank gets the same total). Deterministic: no
/// sampling, no state touched, so an eval never changes what training does next.
pub fn exact_match(
    model: &Gpt,
    source: &Source,
    eval: &Eval,
    group: &mut dyn StepCollective,
    device: Device,
) -> Result<Scored, EvalError> {
    let (rank, world) = (u64::from(group.rank().0), u64::from(group.world_size()));
    let context = model.config().context as usize;
    let mut correct = 0u64;
    let mut asked = 0u64;
    for i in (rank..u64::from(eval.prompts)).step_by(world as usize) {
        let Some(pair) = source.held_out(i, context + 1) else { continue };
        let answer = greedy(model, &pair.prompt, answer_len(source, &pair, eval), source.stop_token(), device)?;
        correct += u64::from(answer == pair.response);
        asked += 1;
    }
    if world > 1 {
        // Counts far below 2^24 are exact in f32.
        let mut counts = [correct as f32, asked as f32];
        group.all_reduce_sum(&mut counts)?;
        (correct, asked) = (counts[0] as u64, counts[1] as u64);
    }
    Ok(Scored { correct, prompts: asked })
}

/// How many tokens an answer may take: up to the stop token within `max_new_tokens`, or
/// exactly the response's length where the source has no stop token (JSONL bytes).
fn answer_len(source: &Source, pair: &Pair, eval: &Eval) -> usize {
    match source.stop_token() {
        Some(_) => eval.max_new_tokens as usize,
        None => pair.response.len(),
    }
}

/// The model's greedy continuation of `prompt`: at most `max_new` tokens, ending at `stop`
/// (included) when it comes. The window slides when the context is full.
pub fn greedy(
    model: &Gpt,
    prompt: &[i64],
    max_new: usize,
    stop: Option<i64>,
    device: Device,
) -> Result<Vec<i64>, TchError> {
    let _no_grad = tch::no_grad_guard();
    let context = model.config().context as usize;
    let mut tokens = prompt.to_vec();
    let mut out = Vec::with_capacity(max_new);
    for _ in 0..max_new {
        let window = &tokens[tokens.len().saturating_sub(context)..];
        let idx = Tensor::f_from_slice(window)?.f_view([1, window.len() as i64])?.f_to_device(device)?;
        let logits = model.forward(&idx)?;
        let next = logits.f_select(1, window.len() as i64 - 1)?.f_argmax(-1, false)?.f_int64_value(&[0])?;
        out.push(next);
        tokens.push(next);
        if Some(next) == stop {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_accuracy_counts_only_targets_that_are_not_ignored() {
        // Logits [1, 4, 3] whose argmax is 0, 1, 2, 0.
        let mut l = vec![0f32; 12];
        for (t, best) in [0usize, 1, 2, 0].iter().enumerate() {
            l[t * 3 + best] = 5.0;
        }
        let logits = Tensor::from_slice(&l).view([1, 4, 3]);
        let targets = Tensor::from_slice(&[IGNORE, 1, 0, 0]).view([1, 4]);
        // Right at positions 1 and 3, wrong at 2; position 0 does not count.
        let acc = token_accuracy(&logits, &targets).unwrap();
        assert!((acc - 2.0 / 3.0).abs() < 1e-9, "{acc}");
    }

    #[test]
    fn greedy_stops_at_the_stop_token_and_slides_past_the_context() {
        let cfg = crate::recipe::Model { n_layer: 1, n_head: 2, d_model: 16, context: 8, vocab: 16 };
        let model = Gpt::new(&cfg, 3).unwrap();
        let long = greedy(&model, &[1, 2, 3, 4, 5, 6, 7], 12, None, Device::Cpu).unwrap();
        assert_eq!(long.len(), 12);
        // The same model twice: the same answer (greedy is deterministic).
        assert_eq!(long, greedy(&model, &[1, 2, 3, 4, 5, 6, 7], 12, None, Device::Cpu).unwrap());
        let first = long[0];
        let stopped = greedy(&model, &[1, 2, 3, 4, 5, 6, 7], 12, Some(first), Device::Cpu).unwrap();
        assert_eq!(stopped, vec![first]);
    }
}
