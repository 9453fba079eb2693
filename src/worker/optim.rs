//! AdamW, its learning-rate schedule and global-norm clipping, owned by the worker.
//!
//! The optimizer keeps parameters, gradients and both moments as one flat buffer each: at
//! construction every parameter's storage moves into the flat one (the model's tensors stay
//! the same leaves, now views of it), and after the first backward every gradient is made a view
//! of the flat gradient, so autograd accumulates straight into it. The all-reduce works on that
//! buffer in place, the norm is one pass over it, and an update is a dozen whole-buffer kernels
//! instead of a dozen per parameter. The update is `torch.optim.AdamW`'s single-tensor step op
//! for op (decoupled weight decay, `lerp_`, `addcmul_`, bias correction, eps after the square
//! root, `addcdiv_`), so each element rounds as PyTorch's does. The moments the checkpoint saves
//! (`exp_avg`, `exp_avg_sq`) are per-parameter views of the flat moments, so resume is bit-exact.
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
    /// One view per parameter, in parameter order, of the flat first moment.
    pub exp_avg: Vec<Tensor>,
    /// As `exp_avg`, of the flat second moment.
    pub exp_avg_sq: Vec<Tensor>,
    flat: Flat,
}

/// The flat buffers and where each parameter lies in them.
struct Flat {
    params: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    spans: Vec<Span>,
    /// Runs of adjacent decayed parameters, as (offset, elements): one decay kernel per run.
    decay_runs: Vec<(i64, i64)>,
    /// Parameters with no gradient in the last backward (unused in the forward): PyTorch leaves
    /// those untouched, so an update with any of them goes parameter by parameter.
    missing: Vec<bool>,
}

struct Span {
    offset: i64,
    numel: i64,
    shape: Vec<i64>,
    decay: bool,
}

impl Flat {
    /// Where `span`'s gradient starts in the flat gradient (f32 elements).
    fn grad_ptr(&self, span: &Span) -> *mut std::ffi::c_void {
        self.grads.data_ptr().wrapping_byte_add(span.offset as usize * std::mem::size_of::<f32>())
    }
}

impl Span {
    fn of(&self, flat: &Tensor) -> Result<Tensor, TchError> {
        flat.f_narrow(0, self.offset, self.numel)?.f_view(self.shape.as_slice())
    }
}

impl AdamW {
    /// Moves every parameter's storage into one flat buffer (values unchanged) and makes the
    /// moments zero.
    pub fn new(params: &mut [Param], beta1: f64, beta2: f64, weight_decay: f64) -> Result<AdamW, TchError> {
        let _no_grad = tch::no_grad_guard();
        let mut spans = Vec::with_capacity(params.len());
        let mut offset = 0i64;
        for p in params.iter() {
            let numel = p.tensor.numel() as i64;
            spans.push(Span { offset, numel, shape: p.tensor.size(), decay: p.decay });
            offset += numel;
        }
        let pieces = params.iter().map(|p| p.tensor.f_detach()?.f_reshape([-1])).collect::<Result<Vec<_>, _>>()?;
        let flat_params = match pieces.is_empty() {
            true => Tensor::f_zeros([0], (Kind::Float, tch::Device::Cpu))?,
            false => Tensor::f_cat(&pieces, 0)?,
        };
        for (p, span) in params.iter_mut().zip(&spans) {
            p.tensor.f_set_data(&span.of(&flat_params)?)?;
        }
        let zeros = || flat_params.f_zeros_like();
        let (grads, exp_avg, exp_avg_sq) = (zeros()?, zeros()?, zeros()?);
        let views = |flat: &Tensor| spans.iter().map(|s| s.of(flat)).collect::<Result<Vec<_>, _>>();
        let (m_views, v_views) = (views(&exp_avg)?, views(&exp_avg_sq)?);
        let mut decay_runs: Vec<(i64, i64)> = Vec::new();
        for s in spans.iter().filter(|s| s.decay) {
            match decay_runs.last_mut() {
                Some((at, n)) if *at + *n == s.offset => *n += s.numel,
                _ => decay_runs.push((s.offset, s.numel)),
            }
        }
        let missing = vec![false; spans.len()];
        let flat = Flat { params: flat_params, grads, exp_avg, exp_avg_sq, spans, decay_runs, missing };
        Ok(AdamW { beta1, beta2, weight_decay, steps: 0, exp_avg: m_views, exp_avg_sq: v_views, flat })
    }

    pub fn from_recipe(params: &mut [Param], train: &Train) -> Result<AdamW, TchError> {
        AdamW::new(params, train.beta1, train.beta2, train.weight_decay)
    }

