//! Training data: deterministic sequences by global index, sharded by rank, with a position.
//!
//! No tch here: sequences are plain `Vec<i64>` so the sharding and determinism rules are unit
//! tested without libtorch. Every sequence is a pure function of (data seed, global sequence
//! index), so the data position is a single integer and resume is exact on any topology.
//! Fine-tuning data is (prompt, response) pairs (`Pair`), by index the same way; a pair's row
//! is padded to the context and only its response tokens are targets (the rest `IGNORE`).
use super::{arith, synthetic_tokens};
use crate::recipe::{DataSource, FILE_VOCAB, SYNTHETIC_GENERATORS};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("data.source \"synthetic:{name}\": no such generator (valid: {valid})")]
    UnknownGenerator { name: String, valid: String },
    #[error("data.source \"file:{}\": {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "data.source \"file:{}\": {len} bytes is shorter than one sequence (model.context + 1 = {need})",
        path.display()
    )]
    TooShort { path: PathBuf, len: usize, need: usize },
    #[error("data.source \"file:{}\" line {line}: {reason}", path.display())]
    BadPair { path: PathBuf, line: usize, reason: String },
    #[error(
        "data.source \"file:{}\": {pairs} pairs leave none to train on after the {held_out} held out for the eval \
         (eval.prompts); lower eval.prompts or add pairs",
        path.display()
    )]
    TooFewPairs { path: PathBuf, pairs: usize, held_out: usize },
}

/// A target the loss and the accuracy skip (a prompt token, padding): PyTorch's ignore_index.
pub const IGNORE: i64 = -100;

/// One fine-tuning example: the model reads `prompt` and learns to answer `response`.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    pub prompt: Vec<i64>,
    pub response: Vec<i64>,
}

/// One preference example for DPO: for `prompt`, `chosen` is preferred over `rejected`.
#[derive(Clone, Debug, PartialEq)]
pub struct Preference {
    pub prompt: Vec<i64>,
    pub chosen: Vec<i64>,
    pub rejected: Vec<i64>,
}

/// A JSONL line of a fine-tuning file: `{"prompt": "...", "response": "..."}`, or for DPO
/// `{"prompt": "...", "chosen": "...", "rejected": "..."}` (bytes are tokens).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PairLine {
    prompt: String,
    #[serde(default)]
    response: Option<String>,
    #[serde(default)]
    chosen: Option<String>,
    #[serde(default)]
    rejected: Option<String>,
}

/// Where sequences come from.
pub enum Source {
    Arith {
        seed: u64,
    },
    /// `synthetic:tokens`, over GPT-2's vocabulary.
    Tokens {
        seed: u64,
    },
    /// The file's bytes are the tokens (vocabulary `FILE_VOCAB`).
    File {
        bytes: Vec<u8>,
        seed: u64,
    },
    /// `synthetic:arith-qa`: pairs from `arith::qa`; held-out pairs are indices from
    /// `HELD_OUT_BASE` on (which no run reaches) under `HELD_OUT_SEED`.
    ArithQa {
        seed: u64,
    },
    /// A JSONL file's pairs: the last `held_out.len()` lines are the eval's, the rest are drawn
    /// from (with replacement) by index.
    Pairs {
        train: Vec<Pair>,
        held_out: Vec<Pair>,
        seed: u64,
    },
    /// `synthetic:arith-qa` for DPO: `arith::preference` items (held out as `ArithQa`'s).
    ArithPref {
        seed: u64,
    },
    /// A JSONL file's preferences, split and drawn as `Pairs` (held out: prompt and chosen).
    Preferences {
        train: Vec<Preference>,
        held_out: Vec<Pair>,
        seed: u64,
    },
}

/// Where the arithmetic held-out indices begin.
const HELD_OUT_BASE: u64 = 1 << 62;
/// The arithmetic held-out questions are drawn with this seed, not data.seed: every arith run
/// of a chain (pretrain, sft, ...) is scored on the same questions, so their evals compare.
const HELD_OUT_SEED: u64 = 0x0e7a1;

