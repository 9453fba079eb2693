//! `synthetic:arith`: chains of arithmetic facts such as `4+8=12;12-3=9;9*6=54;`, and
//! `synthetic:arith-qa`: the same chains cut before an answer, as (prompt, response) pairs.

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
        let (op, b, c) = fact(&mut rng, a);
        push_fact(a, op, b, c, &mut out);
        a = c;
    }
    out.truncate(len);
    out
}

/// The `arith-qa` item at `index`: a chain of 0 to 3 whole facts and the next fact up to its
/// `=` as the prompt, that fact's answer and `;` as the response (`3+4=7;7*2=` → `14;`). The
/// prompt and response together fit in `max_len` tokens (facts are dropped from the front, so
/// the first operand may then have two digits); `max_len` must be at least 8.
pub fn qa(seed: u64, index: u64, max_len: usize) -> (Vec<i64>, Vec<i64>) {
    let (prompt, response, _) = qa_fact(seed, index, max_len);
    (prompt, response)
}

/// The `arith-qa` item at `index` as a preference for DPO: (prompt, chosen, rejected), where
/// chosen is the true answer and rejected a plausible wrong one: what another operator would
/// give on the same operands, or the answer off by one or by ten (drawn per item). All three
/// fit in `max_len` tokens (at least 9).
pub fn preference(seed: u64, index: u64, max_len: usize) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    // A wrong answer may have one digit more than the true one.
    let (prompt, chosen, (a, op, b, c)) = qa_fact(seed, index, max_len.saturating_sub(1));
    let mut candidates: Vec<u64> = [PLUS, MINUS, TIMES]
        .into_iter()
        .filter(|&o| o != op)
        .filter_map(|o| match o {
            PLUS => Some(a + b),
            MINUS => a.checked_sub(b),
            _ => Some(a * b),
        })
        .chain([c + 1, c.wrapping_sub(1), c + 10, c.wrapping_sub(10)])
        .filter(|&w| w != c && w <= MAX_VALUE)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let mut rng = Rng::for_index(seed ^ 0x9b_0000, index);
    let wrong = candidates.get(rng.below(candidates.len() as u64) as usize).copied().unwrap_or(c + 1);
    let mut rejected = Vec::with_capacity(3);
    digits(wrong, &mut rejected);
    rejected.push(END);
    (prompt, chosen, rejected)
}

/// `qa`, and the last fact's (a, op, b, c).
fn qa_fact(seed: u64, index: u64, max_len: usize) -> (Vec<i64>, Vec<i64>, (u64, i64, u64, u64)) {
    // Another stream than `sequence`'s at the same index.
    let mut rng = Rng::for_index(seed ^ 0x9a_0000, index);
    let whole = rng.below(4) as usize;
    let mut facts = Vec::with_capacity(whole + 1);
    let mut a = rng.below(10);
    let mut asked = (0, PLUS, 0, 0);
    for _ in 0..=whole {
        let (op, b, c) = fact(&mut rng, a);
        let mut tokens = Vec::with_capacity(9);
        push_fact(a, op, b, c, &mut tokens);
        facts.push(tokens);
        asked = (a, op, b, c);
        a = c;
    }
    let last = facts.pop().unwrap_or_default();
    let answer_at = last.iter().position(|&t| t == EQUALS).map_or(last.len(), |p| p + 1);
    let mut first = 0;
    while first < facts.len() && facts[first..].iter().map(Vec::len).sum::<usize>() + last.len() > max_len {
        first += 1;
    }
    let mut prompt: Vec<i64> = facts[first..].concat();
    prompt.extend_from_slice(&last[..answer_at]);
    (prompt, last[answer_at..].to_vec(), asked)
}

/// The next fact from `a`: a fresh operator and a one-digit operand; answers stay in 0..=99
/// (an operator that would leave that range gives way).
fn fact(rng: &mut Rng, a: u64) -> (i64, u64, u64) {
    let b = rng.below(10);
    let (op, c) = match rng.below(3) {
        0 if a + b <= MAX_VALUE => (PLUS, a + b),
        1 if a >= b => (MINUS, a - b),
        2 if a * b <= MAX_VALUE => (TIMES, a * b),
        _ if a >= b => (MINUS, a - b),
        _ => (PLUS, a + b),
    };
    (op, b, c)
}

fn push_fact(a: u64, op: i64, b: u64, c: u64, out: &mut Vec<i64>) {
    digits(a, out);
    out.push(op);
    digits(b, out);
    out.push(EQUALS);
    digits(c, out);
    out.push(END);
}

fn digits(n: u64, out: &mut Vec<i64>) {
    let s = n.to_string();
    out.extend(s.bytes().map(|d| i64::from(d - b'0')));
}

/// An answer's form: one or two digits, then `;` (`7;`, `42;`).
pub fn is_answer(tokens: &[i64]) -> bool {
    match tokens.split_last() {
        Some((&END, digits)) => (1..=2).contains(&digits.len()) && digits.iter().all(|t| (0..=9).contains(t)),
        _ => false,
    }
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

    #[test]
    fn qa_prompts_end_at_an_equals_and_responses_are_the_true_answer() {
        let mut lengths = std::collections::BTreeSet::new();
        for i in 0..500 {
            let (prompt, response) = qa(3, i, 64);
            let (p, r) = (render(&prompt), render(&response));
            assert!(p.ends_with('=') && r.ends_with(';') && (2..=3).contains(&r.len()), "{p} {r}");
            // The whole chain, answer included, is as true as `sequence`'s.
            let fact = p.rsplit(';').next().unwrap();
            let op = fact.find(['+', '-', '*']).unwrap();
            let (a, b): (i64, i64) = (fact[..op].parse().unwrap(), fact[op + 1..fact.len() - 1].parse().unwrap());
            let want = match &fact[op..op + 1] {
                "+" => a + b,
                "-" => a - b,
                _ => a * b,
            };
            assert_eq!(r, format!("{want};"), "{p}");
            lengths.insert(prompt.len());
            // Cut to fit: the pair never passes max_len, and keeps its last fact.
            let (short, answer) = qa(3, i, 12);
            assert!(short.len() + answer.len() <= 12 && answer == response, "{}", render(&short));
        }
        assert!(lengths.len() > 4, "prompts of one length only: {lengths:?}");
        assert_eq!(qa(3, 7, 64), qa(3, 7, 64));
    }

    #[test]
    fn a_preference_rejects_a_plausible_wrong_answer_and_fits() {
        let mut kinds = std::collections::BTreeSet::new();
        for i in 0..500 {
            let (prompt, chosen, rejected) = preference(5, i, 12);
            assert_eq!((prompt.clone(), chosen.clone()), qa(5, i, 11));
            assert!(prompt.len() + chosen.len().max(rejected.len()) <= 12, "{}", render(&prompt));
            assert_ne!(chosen, rejected);
            assert!(rejected.ends_with(&[END]) && (2..=3).contains(&rejected.len()), "{}", render(&rejected));
            let value = |t: &[i64]| render(&t[..t.len() - 1]).parse::<i64>().unwrap();
            kinds.insert((value(&rejected) - value(&chosen)).abs().min(11));
        }
        // Off by one, by ten, and other operators' answers all occur.
        assert!(kinds.contains(&1) && kinds.contains(&10) && kinds.len() > 4, "{kinds:?}");
        assert_ne!(qa(3, 7, 64), qa(4, 7, 64));
    }
}
