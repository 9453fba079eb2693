//! `synthetic:tokens`: a deterministic token stream over GPT-2's vocabulary, for GPU-sized models.
//!
//! Half of the tokens follow their predecessor by a fixed affine map (learnable, like a bigram
//! table), the other half are drawn log-uniformly (a Zipf-like head of frequent ids), so the loss
//! starts near ln(50257) and falls, and no corpus has to be downloaded. Like `arith`, sequence i
//! is a pure function of (data seed, i).
use super::data::Rng;

/// GPT-2's vocabulary size; recipes round the model's vocab up (50304 = 64 × 786).
pub const VOCAB: u32 = 50257;

pub fn sequence(seed: u64, index: u64, len: usize) -> Vec<i64> {
    let mut rng = Rng::for_index(seed ^ 0x746f_6b65_6e73, index);
    let v = u64::from(VOCAB);
    let mut out = Vec::with_capacity(len);
    let mut prev = rng.below(v);
    for _ in 0..len {
        out.push(prev as i64);
        prev = if rng.next_u64() & 1 == 0 {
            // A fixed permutation-like successor: 7919 is prime and coprime with 50257.
            (prev * 7919 + 104_729) % v
        } else {
            // Log-uniform: pick a bit width, then a value below 2^width (small ids are common).
            let bits = 1 + rng.below(16);
            rng.below(1 << bits) % v
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_deterministic_in_range_and_skewed() {
        let a = sequence(1, 5, 4097);
        assert_eq!(a, sequence(1, 5, 4097));
        assert_ne!(a, sequence(1, 6, 4097));
        assert_ne!(a, sequence(2, 5, 4097));
        assert_eq!(a.len(), 4097);
        assert!(a.iter().all(|&t| (0..i64::from(VOCAB)).contains(&t)));
        // About half the steps follow the fixed successor map: that is what a model learns.
        let follows = a.windows(2).filter(|w| w[1] == (w[0] * 7919 + 104_729) % i64::from(VOCAB)).count();
        assert!((1700..2400).contains(&follows), "{follows} of 4096");
        // The log-uniform half favours small ids.
        let small = a.iter().filter(|&&t| t < 256).count();
        assert!(small > 4097 / 5, "{small}");
    }
}
