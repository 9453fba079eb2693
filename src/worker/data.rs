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

/// A JSONL line of a fine-tuning file: `{"prompt": "...", "response": "..."}` (bytes are tokens).
#[derive(serde::Deserialize)]
struct PairLine {
    prompt: String,
    response: String,
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
                let text = std::fs::read(path).map_err(|source| DataError::Read { path: path.clone(), source })?;
                let bad = |line: usize, reason: String| DataError::BadPair { path: path.clone(), line, reason };
                let mut pairs = Vec::new();
                for (i, line) in text.split(|&b| b == b'\n').enumerate() {
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let p: PairLine = serde_json::from_slice(line).map_err(|e| {
                        bad(i + 1, format!(r#"{e}; each line is {{"prompt": "...", "response": "..."}}"#))
                    })?;
                    let pair = Pair {
                        prompt: p.prompt.bytes().map(i64::from).collect(),
                        response: p.response.bytes().map(i64::from).collect(),
                    };
                    if pair.prompt.is_empty() || pair.response.is_empty() {
                        return Err(bad(i + 1, "the prompt and the response must each have a byte at least".into()));
                    }
                    let len = pair.prompt.len() + pair.response.len();
                    if len > seq_len {
                        return Err(bad(
                            i + 1,
                            format!("prompt and response are {len} bytes; at most model.context + 1 = {seq_len}"),
                        ));
                    }
                    pairs.push(pair);
                }
                if pairs.len() <= held_out {
                    return Err(DataError::TooFewPairs { path: path.clone(), pairs: pairs.len(), held_out });
                }
                let held_out = pairs.split_off(pairs.len() - held_out);
                Ok(Source::Pairs { train: pairs, held_out, seed })
            }
        }
    }

    /// The number of distinct token ids this source can produce.
    pub fn vocab(&self) -> u32 {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } => arith::VOCAB,
            Source::Tokens { .. } => synthetic_tokens::VOCAB,
            Source::File { .. } | Source::Pairs { .. } => FILE_VOCAB,
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
            Source::ArithQa { .. } | Source::Pairs { .. } => {
                let Pair { mut prompt, response } = self.pair(index, len).unwrap_or_else(empty_pair);
                prompt.extend(response);
                prompt.resize(len, self.pad());
                prompt
            }
        }
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
            _ => None,
        }
    }

    /// Held-out pair `i` for the eval (None for sources without held-out pairs).
    pub fn held_out(&self, i: u64, len: usize) -> Option<Pair> {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } => {
                let (prompt, response) = arith::qa(HELD_OUT_SEED, HELD_OUT_BASE + i, len);
                Some(Pair { prompt, response })
            }
            Source::Pairs { held_out, .. } => held_out.get(i as usize % held_out.len().max(1)).cloned(),
            _ => None,
        }
    }

    /// The token that ends an answer (greedy generation stops there), if the source has one.
    pub fn stop_token(&self) -> Option<i64> {
        match self {
            Source::Arith { .. } | Source::ArithQa { .. } => Some(arith::END),
            _ => None,
        }
    }

    /// What pads a pair's row past its response (never a target).
    fn pad(&self) -> i64 {
        match self {
            Source::ArithQa { .. } => arith::PAD,
            _ => 0,
        }
    }

    fn is_pairs(&self) -> bool {
        matches!(self, Source::ArithQa { .. } | Source::Pairs { .. })
    }

    /// The inputs and targets of global item `index` (`cols` = context): a sequence shifted by
    /// one, or a pair whose targets are its response tokens only.
    fn row(&self, index: u64, cols: usize, inputs: &mut Vec<i64>, targets: &mut Vec<i64>) {
        let seq = self.sequence(index, cols + 1);
        inputs.extend_from_slice(&seq[..cols]);
        if !self.is_pairs() {
            targets.extend_from_slice(&seq[1..]);
            return;
        }
        let pair = self.pair(index, cols + 1).unwrap_or_else(empty_pair);
        let (from, to) = (pair.prompt.len(), pair.prompt.len() + pair.response.len());
        // Position t predicts token t + 1: a target only where that token is the response's.
        targets.extend((0..cols).map(|t| if (from..to).contains(&(t + 1)) { seq[t + 1] } else { IGNORE }));
    }
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

    pub fn next_batch(&mut self) -> Batch {
        let first = self.position + self.rank * self.batch_per_rank;
        let rows = self.batch_per_rank as usize;
        let cols = self.context;
        let mut inputs = Vec::with_capacity(rows * cols);
        let mut targets = Vec::with_capacity(rows * cols);
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
