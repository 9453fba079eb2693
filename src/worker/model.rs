//! The GPT: pre-LayerNorm blocks, fused-qkv causal attention, tied embeddings (nanoGPT's shape).
//!
//! Parameters are plain leaf tensors in a fixed, named order (no `VarStore`): the optimizer and
//! the gradient buckets walk them in that order, identically on every rank, and a checkpoint can
//! name them.
use crate::recipe::Model;
use std::sync::Mutex;
use tch::{Device, Kind, TchError, Tensor};

/// One trainable tensor. `decay` says whether AdamW's weight decay applies to it.
pub struct Param {
    pub name: String,
    pub tensor: Tensor,
    pub decay: bool,
}

struct Block {
    ln1_w: Tensor,
    ln1_b: Tensor,
    /// [3·d, d]: q, k and v projections in one matmul.
    qkv_w: Tensor,
    qkv_b: Tensor,
    proj_w: Tensor,
    proj_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
    fc_w: Tensor,
    fc_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
}

pub struct Gpt {
    cfg: Model,
    /// [vocab, d]: the token embedding and, tied, the output head.
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    lnf_w: Tensor,
    lnf_b: Tensor,
    /// Shallow clones of every tensor above (same storage and grad), in init order.
    params: Vec<Param>,
}

/// `tch::manual_seed` sets the process-wide CPU generator. Initialisation holds this lock so two
/// models built at once in one process (tests, in-process ranks) each draw an unbroken stream.
static INIT_LOCK: Mutex<()> = Mutex::new(());

const LN_EPS: f64 = 1e-5;

impl Gpt {
    /// Initialises from `seed`, nanoGPT's way: normal(0, 0.02) weights and embeddings,
    /// residual output projections at 0.02/√(2·n_layer), zero biases, unit LayerNorm gains.
    /// The same seed gives bit-identical weights on every rank.
    pub fn new(cfg: &Model, seed: u64) -> Result<Gpt, TchError> {
        Gpt::new_on(cfg, seed, Device::Cpu)
    }

