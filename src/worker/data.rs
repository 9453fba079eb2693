//! Training data: deterministic sequences by global index, sharded by rank, with a position.
//!
//! No tch here: sequences are plain `Vec<i64>` so the sharding and determinism rules are unit
//! tested without libtorch. Every sequence is a pure function of (data seed, global sequence
//! index), so the data position is a single integer and resume is exact on any topology.
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
}

impl Source {
    /// Opens the recipe's source; `seq_len` (context + 1) is checked against file sizes here so
    /// that a short file is a clear error before training, not a panic in the loop.
    pub fn open(source: &DataSource, seed: u64, seq_len: usize) -> Result<Source, DataError> {
        match source {
            DataSource::Synthetic { generator } if generator == "arith" => Ok(Source::Arith { seed }),
            DataSource::Synthetic { generator } if generator == "tokens" => Ok(Source::Tokens { seed }),
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

    /// The number of distinct token ids this source can produce.
    pub fn vocab(&self) -> u32 {
        match self {
            Source::Arith { .. } => arith::VOCAB,
            Source::Tokens { .. } => synthetic_tokens::VOCAB,
            Source::File { .. } => FILE_VOCAB,
        }
    }

    /// Global sequence `index`, `len` tokens long (context + 1: inputs and targets overlap).
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
        }
    }
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
            let seq = self.source.sequence(first + i, cols + 1);
            inputs.extend_from_slice(&seq[..cols]);
            targets.extend_from_slice(&seq[1..]);
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
    fn unknown_generator_names_the_valid_ones() {
        let src = DataSource::Synthetic { generator: "nope".into() };
        let err = Source::open(&src, 0, 10).err().unwrap().to_string();
        assert!(err.contains("synthetic:nope") && err.contains("synthetic:arith"), "{err}");
    }
}
