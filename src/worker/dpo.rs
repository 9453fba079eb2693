//! Direct preference optimisation: the policy against a frozen reference (the run's starting
//! weights) on (chosen, rejected) rows, with TRL's metrics.
//!
//! A batch holds `n` chosen rows then the same items' `n` rejected rows (`data::Loader`); each
//! row's log-probability is the sum over its answer tokens (targets other than `IGNORE`).
use super::data::IGNORE;
use super::model::Gpt;
use tch::{Kind, TchError, Tensor};

/// The loss (a scalar to backpropagate) and the step's metrics, by TRL's names: `rewards/*`
/// are β × the policy's log-ratio to the reference, averaged over the rows.
pub fn loss(
    policy: &Gpt,
    reference: &Gpt,
    x: &Tensor,
    y: &Tensor,
    beta: f64,
) -> Result<(Tensor, Vec<(String, f64)>), TchError> {
    let rows = x.size()[0];
    let n = rows / 2;
    let logps = answer_logps(&policy.forward(x)?, y)?;
    let ref_logps = {
        let _no_grad = tch::no_grad_guard();
        answer_logps(&reference.forward(x)?, y)?
    };
    let (pc, pr) = (logps.f_narrow(0, 0, n)?, logps.f_narrow(0, n, n)?);
    let (rc, rr) = (ref_logps.f_narrow(0, 0, n)?, ref_logps.f_narrow(0, n, n)?);
    let chosen = pc.f_sub(&rc)?.f_mul_scalar(beta)?;
    let rejected = pr.f_sub(&rr)?.f_mul_scalar(beta)?;
    let margins = chosen.f_sub(&rejected)?;
    // −log σ(margin), averaged over the items.
    let loss = margins.f_log_sigmoid()?.f_neg()?.f_mean(Kind::Float)?;
    let _no_grad = tch::no_grad_guard();
    let mean = |t: &Tensor| t.f_mean(Kind::Float).and_then(|m| m.f_double_value(&[]));
    let metrics = vec![
        ("rewards/chosen".to_string(), mean(&chosen)?),
        ("rewards/rejected".to_string(), mean(&rejected)?),
        ("rewards/margins".to_string(), mean(&margins)?),
        ("rewards/accuracies".to_string(), mean(&margins.f_gt(0.0)?.f_to_kind(Kind::Float)?)?),
        ("logps/chosen".to_string(), mean(&pc)?),
        ("logps/rejected".to_string(), mean(&pr)?),
    ];
    Ok((loss, metrics))
}

/// Each row's summed log-probability of its target tokens: logits [R, T, V], targets [R, T].
fn answer_logps(logits: &Tensor, targets: &Tensor) -> Result<Tensor, TchError> {
    let mask = targets.f_ne(IGNORE)?;
    let safe = targets.f_where_scalarother(&mask, 0)?;
    let logp = logits.f_log_softmax(-1, Kind::Float)?.f_gather(2, &safe.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    logp.f_mul(&mask.f_to_kind(Kind::Float)?)?.f_sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn tiny() -> crate::recipe::Model {
        crate::recipe::Model { n_layer: 1, n_head: 2, d_model: 16, context: 8, vocab: 16 }
    }

    #[test]
    fn against_itself_the_loss_is_log_2_and_every_reward_zero() {
        let m = Gpt::new(&tiny(), 4).unwrap();
        let x = Tensor::from_slice(&[1i64, 2, 3, 4, 1, 2, 3, 4]).view([2, 4]);
        let y = Tensor::from_slice(&[IGNORE, IGNORE, 5, 6, IGNORE, IGNORE, 7, 8]).view([2, 4]);
        let (loss, metrics) = loss(&m, &m, &x, &y, 0.1).unwrap();
        assert!((loss.double_value(&[]) - 2f64.ln()).abs() < 1e-6);
        for (name, v) in &metrics {
            if name.starts_with("rewards/") {
                assert_eq!(*v, 0.0, "{name}");
            }
        }
        assert!(metrics.iter().any(|(n, v)| n == "logps/chosen" && *v < 0.0));
    }

    #[test]
    fn answer_logps_sum_only_the_answer_tokens_as_torch_would() {
        let m = Gpt::new(&tiny(), 4).unwrap();
        let x = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
        let y = Tensor::from_slice(&[IGNORE, 9, IGNORE, 11]).view([1, 4]);
        let logits = m.forward(&x).unwrap();
        let got = answer_logps(&logits, &y).unwrap().double_value(&[0]);
        let lp = logits.log_softmax(-1, Kind::Float);
        let want = lp.double_value(&[0, 1, 9]) + lp.double_value(&[0, 3, 11]);
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        let _ = Device::Cpu;
    }
}