impl Source {
    /// Opens the recipe's source; `seq_len` (context + 1) is checked against file sizes here so
    /// that a short file is a clear error before training, not a panic in the loop.
    pub fn open(source: &DataSource, seed: u64, seq_len: usize) -> Result<Source, DataError> {
        match source {
            DataSource::Synthetic { generator } if generator == "arith" => Ok(Source::Arith { seed }),
            DataSource::Synthetic { generator } if generator == "tokens" => Ok(Source::Tokens { seed }),
            DataSource::Synthetic { generator } if generator == "arith-qa" => Ok(Source::ArithQa { seed }),
            DataSource::Synthetic { generator } => Err(DataError::UnknownGenerator {
                name: generator.clone(),
                valid: SYNTHETIC_GENERATORS
                    .iter()
                    .map(|(n, _)| format!("synthetic:{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            DataSource::File { path } => {
                let bytes = std::fs::read(path).map_err(|source| DataError::Read { path: path.clone(), source })?;
                if bytes.len() < seq_len {
                    return Err(DataError::TooShort { path: path.clone(), len: bytes.len(), need: seq_len });
                }
                Ok(Source::File { bytes, seed })
            }
        }
    }

    /// A fine-tuning run's pairs: `synthetic:arith-qa`, or a `file:` of JSONL lines with
    /// `prompt` and `response` (each pair at most `seq_len` bytes), the last `held_out` of them
    /// kept for the eval.
    pub fn open_pairs(source: &DataSource, seed: u64, seq_len: usize, held_out: usize) -> Result<Source, DataError> {
        match source {
            DataSource::Synthetic { generator } if generator == "arith-qa" => Ok(Source::ArithQa { seed }),
            DataSource::Synthetic { .. } => Source::open(source, seed, seq_len),
            DataSource::File { path } => {
                let (pairs, held_out) = split(path, read_lines(path, seq_len, false)?, held_out)?;
                let pairs = pairs.into_iter().map(|p| Pair { prompt: p.prompt, response: p.chosen }).collect();
                Ok(Source::Pairs { train: pairs, held_out, seed })
            }
        }
    }

    /// A DPO run's preferences: `synthetic:arith-qa` (`arith::preference`), or a `file:` of
    /// JSONL lines with `prompt`, `chosen` and `rejected`, the last `held_out` kept for the eval.
    pub fn open_preferences(
        source: &DataSource,
        seed: u64,
        seq_len: usize,
        held_out: usize,
    ) -> Result<Source, DataError> {
        match source {
            DataSource::Synthetic { generator } if generator == "arith-qa" => Ok(Source::ArithPref { seed }),
            DataSource::Synthetic { .. } => Source::open(source, seed, seq_len),
            DataSource::File { path } => {
                let (train, held_out) = split(path, read_lines(path, seq_len, true)?, held_out)?;
                Ok(Source::Preferences { train, held_out, seed })
            }
        }
    }

    /// The number of distinct token ids this source can produce.
    pub fn vocab(&self) -> u32 {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } | Source::ArithPref { .. } => arith::VOCAB,
            Source::Tokens { .. } => synthetic_tokens::VOCAB,
            Source::File { .. } | Source::Pairs { .. } | Source::Preferences { .. } => FILE_VOCAB,
        }
    }

    /// Global sequence `index`, `len` tokens long (context + 1: inputs and targets overlap).
    /// A pair source gives its pair's tokens, padded.
    pub fn sequence(&self, index: u64, len: usize) -> Vec<i64> {
        match self {
            Source::Arith { seed } => arith::sequence(*seed, index, len),
            Source::Tokens { seed } => synthetic_tokens::sequence(*seed, index, len),
            Source::File { bytes, seed } => {
                // Validated in `open`: bytes.len() >= len.
                let starts = (bytes.len() - len) as u64 + 1;
                let start = Rng::for_index(*seed, index).below(starts) as usize;
                bytes[start..start + len].iter().map(|&b| i64::from(b)).collect()
            }
            Source::ArithQa { .. } | Source::Pairs { .. } | Source::ArithPref { .. } | Source::Preferences { .. } => {
                let Pair { mut prompt, response } = self.pair(index, len).unwrap_or_else(empty_pair);
                prompt.extend(response);
                prompt.resize(len, self.pad());
                prompt
            }
        }
    }

    /// Preference `index` of a preference source (None otherwise), fitting `len` tokens.
    pub fn preference(&self, index: u64, len: usize) -> Option<Preference> {
        match self {
            Source::ArithPref { seed } => {
                let (prompt, chosen, rejected) = arith::preference(*seed, index, len);
                Some(Preference { prompt, chosen, rejected })
            }
            Source::Preferences { train, seed, .. } => {
                let i = Rng::for_index(*seed, index).below(train.len() as u64) as usize;
                train.get(i).cloned()
            }
            _ => None,
        }
    }

    /// True for the DPO sources, whose items are two rows each (chosen, then rejected).
    pub fn is_preferences(&self) -> bool {
        matches!(self, Source::ArithPref { .. } | Source::Preferences { .. })
    }

    /// Training pair `index` of a pair source (None for sequence sources), at most `len` tokens.
    pub fn pair(&self, index: u64, len: usize) -> Option<Pair> {
        match self {
            Source::ArithQa { seed } => {
                let (prompt, response) = arith::qa(*seed, index, len);
                Some(Pair { prompt, response })
            }
            Source::Pairs { train, seed, .. } => {
                let i = Rng::for_index(*seed, index).below(train.len() as u64) as usize;
                train.get(i).cloned()
            }
            Source::ArithPref { .. } | Source::Preferences { .. } => {
                self.preference(index, len).map(|p| Pair { prompt: p.prompt, response: p.chosen })
            }
            _ => None,
        }
    }

    /// Held-out pair `i` for the eval (None for sources without held-out pairs).
    pub fn held_out(&self, i: u64, len: usize) -> Option<Pair> {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } | Source::ArithPref { .. } => {
                let (prompt, response) = arith::qa(HELD_OUT_SEED, HELD_OUT_BASE + i, len);
                Some(Pair { prompt, response })
            }
            Source::Pairs { held_out, .. } | Source::Preferences { held_out, .. } => {
                held_out.get(i as usize % held_out.len().max(1)).cloned()
            }
            _ => None,
        }
    }

    /// The token that ends an answer (greedy generation stops there), if the source has one.
    pub fn stop_token(&self) -> Option<i64> {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } | Source::ArithPref { .. } => Some(arith::END),
            _ => None,
        }
    }

    /// True when `completion` has an answer's form: for arithmetic, one or two digits and `;`
    /// (GRPO's format reward). Byte sources have no form to check.
    pub fn well_formed(&self, completion: &[i64]) -> bool {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } | Source::ArithPref { .. } => arith::is_answer(completion),
            _ => false,
        }
    }

    /// Tokens as text, for logs and the samples a run keeps: arithmetic as `3+4=7;`, bytes as
    /// UTF-8 (lossy).
    pub fn render(&self, tokens: &[i64]) -> String {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } | Source::ArithPref { .. } => arith::render(tokens),
            _ => String::from_utf8_lossy(&tokens.iter().map(|&t| t.clamp(0, 255) as u8).collect::<Vec<u8>>())
                .into_owned(),
        }
    }

    /// What pads a pair's row past its response (never a target).
    pub fn pad(&self) -> i64 {
        match self {
            Source::ArithQa { .. } | Source::ArithPref { .. } => arith::PAD,
            _ => 0,
        }
    }

    fn is_pairs(&self) -> bool {
        matches!(self, Source::ArithQa { .. } | Source::Pairs { .. }) || self.is_preferences()
    }

    /// The inputs and targets of global item `index` (`cols` = context): a sequence shifted by
    /// one, or a pair whose targets are its response tokens only.
    fn row(&self, index: u64, cols: usize, inputs: &mut Vec<i64>, targets: &mut Vec<i64>) {
        if self.is_pairs() {
            let pair = self.pair(index, cols + 1).unwrap_or_else(empty_pair);
            return pair_row(&pair.prompt, &pair.response, cols, self.pad(), inputs, targets);
        }
        let seq = self.sequence(index, cols + 1);
        inputs.extend_from_slice(&seq[..cols]);
        targets.extend_from_slice(&seq[1..]);
    }

    /// A DPO item's two rows: (prompt, chosen) into `chosen`, (prompt, rejected) into `rejected`.
    fn preference_rows(
        &self,
        index: u64,
        cols: usize,
        chosen: &mut (Vec<i64>, Vec<i64>),
        rejected: &mut (Vec<i64>, Vec<i64>),
    ) {
        let Some(p) = self.preference(index, cols + 1) else { return };
        pair_row(&p.prompt, &p.chosen, cols, self.pad(), &mut chosen.0, &mut chosen.1);
        pair_row(&p.prompt, &p.rejected, cols, self.pad(), &mut rejected.0, &mut rejected.1);
    }
}

