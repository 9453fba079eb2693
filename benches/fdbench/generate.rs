//! `generate`: GRPO's sampling (`worker::grpo::sample_group`) timed against `transformers`'
//! `generate` (benches/reference/generate_hf.py), and `generate-split`: where its time goes.
use anyhow::Context;
use flightdeck::recipe::Recipe;
use flightdeck::worker::grpo::{pick, sample_group};
use flightdeck::worker::model::{Gpt, KvCache};
use std::path::Path;
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

/// What one run measures: the recipe's model and group size, with these lengths.
pub struct Shape {
    pub threads: i32,
    pub reps: u64,
    /// Groups (one prompt each) per repetition.
    pub prompts: u64,
    pub prompt_len: usize,
    pub new_tokens: u32,
}

/// Mixed into the prompts' random tokens; generate_hf.py uses the same constant.
const PROMPT_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// `generate RECIPE_JSON THREADS REPS PROMPTS PROMPT_LEN NEW_TOKENS`: for each repetition,
/// PROMPTS groups of the recipe's `group_size` rows, each exactly NEW_TOKENS new tokens (no
/// stop token, as the reference has no eos); one JSON line per repetition.
pub fn main(recipe: &Path, shape: &Shape) -> anyhow::Result<()> {
    let (recipe, model) = setup(recipe, shape)?;
    let mut grpo = recipe.grpo.clone();
    grpo.max_new_tokens = shape.new_tokens;
    let vocab = i64::from(recipe.model.vocab);
    let run = |first: u64, count: u64| -> anyhow::Result<()> {
        for p in first..first + count {
            let rows = sample_group(
                &model,
                p,
                &prompt(p, shape.prompt_len, vocab),
                &grpo,
                recipe.train.seed,
                None,
                Device::Cpu,
            )?;
            anyhow::ensure!(rows.iter().all(|(t, _)| t.len() == shape.new_tokens as usize), "a row stopped early");
        }
        Ok(())
    };
    // Warm-up, as the reference: thread pool, allocator, first-touch.
    run(0, 2)?;
    for rep in 0..shape.reps {
        let t0 = Instant::now();
        run(rep * shape.prompts, shape.prompts)?;
        print_rep(rep, shape.prompts * u64::from(grpo.group_size) * u64::from(shape.new_tokens), t0.elapsed());
    }
    Ok(())
}

/// `generate-split ...` (the same arguments): `sample_group`'s loop with a clock around each
/// part, per generated position, summed over every group of every repetition: the prompt's
/// forward (prefill), each later token's `forward_cached`, the logits to a host `Vec<f32>`,
/// and `pick` for every row; and, untimed in the total, the prompt's forward on one row alone.
/// One JSON line at the end, in µs per position.
pub fn split(recipe: &Path, shape: &Shape) -> anyhow::Result<()> {
    let (recipe, model) = setup(recipe, shape)?;
    let _no_grad = tch::no_grad_guard();
    let g = i64::from(recipe.grpo.group_size);
    let vocab = i64::from(recipe.model.vocab);
    let mut clocks = [Duration::ZERO; 4];
    let mut prefill_one_row = Duration::ZERO;
    let mut next = vec![0i64; g as usize];
    let mut positions = 0u64;
    for p in 0..shape.reps * shape.prompts + 2 {
        let warm = p < 2;
        let mut lap = Lap(Instant::now());
        let mut cache = KvCache::default();
        let ids = prompt(p, shape.prompt_len, vocab);
        let idx = Tensor::f_from_slice(&ids)?.f_view([1, ids.len() as i64])?.f_repeat([g, 1])?;
        let mut logits = model.forward_cached(&idx, &mut cache)?.f_select(1, ids.len() as i64 - 1)?;
        let mut t = [lap.take(), Duration::ZERO, Duration::ZERO, Duration::ZERO];
        for pos in 0..shape.new_tokens {
            let host: Vec<f32> =
                Vec::try_from(logits.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?.f_contiguous()?.f_view([-1])?)?;
            t[2] += lap.take();
            for (j, n) in next.iter_mut().enumerate() {
                let u = (splitmix64(p ^ (u64::from(pos) << 8) ^ j as u64) >> 11) as f64 / (1u64 << 53) as f64;
                *n = pick(&host[j * vocab as usize..(j + 1) * vocab as usize], 1.0, 1.0, u);
            }
            t[3] += lap.take();
            if pos + 1 == shape.new_tokens {
                break;
            }
            let step = Tensor::f_from_slice(&next)?.f_view([g, 1])?;
            logits = model.forward_cached(&step, &mut cache)?.f_select(1, 0)?;
            t[1] += lap.take();
        }
        // The prompt's forward once, on one row: what prefill would cost if the group shared it.
        let one = Instant::now();
        let _logits = model.forward_cached(&idx.f_narrow(0, 0, 1)?, &mut KvCache::default())?;
        if !warm {
            positions += u64::from(shape.new_tokens);
            clocks.iter_mut().zip(t).for_each(|(c, d)| *c += d);
            prefill_one_row += one.elapsed();
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / positions as f64;
    let total: Duration = clocks.iter().sum();
    println!(
        "{}",
        serde_json::json!({
            "positions": positions, "rows": g, "prefill_us": per(clocks[0]), "forward_us": per(clocks[1]),
            "to_host_us": per(clocks[2]), "pick_us": per(clocks[3]), "total_us": per(total),
            "prefill_one_row_us": per(prefill_one_row), "params": model.num_params(),
        })
    );
    Ok(())
}

/// The recipe's model from its seed, with torch on `shape.threads` intra-op threads and one
/// inter-op thread, as the worker and the reference set them.
fn setup(path: &Path, shape: &Shape) -> anyhow::Result<(Recipe, Gpt)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read the recipe", path.display()))?;
    let recipe: Recipe = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a validated recipe as JSON (fdbench recipe FILE)", path.display()))?;
    let context = recipe.model.context as usize;
    anyhow::ensure!(
        shape.prompt_len >= 1 && shape.prompt_len + shape.new_tokens as usize <= context,
        "PROMPT_LEN {} + NEW_TOKENS {} must fit the context of {context} (and PROMPT_LEN ≥ 1)",
        shape.prompt_len,
        shape.new_tokens
    );
    tch::set_num_interop_threads(1);
    tch::set_num_threads(shape.threads);
    let model = Gpt::new(&recipe.model, recipe.train.seed)?;
    Ok((recipe, model))
}

/// Token i of prompt p: random tokens in the vocabulary, the same in generate_hf.py.
fn prompt(p: u64, len: usize, vocab: i64) -> Vec<i64> {
    (0..len as u64).map(|i| (splitmix64(PROMPT_SEED ^ (p << 32) ^ i) % vocab as u64) as i64).collect()
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn print_rep(rep: u64, tokens: u64, took: Duration) {
    let s = took.as_secs_f64();
    println!("{}", serde_json::json!({"rep": rep, "tokens": tokens, "seconds": s, "tokens_per_s": tokens as f64 / s}));
}

/// The time since the last `take`.
struct Lap(Instant);

impl Lap {
    fn take(&mut self) -> Duration {
        let now = Instant::now();
        now - std::mem::replace(&mut self.0, now)
    }
}