    /// As `new`, with the parameters on `device`. Initialised on the CPU either way, so a GPU
    /// rank starts from exactly the weights a CPU rank would.
    pub fn new_on(cfg: &Model, seed: u64, device: Device) -> Result<Gpt, TchError> {
        let _guard = INIT_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tch::manual_seed(seed as i64);
        let d = i64::from(cfg.d_model);
        let std = 0.02;
        let resid_std = 0.02 / (2.0 * f64::from(cfg.n_layer)).sqrt();
        let mut params = Vec::new();
        let mut add = |name: String, t: Tensor, decay: bool| -> Result<Tensor, TchError> {
            let t = t.f_to_device(device)?.f_set_requires_grad(true)?;
            params.push(Param { name, tensor: t.shallow_clone(), decay });
            Ok(t)
        };
        // The tied embedding is decayed: it is also the output head's weight matrix, and
        // nanoGPT (which decays every ≥2-D tensor) trains well so. Position embeddings are not.
        let wte = add("wte".into(), normal(&[i64::from(cfg.vocab), d], std)?, true)?;
        let wpe = add("wpe".into(), normal(&[i64::from(cfg.context), d], std)?, false)?;
        let mut blocks = Vec::new();
        for l in 0..cfg.n_layer {
            let p = |s: &str| format!("h.{l}.{s}");
            blocks.push(Block {
                ln1_w: add(p("ln_1.weight"), ones(d)?, false)?,
                ln1_b: add(p("ln_1.bias"), zeros(d)?, false)?,
                qkv_w: add(p("attn.c_attn.weight"), normal(&[3 * d, d], std)?, true)?,
                qkv_b: add(p("attn.c_attn.bias"), zeros(3 * d)?, false)?,
                proj_w: add(p("attn.c_proj.weight"), normal(&[d, d], resid_std)?, true)?,
                proj_b: add(p("attn.c_proj.bias"), zeros(d)?, false)?,
                ln2_w: add(p("ln_2.weight"), ones(d)?, false)?,
                ln2_b: add(p("ln_2.bias"), zeros(d)?, false)?,
                fc_w: add(p("mlp.c_fc.weight"), normal(&[4 * d, d], std)?, true)?,
                fc_b: add(p("mlp.c_fc.bias"), zeros(4 * d)?, false)?,
                out_w: add(p("mlp.c_proj.weight"), normal(&[d, 4 * d], resid_std)?, true)?,
                out_b: add(p("mlp.c_proj.bias"), zeros(d)?, false)?,
            });
        }
        let lnf_w = add("ln_f.weight".into(), ones(d)?, false)?;
        let lnf_b = add("ln_f.bias".into(), zeros(d)?, false)?;
        Ok(Gpt { cfg: cfg.clone(), wte, wpe, blocks, lnf_w, lnf_b, params })
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut [Param] {
        &mut self.params
    }

    pub fn num_params(&self) -> usize {
        self.params.iter().map(|p| p.tensor.numel()).sum()
    }

    /// Logits [B, T, vocab] for token ids [B, T] (T ≤ context).
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor, TchError> {
        self.run(idx, None)
    }

    /// Logits [B, T, vocab] of the tokens `idx` [B, T] that follow the ones in `cache`, whose
    /// keys and values are appended to it: generation without recomputing the prefix. The
    /// first call (an empty cache) takes the whole prompt; each later one takes one token.
    pub fn forward_cached(&self, idx: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let t = idx.size2()?.1;
        if cache.len > 0 && t != 1 {
            return Err(TchError::Shape(format!(
                "forward_cached: {t} new tokens after {} cached ones (after the prompt, one at a time)",
                cache.len
            )));
        }
        if cache.len + t > i64::from(self.cfg.context) {
            return Err(TchError::Shape(format!(
                "forward_cached: {} tokens exceed the context of {}",
                cache.len + t,
                self.cfg.context
            )));
        }
        self.run(idx, Some(cache))
    }

    fn run(&self, idx: &Tensor, mut cache: Option<&mut KvCache>) -> Result<Tensor, TchError> {
        let (b, t) = idx.size2()?;
        let d = i64::from(self.cfg.d_model);
        let h = i64::from(self.cfg.n_head);
        let past = cache.as_ref().map_or(0, |c| c.len);
        let tok = Tensor::f_embedding(&self.wte, idx, -1, false, false)?;
        let pos = self.wpe.f_narrow(0, past, t)?;
        let mut x = tok.f_add(&pos)?;
        for (l, blk) in self.blocks.iter().enumerate() {
            // Attention: one fused projection, split into heads [B, H, T, d/H].
            let a = x.f_layer_norm([d], Some(&blk.ln1_w), Some(&blk.ln1_b), LN_EPS, false)?;
            let qkv = a.f_linear(&blk.qkv_w, Some(&blk.qkv_b))?.f_split(d, 2)?;
            let heads = |t_: &Tensor| t_.f_view([b, t, h, d / h])?.f_transpose(1, 2);
            let (q, mut k, mut v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
            if let Some(c) = cache.as_deref_mut() {
                if let Some((pk, pv)) = c.layers.get(l) {
                    k = Tensor::f_cat(&[pk, &k], 2)?;
                    v = Tensor::f_cat(&[pv, &v], 2)?;
                }
                let kv = (k.shallow_clone(), v.shallow_clone());
                match c.layers.get_mut(l) {
                    Some(slot) => *slot = kv,
                    None => c.layers.push(kv),
                }
            }
            // One new token attends to everything before it: no mask; a prompt is causal.
            let causal = t > 1;
            let y =
                Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, causal, None::<f64>, false)?;
            let y = y.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, d])?;
            x = x.f_add(&y.f_linear(&blk.proj_w, Some(&blk.proj_b))?)?;
            // MLP: 4·d with exact GELU.
            let m = x.f_layer_norm([d], Some(&blk.ln2_w), Some(&blk.ln2_b), LN_EPS, false)?;
            let m = m.f_linear(&blk.fc_w, Some(&blk.fc_b))?.f_gelu("none")?;
            x = x.f_add(&m.f_linear(&blk.out_w, Some(&blk.out_b))?)?;
        }
        if let Some(c) = cache {
            c.len += t;
        }
        let x = x.f_layer_norm([d], Some(&self.lnf_w), Some(&self.lnf_b), LN_EPS, false)?;
        x.f_linear(&self.wte, None::<Tensor>)
    }

    /// Mean cross-entropy over every position of the batch whose target is not -100 (a scalar
    /// tensor).
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor, TchError> {
        self.loss_and_logits(idx, targets).map(|(loss, _)| loss)
    }

    /// `loss`, and the logits it came from (for the token accuracy).
    pub fn loss_and_logits(&self, idx: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor), TchError> {
        let logits = self.forward(idx)?;
        let v = i64::from(self.cfg.vocab);
        let loss = logits.f_view([-1, v])?.f_log_softmax(-1, Kind::Float)?.f_nll_loss(
            &targets.f_view([-1])?,
            None::<Tensor>,
            tch::Reduction::Mean,
            super::data::IGNORE,
        )?;
        Ok((loss, logits))
    }

    pub fn config(&self) -> &Model {
        &self.cfg
    }
}