    /// Zeroes every gradient before a backward: the flat buffer in one kernel once the
    /// gradients are its views, else each gradient that exists.
    pub fn zero_grad(&mut self, params: &[Param]) -> Result<(), TchError> {
        if self.gradients_are_views(params)? {
            let _ = self.flat.grads.f_zero_()?;
            return Ok(());
        }
        for p in params {
            let mut g = p.tensor.f_grad()?;
            if g.defined() {
                let _ = g.f_zero_()?;
            }
        }
        Ok(())
    }

    /// Makes the flat gradient hold this backward's gradients: a gradient autograd made anew
    /// (the first backward) is copied in and becomes a view of the flat buffer, so later
    /// backwards accumulate into it directly; a missing one is zero there.
    pub fn gather_grads(&mut self, params: &[Param]) -> Result<(), TchError> {
        let _no_grad = tch::no_grad_guard();
        for (i, (p, span)) in params.iter().zip(&self.flat.spans).enumerate() {
            let mut g = p.tensor.f_grad()?;
            let mut slot = span.of(&self.flat.grads)?;
            self.flat.missing[i] = !g.defined();
            if !g.defined() {
                let _ = slot.f_zero_()?;
            } else if g.data_ptr() != self.flat.grad_ptr(span) {
                slot.f_copy_(&g)?;
                g.f_set_data(&slot)?;
            }
        }
        Ok(())
    }

