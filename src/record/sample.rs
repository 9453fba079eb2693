//! A GRPO completion kept for the cockpit: the line rank 0 prints for each sample (so it lands
//! in the run's logs, and the history, like any line) and its reading back.

/// One sampled completion and its reward at a step.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleLine {
    pub step: u64,
    pub prompt: String,
    pub completion: String,
    pub reward: f64,
}

const PREFIX: &str = "sample step ";
const ARROW: &str = " -> ";
const REWARD: &str = " (reward ";

impl SampleLine {
    /// `sample step 12: 3+4=7;7*2= -> 14; (reward 1)`.
    pub fn to_line(&self) -> String {
        format!("{PREFIX}{}: {}{ARROW}{}{REWARD}{})", self.step, self.prompt, self.completion, self.reward)
    }

    /// The sample a log line carries, if it is one (a prompt holding " -> " splits at the
    /// first).
    pub fn parse(line: &str) -> Option<SampleLine> {
        let rest = line.trim_end().strip_prefix(PREFIX)?;
        let (step, rest) = rest.split_once(": ")?;
        let (text, reward) = rest.strip_suffix(')')?.rsplit_once(REWARD)?;
        let (prompt, completion) = text.split_once(ARROW)?;
        Some(SampleLine {
            step: step.parse().ok()?,
            prompt: prompt.to_string(),
            completion: completion.to_string(),
            reward: reward.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_line_reads_back_as_written_and_other_lines_are_not_samples() {
        let s = SampleLine { step: 12, prompt: "3+4=7;7*2=".into(), completion: "14;".into(), reward: 1.0 };
        assert_eq!(s.to_line(), "sample step 12: 3+4=7;7*2= -> 14; (reward 1)");
        assert_eq!(SampleLine::parse(&s.to_line()), Some(s));
        let odd = SampleLine { step: 3, prompt: "a (reward 2) b".into(), completion: "".into(), reward: 0.1 };
        assert_eq!(SampleLine::parse(&odd.to_line()), Some(odd));
        for other in
            ["rank 0 step 10/200 loss 1.2", "sample step x: a -> b (reward 1)", "sample step 1: a b (reward 1)"]
        {
            assert_eq!(SampleLine::parse(other), None, "{other}");
        }
    }
}
