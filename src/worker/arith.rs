//! `synthetic:arith`: chains of arithmetic facts such as `4+8=12;12-3=9;9*6=54;`.

use super::data::Rng;

pub const VOCAB: u32 = 16;
// Tokens 0..=9 are the digits.
pub const PLUS: i64 = 10;
pub const MINUS: i64 = 11;
pub const TIMES: i64 = 12;
pub const EQUALS: i64 = 13;
pub const END: i64 = 14;
/// Reserved for padding; the generator never emits it.
pub const PAD: i64 = 15;
const MAX_VALUE: u64 = 99;

/// A chain of facts from a fact boundary, cut to `len` tokens: each fact starts from the
/// previous answer (`3+4=7;7*2=14;14-9=5;`), with a fresh operator and a one-digit operand.
/// A tiny model first learns the format, then to copy the previous answer, then the
/// arithmetic itself, so the loss keeps falling for hundreds of steps; the new operator and
/// operand (≈3.4 nats a fact) stay unpredictable, so it never reaches zero. (Independent
/// facts were tried first: their operands are mostly noise and the loss flattened early.)
pub fn sequence(seed: u64, index: u64, len: usize) -> Vec<i64> {
    let mut rng = Rng::for_index(seed, index);
    let mut out = Vec::with_capacity(len + 12);
    let mut a = rng.below(10);
    while out.len() < len {
        let b = rng.below(10);
        // Answers stay in 0..=99: an operator that would leave that range gives way.
        let (op, c) = match rng.below(3) {
            0 if a + b <= MAX_VALUE => (PLUS, a + b),
            1 if a >= b => (MINUS, a - b),
            2 if a * b <= MAX_VALUE => (TIMES, a * b),
            _ if a >= b => (MINUS, a - b),
            _ => (PLUS, a + b),
        };
        digits(a, &mut out);
        out.push(op);
        digits(b, &mut out);
        out.push(EQUALS);
        digits(c, &mut out);
        out.push(END);
        a = c;
    }
    out.truncate(len);
    out
}

fn digits(n: u64, out: &mut Vec<i64>) {
    let s = n.to_string();
    out.extend(s.bytes().map(|d| i64::from(d - b'0')));
}

/// For logs and tests: `47+38=85;`.
pub fn render(tokens: &[i64]) -> String {
    tokens
        .iter()
        .map(|&t| match t {
            0..=9 => char::from(b'0' + t as u8),
            PLUS => '+',
            MINUS => '-',
            TIMES => '*',
            EQUALS => '=',
            END => ';',
            _ => '_',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arith_tokens_are_in_vocab_and_facts_are_true() {
        for i in 0..500 {
            let seq = sequence(1, i, 200);
            assert!(seq.iter().all(|&t| (0..i64::from(VOCAB)).contains(&t)));
            assert!(!seq.contains(&PAD));
            let text = render(&seq);
            // Every complete fact (between two ';') is arithmetically true.
            // Sequences start at a fact boundary; the piece after the last ';' is cut short.
            let facts: Vec<&str> = text.split(';').collect();
            let mut previous: Option<i64> = None;
            for fact in &facts[..facts.len() - 1] {
                let (lhs, rhs) = fact.split_once('=').unwrap();
                let rhs: i64 = rhs.parse().unwrap();
                let op = lhs.find(['+', '-', '*']).unwrap();
                let (a, b): (i64, i64) = (lhs[..op].parse().unwrap(), lhs[op + 1..].parse().unwrap());
                let want = match &lhs[op..op + 1] {
                    "+" => a + b,
                    "-" => a - b,
                    _ => a * b,
                };
                assert_eq!(rhs, want, "{fact}");
                assert!((0..=99).contains(&rhs), "{fact}");
                if let Some(p) = previous {
                    assert_eq!(a, p, "each fact starts from the previous answer: {text}");
                }
                assert!((0..=9).contains(&b), "{fact}");
                previous = Some(rhs);
            }
        }
        assert!(render(&sequence(1, 0, 40)).contains('='));
    }
}