/// One padded row of `prompt` then `answer`: inputs are its first `cols` tokens, targets the
/// answer's tokens where they are predicted (position t predicts token t + 1), else `IGNORE`.
fn pair_row(prompt: &[i64], answer: &[i64], cols: usize, pad: i64, inputs: &mut Vec<i64>, targets: &mut Vec<i64>) {
    let (from, to) = (prompt.len(), prompt.len() + answer.len());
    let token = |i: usize| match i {
        i if i < from => prompt[i],
        i if i < to => answer[i - from],
        _ => pad,
    };
    inputs.extend((0..cols).map(token));
    targets.extend((0..cols).map(|t| if (from..to).contains(&(t + 1)) { token(t + 1) } else { IGNORE }));
}

/// Every line of a JSONL file as a preference (for sft lines, `chosen` is the response and
/// `rejected` empty); `dpo` says which fields a line must have.
fn read_lines(path: &std::path::Path, seq_len: usize, dpo: bool) -> Result<Vec<Preference>, DataError> {
    let text = std::fs::read(path).map_err(|source| DataError::Read { path: path.to_path_buf(), source })?;
    let bad = |line: usize, reason: String| DataError::BadPair { path: path.to_path_buf(), line, reason };
    let shape = match dpo {
        true => r#"{"prompt": "...", "chosen": "...", "rejected": "..."}"#,
        false => r#"{"prompt": "...", "response": "..."}"#,
    };
    let mut out = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let p: PairLine = serde_json::from_slice(line).map_err(|e| bad(i + 1, format!("{e}; each line is {shape}")))?;
        let (chosen, rejected) = match (dpo, p.response, p.chosen, p.rejected) {
            (false, Some(r), None, None) => (r, String::new()),
            (true, None, Some(c), Some(r)) => (c, r),
            _ => return Err(bad(i + 1, format!("each line is {shape}"))),
        };
        let tokens = |s: &str| s.bytes().map(i64::from).collect::<Vec<i64>>();
        let pref = Preference { prompt: tokens(&p.prompt), chosen: tokens(&chosen), rejected: tokens(&rejected) };
        if pref.prompt.is_empty() || pref.chosen.is_empty() || (dpo && pref.rejected.is_empty()) {
            return Err(bad(i + 1, "the prompt and each answer must have a byte at least".into()));
        }
        let len = pref.prompt.len() + pref.chosen.len().max(pref.rejected.len());
        if len > seq_len {
            let what = if dpo { "prompt and its longer answer" } else { "prompt and response" };
            return Err(bad(i + 1, format!("{what} are {len} bytes; at most model.context + 1 = {seq_len}")));
        }
        out.push(pref);
    }
    Ok(out)
}