    fn gradients_are_views(&self, params: &[Param]) -> Result<bool, TchError> {
        for (p, span) in params.iter().zip(&self.flat.spans) {
            let g = p.tensor.f_grad()?;
            if !g.defined() || g.data_ptr() != self.flat.grad_ptr(span) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The flat gradient (after `gather_grads`): what the all-reduce averages in place.
    pub fn grads_mut(&mut self) -> &mut Tensor {
        &mut self.flat.grads
    }

    /// The global L2 norm of the gathered gradients, before clipping, in one pass; if
    /// `max_norm` > 0 and the norm exceeds it, scales them by max_norm / (norm + 1e-6), as
    /// `clip_grad_norm_` does.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64, TchError> {
        let _no_grad = tch::no_grad_guard();
        // Reads the norm back to the host: a synchronisation point on a GPU.
        let norm = self.flat.grads.f_norm()?.f_double_value(&[])?;
        if max_norm > 0.0 {
            let coef = max_norm / (norm + 1e-6);
            if coef < 1.0 {
                let _ = self.flat.grads.f_mul_scalar_(coef)?;
            }
        }
        Ok(norm)
    }

    /// One update at learning rate `lr` from the gathered gradients. A parameter without a
    /// gradient is left untouched (moments included), as PyTorch leaves it.
    pub fn step(&mut self, lr: f64) -> Result<(), TchError> {
        let _no_grad = tch::no_grad_guard();
        self.steps += 1;
        let t = self.steps as i32;
        let k = Update {
            beta1: self.beta1,
            beta2: self.beta2,
            step_size: lr / (1.0 - self.beta1.powi(t)),
            bias2_sqrt: (1.0 - self.beta2.powi(t)).sqrt(),
        };
        let decay = 1.0 - lr * self.weight_decay;
        let f = &mut self.flat;
        if !f.missing.iter().any(|m| *m) {
            if self.weight_decay != 0.0 {
                for &(at, n) in &f.decay_runs {
                    let _ = f.params.f_narrow(0, at, n)?.f_mul_scalar_(decay)?;
                }
            }
            return k.apply(&mut f.params, &f.grads, &mut f.exp_avg, &mut f.exp_avg_sq);
        }
        for (span, _) in f.spans.iter().zip(&f.missing).filter(|(_, missing)| !**missing) {
            let mut p = span.of(&f.params)?;
            if span.decay && self.weight_decay != 0.0 {
                let _ = p.f_mul_scalar_(decay)?;
            }
            k.apply(&mut p, &span.of(&f.grads)?, &mut span.of(&f.exp_avg)?, &mut span.of(&f.exp_avg_sq)?)?;
        }
        Ok(())
    }
}

/// One AdamW step's constants.
struct Update {
    beta1: f64,
    beta2: f64,
    /// lr / (1 - β1ᵗ)
    step_size: f64,
    /// √(1 - β2ᵗ)
    bias2_sqrt: f64,
}

impl Update {
    /// `torch.optim.adamw._single_tensor_adamw` after the decay, op for op: the scalar factors
    /// of `addcmul_` and `addcdiv_` (whose tch bindings take none) are folded into their first
    /// tensor, which rounds the same, since PyTorch multiplies the value into that tensor first.
    fn apply(&self, p: &mut Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor) -> Result<(), TchError> {
        // m ← lerp(m, g, 1-β1) ;  v ← β2·v + (1-β2)·g·g
        let _ = m.f_lerp_(g, 1.0 - self.beta1)?;
        let _ = v.f_mul_scalar_(self.beta2)?;
        let _ = v.f_addcmul_(&g.f_mul_scalar(1.0 - self.beta2)?, g)?;
        // p ← p − step_size · m / (√v / √(1-β2ᵗ) + eps)
        let mut denom = v.f_sqrt()?;
        let _ = denom.f_div_scalar_(self.bias2_sqrt)?;
        let _ = denom.f_add_scalar_(EPS)?;
        let _ = p.f_addcdiv_(&m.f_mul_scalar(-self.step_size)?, &denom)?;
        Ok(())
    }
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
            threads: 0,
        }
    }

    fn param(values: &[f32], decay: bool) -> Param {
        Param { name: "p".into(), tensor: Tensor::from_slice(values).set_requires_grad(true), decay }
    }

    fn set_grad(p: &Param, g: &[f32]) {
        // d/dp Σ p·g = g
        (&p.tensor * Tensor::from_slice(g)).sum(Kind::Float).backward();
    }

    /// One backward's gradients `gs` (per parameter, None = unused), as the training loop takes
    /// them: zeroed, accumulated by autograd, gathered into the flat buffer.
    fn backward(opt: &mut AdamW, ps: &[Param], gs: &[Option<&[f32]>]) {
        opt.zero_grad(ps).unwrap();
        for (p, g) in ps.iter().zip(gs) {
            if let Some(g) = g {
                set_grad(p, g);
            }
        }
        opt.gather_grads(ps).unwrap();
    }

    #[test]
    fn adamw_matches_hand_computed_updates() {
        let (b1, b2, wd, lr) = (0.9f64, 0.95f64, 0.1f64, 0.01f64);
        let mut ps = vec![param(&[1.0, -2.0], true), param(&[0.5], false)];
        let mut opt = AdamW::new(&mut ps, b1, b2, wd).unwrap();
        let grads = [[0.5f64, -1.0], [0.25, 2.0], [-1.5, 0.75]];
        let mut want = [1.0f64, -2.0];
        let mut want_bias = 0.5f64;
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for (t, g) in grads.iter().enumerate() {
            backward(&mut opt, &ps, &[Some(&[g[0] as f32, g[1] as f32]), Some(&[1.0])]);
            opt.step(lr).unwrap();
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
        assert_eq!(opt.steps, 3);
        // The model's tensors are still leaves, now views of the flat buffers, gradients too.
        assert!(ps.iter().all(|p| p.tensor.is_leaf() && p.tensor.requires_grad()));
        assert!(opt.gradients_are_views(&ps).unwrap(), "autograd accumulates into the flat gradient");
        assert_eq!(Vec::<f32>::try_from(&opt.exp_avg[1]).unwrap().len(), 1);
    }

    #[test]
    fn a_parameter_without_a_gradient_is_left_untouched() {
        let mut ps = vec![param(&[1.0, -2.0], true), param(&[0.5], true)];
        let mut opt = AdamW::new(&mut ps, 0.9, 0.95, 0.1).unwrap();
        // The second parameter is never used in a forward: autograd gives it no gradient, and
        // neither it nor its moments may move (PyTorch skips a parameter whose grad is None).
        for _ in 0..2 {
            backward(&mut opt, &ps, &[Some(&[0.5, -1.0]), None]);
            let first = Vec::<f32>::try_from(&ps[0].tensor.detach()).unwrap();
            opt.step(0.01).unwrap();
            assert_ne!(Vec::<f32>::try_from(&ps[0].tensor.detach()).unwrap(), first, "the used one moves");
        }
        assert_eq!((ps[1].tensor.double_value(&[0]), opt.exp_avg_sq[1].double_value(&[0])), (0.5, 0.0));
    }

    #[test]
    fn clipping_reports_the_pre_clip_norm_and_scales_down() {
        let mut ps = vec![param(&[0.0, 0.0], true), param(&[0.0], false)];
        let mut opt = AdamW::new(&mut ps, 0.9, 0.95, 0.1).unwrap();
        backward(&mut opt, &ps, &[Some(&[3.0, 0.0]), Some(&[4.0])]);
        let norm = opt.clip_grad_norm(1.0).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        let after = opt.clip_grad_norm(0.0).unwrap();
        assert!((after - 1.0).abs() < 1e-5, "{after}");
        // Off (0) leaves gradients alone; the parameters' own gradients are the clipped ones.
        assert!((opt.clip_grad_norm(0.0).unwrap() - after).abs() < 1e-9);
        assert!((ps[1].tensor.grad().double_value(&[0]) - 0.8).abs() < 1e-5);
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
