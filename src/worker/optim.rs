//! AdamW, its learning-rate schedule and global-norm clipping, owned by the worker.
//!
//! The moments are explicit tensors, one pair per parameter in the model's parameter order, so a
//! checkpoint can save and restore them and resume is bit-exact. The update is PyTorch's AdamW
//! (decoupled weight decay, bias correction, eps added after the square root).
use super::model::Param;
use crate::recipe::{Schedule, Train};
use tch::{Kind, TchError, Tensor};

pub const EPS: f64 = 1e-8;

pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    /// Updates applied so far (the bias-correction exponent).
    pub steps: u64,
    pub exp_avg: Vec<Tensor>,
    pub exp_avg_sq: Vec<Tensor>,
}

impl AdamW {
    pub fn new(params: &[Param], beta1: f64, beta2: f64, weight_decay: f64) -> Result<AdamW, TchError> {
        let zeros = || -> Result<Vec<Tensor>, TchError> { params.iter().map(|p| p.tensor.f_zeros_like()).collect() };
        Ok(AdamW { beta1, beta2, weight_decay, steps: 0, exp_avg: zeros()?, exp_avg_sq: zeros()? })
    }

    pub fn from_recipe(params: &[Param], train: &Train) -> Result<AdamW, TchError> {
        AdamW::new(params, train.beta1, train.beta2, train.weight_decay)
    }

    /// One update at learning rate `lr` from the gradients now on `params`. A parameter without
    /// a gradient (unused in the forward) is left untouched.
    pub fn step(&mut self, params: &mut [Param], lr: f64) -> Result<(), TchError> {
        let _no_grad = tch::no_grad_guard();
        self.steps += 1;
        let t = self.steps as i32;
        let bias1 = 1.0 - self.beta1.powi(t);
        let bias2 = 1.0 - self.beta2.powi(t);
        let step_size = lr / bias1;
        let bias2_sqrt = bias2.sqrt();
        for ((p, m), v) in params.iter_mut().zip(&mut self.exp_avg).zip(&mut self.exp_avg_sq) {
            let g = p.tensor.f_grad()?;
            if !g.defined() {
                continue;
            }
            if p.decay && self.weight_decay != 0.0 {
                let _ = p.tensor.f_mul_scalar_(1.0 - lr * self.weight_decay)?;
            }
            // m ← β1·m + (1-β1)·g ;  v ← β2·v + (1-β2)·g²
            let _ = m.f_lerp_(&g, 1.0 - self.beta1)?;
            let _ = v.f_mul_scalar_(self.beta2)?;
            let _ = v.f_add_(&g.f_square()?.f_mul_scalar(1.0 - self.beta2)?)?;
            // p ← p − lr/(1-β1ᵗ) · m / (√v/√(1-β2ᵗ) + eps)
            let mut denom = v.f_sqrt()?.f_div_scalar(bias2_sqrt)?;
            let _ = denom.f_add_scalar_(EPS)?;
            let _ = p.tensor.f_sub_(&m.f_div(&denom)?.f_mul_scalar(step_size)?)?;
        }
        Ok(())
    }
}

/// Sets every parameter's gradient to zero (kept allocated: the buckets reuse the same layout).
pub fn zero_grad(params: &mut [Param]) -> Result<(), TchError> {
    for p in params {
        let mut g = p.tensor.f_grad()?;
        if g.defined() {
            let _ = g.f_zero_()?;
        }
    }
    Ok(())
}

/// The global L2 norm of all gradients, before clipping; if `max_norm` > 0 and the norm exceeds
/// it, scales every gradient by max_norm / (norm + 1e-6), as `clip_grad_norm_` does.
pub fn clip_grad_norm(params: &mut [Param], max_norm: f64) -> Result<f64, TchError> {
    let _no_grad = tch::no_grad_guard();
    let mut sum_sq = Tensor::f_zeros([], (Kind::Float, tch::Device::Cpu))?;
    let mut grads = Vec::with_capacity(params.len());
    for p in params.iter() {
        let g = p.tensor.f_grad()?;
        if g.defined() {
            sum_sq = sum_sq.f_add(&g.f_square()?.f_sum(Kind::Float)?)?;
            grads.push(g);
        }
    }
    // Reads the norm back to the host: a synchronisation point on a GPU.
    let norm = sum_sq.f_sqrt()?.f_double_value(&[])?;
    if max_norm > 0.0 {
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for g in &mut grads {
                let _ = g.f_mul_scalar_(coef)?;
            }
        }
    }
    Ok(norm)
}