/// The lines to train on and the last `held_out` (as prompt and chosen answer) for the eval.
fn split(
    path: &std::path::Path,
    mut all: Vec<Preference>,
    held_out: usize,
) -> Result<(Vec<Preference>, Vec<Pair>), DataError> {
    if all.len() <= held_out {
        return Err(DataError::TooFewPairs { path: path.to_path_buf(), pairs: all.len(), held_out });
    }
    let held = all.split_off(all.len() - held_out);
    Ok((all, held.into_iter().map(|p| Pair { prompt: p.prompt, response: p.chosen }).collect()))
}

fn empty_pair() -> Pair {
    Pair { prompt: Vec::new(), response: Vec::new() }
}

/// One rank's batch, row-major `rows × cols` (cols = context).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    pub rows: usize,
    pub cols: usize,
}

/// Hands out this rank's slice of each step's global batch and remembers the data position.
///
/// At step s (from 1) the global batch is sequences [(s-1)·B, s·B), B = batch_per_rank ·
/// world_size, and rank r takes [r·b, (r+1)·b) of it. So world 1 with batch 2b sees exactly the
/// sequences world 2 with batch b sees, which is what makes their losses comparable.
pub struct Loader {
    source: Source,
    context: usize,
    batch_per_rank: u64,
    rank: u64,
    world_size: u64,
    /// The global index of the first sequence of the next global batch.
    position: u64,
}