/// Every layer's keys and values, [B, H, T, d/H] each, for the `len` tokens seen so far.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: i64,
}

impl KvCache {
    /// The tokens cached: the next one's position.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn normal(dims: &[i64], std: f64) -> Result<Tensor, TchError> {
    Tensor::f_empty(dims, (Kind::Float, Device::Cpu))?.f_normal_(0.0, std)
}

fn zeros(n: i64) -> Result<Tensor, TchError> {
    Tensor::f_zeros([n], (Kind::Float, Device::Cpu))
}

fn ones(n: i64) -> Result<Tensor, TchError> {
    Tensor::f_ones([n], (Kind::Float, Device::Cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tiny() -> Model {
        Model { n_layer: 2, n_head: 2, d_model: 32, context: 16, vocab: 16 }
    }

    #[test]
    fn forward_shapes_and_initial_loss_near_ln_vocab() {
        let m = Gpt::new(&tiny(), 1).unwrap();
        let idx = Tensor::from_slice(&(0..48).map(|i| i % 16).collect::<Vec<i64>>()).view([3, 16]);
        let logits = m.forward(&idx).unwrap();
        assert_eq!(logits.size(), vec![3, 16, 16]);
        // Shorter than the context works too (positions are sliced).
        assert_eq!(m.forward(&idx.narrow(1, 0, 5)).unwrap().size(), vec![3, 5, 16]);
        // Targets unlike the inputs: tied embeddings favour repeating the input token a little.
        let targets = (&idx + 5).remainder(16);
        let loss = m.loss(&idx, &targets).unwrap().double_value(&[]);
        assert!((loss - 16f64.ln()).abs() < 0.1, "initial loss {loss} vs ln 16");
    }

    #[test]
    fn a_cached_forward_gives_the_full_forwards_logits() {
        let m = Gpt::new(&tiny(), 2).unwrap();
        let _no_grad = tch::no_grad_guard();
        let tokens: Vec<i64> = vec![3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
        let idx = Tensor::from_slice(&tokens).view([1, 10]);
        let full = m.forward(&idx).unwrap();
        let mut cache = KvCache::default();
        let prefill = m.forward_cached(&idx.narrow(1, 0, 6), &mut cache).unwrap();
        assert!(prefill.allclose(&full.narrow(1, 0, 6), 1e-5, 1e-5, false));
        for p in 6..10 {
            let one = m.forward_cached(&idx.narrow(1, p, 1), &mut cache).unwrap();
            assert!(one.allclose(&full.narrow(1, p, 1), 1e-5, 1e-5, false), "position {p}");
        }
        assert_eq!(cache.len(), 10);
        // Two tokens after the prompt, or past the context, are refused, not miscomputed.
        assert!(m.forward_cached(&idx.narrow(1, 0, 2), &mut cache).is_err());
        let mut long = KvCache::default();
        let too_long = Tensor::from_slice(&[1i64; 17]).view([1, 17]);
        assert!(m.forward_cached(&too_long, &mut long).is_err());
    }

    #[test]
    fn init_is_seeded_named_and_tied() {
        let a = Gpt::new(&tiny(), 5).unwrap();
        let b = Gpt::new(&tiny(), 5).unwrap();
        let c = Gpt::new(&tiny(), 6).unwrap();
        assert_eq!(a.params().len(), 2 + 12 * 2 + 2);
        for (p, q) in a.params().iter().zip(b.params()) {
            assert_eq!(p.name, q.name);
            assert!(p.tensor.equal(&q.tensor), "{}", p.name);
        }
        assert!(!a.params()[0].tensor.equal(&c.params()[0].tensor));
        // No separate lm_head: vocab·d counted once.
        let d = 32;
        let per_block = 2 * d + 3 * d * d + 3 * d + d * d + d + 2 * d + 4 * d * d + 4 * d + 4 * d * d + d;
        assert_eq!(a.num_params(), 16 * d + 16 * d + 2 * per_block + 2 * d);
        let proj = &a.params()[6];
        assert_eq!(proj.name, "h.0.attn.c_proj.weight");
        let s = proj.tensor.std(true).double_value(&[]);
        assert!((s - 0.01).abs() < 0.002, "residual std {s}");
    }
}