/// The learning rate at `step` (from 1): linear warmup to `lr` over `warmup` steps, then the
/// schedule down to `min_lr` at `steps` (cosine, linear) or flat at `lr` (constant).
pub fn lr_at(train: &Train, step: u64) -> f64 {
    if train.warmup > 0 && step <= train.warmup {
        return train.lr * step as f64 / train.warmup as f64;
    }
    let span = train.steps.saturating_sub(train.warmup);
    if span == 0 {
        return train.lr;
    }
    let progress = (step.saturating_sub(train.warmup) as f64 / span as f64).clamp(0.0, 1.0);
    let (hi, lo) = (train.lr, train.min_lr);
    match train.schedule {
        Schedule::Constant => hi,
        Schedule::Linear => hi - progress * (hi - lo),
        Schedule::Cosine => lo + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (hi - lo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Dtype;

    pub(crate) fn train(schedule: Schedule) -> Train {
        Train {
            steps: 100,
            batch_per_rank: 4,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 10,
            schedule,
            grad_clip: 1.0,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            seed: 1,
            dtype: Dtype::Fp32,
        }
    }

    fn param(values: &[f32], decay: bool) -> Param {
        Param { name: "p".into(), tensor: Tensor::from_slice(values).set_requires_grad(true), decay }
    }

    fn set_grad(p: &Param, g: &[f32]) {
        // d/dp Σ p·g = g
        (&p.tensor * Tensor::from_slice(g)).sum(Kind::Float).backward();
    }

    #[test]
    fn adamw_matches_hand_computed_updates() {
        let (b1, b2, wd, lr) = (0.9f64, 0.95f64, 0.1f64, 0.01f64);
        let mut ps = vec![param(&[1.0, -2.0], true), param(&[0.5], false)];
        let mut opt = AdamW::new(&ps, b1, b2, wd).unwrap();
        let grads = [[0.5f64, -1.0], [0.25, 2.0]];
        let mut want = [1.0f64, -2.0];
        let mut want_bias = 0.5f64;
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for (t, g) in grads.iter().enumerate() {
            zero_grad(&mut ps).unwrap();
            set_grad(&ps[0], &[g[0] as f32, g[1] as f32]);
            set_grad(&ps[1], &[1.0]);
            opt.step(&mut ps, lr).unwrap();
            let t = t as i32 + 1;
            for i in 0..2 {
                want[i] *= 1.0 - lr * wd;
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let mh = m[i] / (1.0 - b1.powi(t));
                let vh = v[i] / (1.0 - b2.powi(t));
                want[i] -= lr * mh / (vh.sqrt() + EPS);
            }
            // Constant gradient 1 and no decay: Adam moves it by exactly lr each step.
            want_bias -= lr;
        }
        let got = Vec::<f32>::try_from(&ps[0].tensor.detach()).unwrap();
        for i in 0..2 {
            assert!((f64::from(got[i]) - want[i]).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        let bias = ps[1].tensor.double_value(&[0]);
        assert!((bias - want_bias).abs() < 1e-6, "{bias} vs {want_bias}");
        assert_eq!(opt.steps, 2);
    }

    #[test]
    fn clipping_reports_the_pre_clip_norm_and_scales_down() {
        let mut ps = vec![param(&[0.0, 0.0], true), param(&[0.0], false)];
        set_grad(&ps[0], &[3.0, 0.0]);
        set_grad(&ps[1], &[4.0]);
        let norm = clip_grad_norm(&mut ps, 1.0).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        let after = clip_grad_norm(&mut ps, 0.0).unwrap();
        assert!((after - 1.0).abs() < 1e-5, "{after}");
        // Off (0) leaves gradients alone.
        assert!((clip_grad_norm(&mut ps, 0.0).unwrap() - after).abs() < 1e-9);
    }

    #[test]
    fn schedule_endpoints() {
        for s in [Schedule::Cosine, Schedule::Linear, Schedule::Constant] {
            let t = train(s);
            assert!((lr_at(&t, 1) - 1e-4).abs() < 1e-12, "{s:?} warmup starts at lr/warmup");
            assert!((lr_at(&t, 10) - 1e-3).abs() < 1e-12, "{s:?} peak at end of warmup");
            let end = if s == Schedule::Constant { 1e-3 } else { 1e-4 };
            assert!((lr_at(&t, 100) - end).abs() < 1e-12, "{s:?} at the last step");
        }
        let t = train(Schedule::Cosine);
        assert!((lr_at(&t, 55) - 5.5e-4).abs() < 1e-12, "cosine midpoint");
        let t = train(Schedule::Linear);
        assert!((lr_at(&t, 55) - 5.5e-4).abs() < 1e-12, "linear midpoint");
        let mut t = train(Schedule::Cosine);
        t.warmup = 0;
        assert!((lr_at(&t, 1) - 1e-3).abs() < 1e-6);
    }
}