impl Loader {
    pub fn new(source: Source, context: usize, batch_per_rank: u32, rank: u32, world_size: u32) -> Loader {
        Loader {
            source,
            context,
            batch_per_rank: u64::from(batch_per_rank),
            rank: u64::from(rank),
            world_size: u64::from(world_size),
            position: 0,
        }
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The next global sequence index: what a checkpoint records.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Restores a recorded position (a multiple of the global batch on the same topology).
    pub fn seek(&mut self, position: u64) {
        self.position = position;
    }

    /// Passes over `n` global batches (`data.skip_batches` after a resume).
    pub fn skip_batches(&mut self, n: u64) {
        self.position += n * self.batch_per_rank * self.world_size;
    }

    /// GRPO's share of the next global batch: this rank's prompts with their global indices
    /// (what seeds their sampling) and true answers, each prompt at most `max_prompt` tokens
    /// (the oldest dropped), so that it leaves room for the completion.
    pub fn next_prompts(&mut self, max_prompt: usize) -> Vec<(u64, Pair)> {
        let first = self.position + self.rank * self.batch_per_rank;
        // Prompt and answer fit in max_prompt + 2 (the shortest answer is "7;").
        let out = (first..first + self.batch_per_rank)
            .filter_map(|i| self.source.pair(i, max_prompt + 2).map(|p| (i, p)))
            .map(|(i, mut p)| {
                let cut = p.prompt.len().saturating_sub(max_prompt);
                p.prompt.drain(..cut);
                (i, p)
            })
            .collect();
        self.position += self.batch_per_rank * self.world_size;
        out
    }

    pub fn next_batch(&mut self) -> Batch {
        let first = self.position + self.rank * self.batch_per_rank;
        let rows = self.batch_per_rank as usize;
        let cols = self.context;
        let mut inputs = Vec::with_capacity(rows * cols);
        let mut targets = Vec::with_capacity(rows * cols);
        if self.source.is_preferences() {
            // Every item's chosen row, then every item's rejected row: the halves of the batch.
            let (mut chosen, mut rejected) = ((inputs, targets), (Vec::new(), Vec::new()));
            for i in 0..self.batch_per_rank {
                self.source.preference_rows(first + i, cols, &mut chosen, &mut rejected);
            }
            chosen.0.extend(rejected.0);
            chosen.1.extend(rejected.1);
            self.position += self.batch_per_rank * self.world_size;
            return Batch { inputs: chosen.0, targets: chosen.1, rows: 2 * rows, cols };
        }
        for i in 0..self.batch_per_rank {
            self.source.row(first + i, cols, &mut inputs, &mut targets);
        }
        self.position += self.batch_per_rank * self.world_size;
        Batch { inputs, targets, rows, cols }
    }
}

/// SplitMix64: tiny, fast, and well mixed; seeded per sequence so sequences are independent of
/// the order in which ranks ask for them.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn for_index(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ 0x5851_f42d_4c95_7f2d);
        r.0 ^= Rng(index.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64();
        Rng(r.next_u64())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0), by the multiply-high method.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loader(batch: u32, rank: u32, world: u32) -> Loader {
        Loader::new(Source::Arith { seed: 7 }, 32, batch, rank, world)
    }

    #[test]
    fn sequences_are_pure_functions_of_seed_and_index() {
        let s = Source::Arith { seed: 3 };
        assert_eq!(s.sequence(12, 65), s.sequence(12, 65));
        assert_ne!(s.sequence(12, 65), s.sequence(13, 65));
        assert_ne!(s.sequence(12, 65), Source::Arith { seed: 4 }.sequence(12, 65));
        assert_eq!(s.sequence(12, 65).len(), 65);
    }

    #[test]
    fn inputs_and_targets_are_shifted_by_one() {
        let mut l = loader(2, 0, 1);
        let b = l.next_batch();
        assert_eq!((b.rows, b.cols, b.inputs.len()), (2, 32, 64));
        let seq0 = Source::Arith { seed: 7 }.sequence(0, 33);
        assert_eq!(&b.inputs[..32], &seq0[..32]);
        assert_eq!(&b.targets[..32], &seq0[1..]);
    }

    #[test]
    fn world_one_batch_2b_equals_world_two_ranks_concatenated() {
        let mut one = loader(8, 0, 1);
        let mut r0 = loader(4, 0, 2);
        let mut r1 = loader(4, 1, 2);
        for step in 1..=5u64 {
            let whole = one.next_batch();
            let (a, b) = (r0.next_batch(), r1.next_batch());
            assert_eq!(whole.inputs, [a.inputs, b.inputs].concat(), "step {step}");
            assert_eq!(whole.targets, [a.targets, b.targets].concat(), "step {step}");
            assert_eq!(one.position(), step * 8);
            assert_eq!(r1.position(), step * 8);
        }
    }

    #[test]
    fn seek_resumes_the_same_stream() {
        let mut a = loader(3, 1, 2);
        for _ in 0..4 {
            a.next_batch();
        }
        let mut b = loader(3, 1, 2);
        b.seek(a.position());
        assert_eq!(a.next_batch(), b.next_batch());
    }

    #[test]
    fn file_source_reads_bytes_at_deterministic_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.txt");
        let text: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let src = DataSource::File { path: path.clone() };
        let s = Source::open(&src, 5, 33).unwrap();
        assert_eq!(s.vocab(), 256);
        let seq = s.sequence(9, 33);
        assert_eq!(seq, Source::open(&src, 5, 33).unwrap().sequence(9, 33));
        // A contiguous run of the file.
        let as_tokens = |o: usize| text[o..o + 33].iter().map(|&b| i64::from(b)).collect::<Vec<_>>();
        assert!((0..=text.len() - 33).any(|o| as_tokens(o) == seq));
        let err = Source::open(&src, 5, 2000).err().unwrap().to_string();
        assert!(err.contains("shorter than one sequence"), "{err}");
    }

    #[test]
    fn a_pair_row_targets_only_its_response() {
        let qa = Source::ArithQa { seed: 2 };
        let mut l = Loader::new(Source::ArithQa { seed: 2 }, 32, 3, 0, 1);
        let b = l.next_batch();
        for r in 0..3 {
            let pair = qa.pair(r as u64, 33).unwrap();
            let (inputs, targets) = (&b.inputs[r * 32..(r + 1) * 32], &b.targets[r * 32..(r + 1) * 32]);
            let p = pair.prompt.len();
            assert_eq!(&inputs[..p], &pair.prompt[..]);
            let wanted: Vec<i64> = targets.iter().copied().filter(|&t| t != IGNORE).collect();
            assert_eq!(wanted, pair.response, "row {r}");
            // The first target is the prediction made at the prompt's last token.
            assert_eq!(targets[p - 1], pair.response[0]);
            assert!(targets[..p - 1].iter().all(|&t| t == IGNORE));
            assert!(inputs[p + pair.response.len()..].iter().all(|&t| t == arith::PAD));
        }
        // Held-out pairs are not training pairs, and are the same pairs for every run of the seed.
        let train: Vec<Pair> = (0..200).map(|i| qa.pair(i, 33).unwrap()).collect();
        assert_eq!(qa.held_out(5, 33), Source::ArithQa { seed: 2 }.held_out(5, 33));
        assert_ne!(qa.held_out(0, 33), train.first().cloned());
    }

    #[test]
    fn a_jsonl_file_of_pairs_holds_out_its_last_lines_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.jsonl");
        let lines: Vec<String> = (0..10).map(|i| format!(r#"{{"prompt": "q{i}?", "response": "a{i}"}}"#)).collect();
        std::fs::write(&path, lines.join("\n") + "\n\n").unwrap();
        let src = DataSource::File { path: path.clone() };
        let s = Source::open_pairs(&src, 1, 33, 2).unwrap();
        assert_eq!(s.held_out(0, 33).unwrap().prompt, b"q8?".iter().map(|&b| i64::from(b)).collect::<Vec<_>>());
        assert_eq!(s.held_out(1, 33).unwrap().response, b"a9".iter().map(|&b| i64::from(b)).collect::<Vec<_>>());
        let held: Vec<Vec<i64>> = [b"a8", b"a9"].iter().map(|r| r.iter().map(|&b| i64::from(b)).collect()).collect();
        let drawn: std::collections::BTreeSet<Vec<i64>> = (0..100).map(|i| s.pair(i, 33).unwrap().response).collect();
        assert_eq!(drawn.len(), 8, "every training pair is drawn, no held-out one");
        assert!(held.iter().all(|h| !drawn.contains(h)));
        let err = Source::open_pairs(&src, 1, 33, 10).err().unwrap().to_string();
        assert!(err.contains("10 pairs leave none") && err.contains("eval.prompts"), "{err}");
        std::fs::write(&path, format!("{}\n{{\"prompt\": 3}}\n", lines[0])).unwrap();
        let err = Source::open_pairs(&src, 1, 33, 0).err().unwrap().to_string();
        assert!(
            err.contains("pairs.jsonl\" line 2:") && err.contains(r#"{"prompt": "...", "response": "..."}"#),
            "{err}"
        );
        std::fs::write(&path, format!(r#"{{"prompt": "{}", "response": "x"}}"#, "p".repeat(40))).unwrap();
        let err = Source::open_pairs(&src, 1, 33, 0).err().unwrap().to_string();
        assert!(err.contains("line 1: prompt and response are 41 bytes; at most model.context + 1 = 33"), "{err}");
    }

    #[test]
    fn unknown_generator_names_the_valid_ones() {
        let src = DataSource::Synthetic { generator: "nope".into() };
        let err = Source::open(&src, 0, 10).err().unwrap().to_string();
        assert!(err.contains("synthetic:nope") && err.contains("synthetic:arith"), "{err}");
    }
}
