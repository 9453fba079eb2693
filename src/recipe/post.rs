//! Validation of what post-training adds: `[init]`, `[eval]`, and which data each kind trains on.
use super::check::{Check, MAX_I64, R};
use super::raw::{RawEval, RawInit};
use super::*;

/// The most held-out prompts an eval answers (each is a greedy generation on every eval).
const MAX_EVAL_PROMPTS: i64 = 100_000;

impl Check<'_> {
    /// `[init] from`: `"RUN"`, `"RUN@STEP"`, or a checkpoint path (anything with a `/`).
    pub(super) fn init(&self, raw: Option<RawInit>, kind: Kind) -> R<Option<Init>> {
        let Some(raw) = raw else { return Ok(None) };
        let valid = r#"a run ("tiny-gpt" or its id), a run at a step ("tiny-gpt@200") or a checkpoint path ("runs/ID/ckpt/step-00000200")"#;
        let Some(text) = raw.from.map(|t| t.trim().to_string()) else {
            return Err(self.missing("init.from", valid));
        };
        let shown = self.ctx.show("init.from", format!("{text:?}"));
        if kind == Kind::Command {
            return Err(self.invalid(
                "init.from",
                format!("{shown}: kind = \"command\" runs its own program, which loads its own weights; [init] is for the embedded trainers"),
            ));
        }
        if text.is_empty() {
            return Err(self.invalid("init.from", format!("{shown} is empty; valid: {valid}")));
        }
        if text.contains('/') {
            let path = std::path::PathBuf::from(&text);
            let path = match (path.is_relative(), self.base) {
                (true, Some(base)) => base.join(path),
                _ => path,
            };
            return Ok(Some(Init { from: InitFrom::Path(path) }));
        }
        let (run, step) = match text.rsplit_once('@') {
            Some((run, step)) => match step.parse::<u64>() {
                Ok(s) if !run.is_empty() => (run.to_string(), Some(s)),
                _ => {
                    return Err(self.invalid(
                        "init.from",
                        format!("{shown}: after '@' comes a checkpoint's step, a whole number; valid: {valid}"),
                    ))
                }
            },
            None => (text.clone(), None),
        };
        Ok(Some(Init { from: InitFrom::Run { run, step } }))
    }

    /// `[eval]`: on by default for sft (every quarter of the run), off for pretrain.
    pub(super) fn eval(&self, raw: Option<RawEval>, kind: Kind, model: &Model, data: &Data, train: &Train) -> R<Eval> {
        if kind == Kind::Command {
            if raw.is_some() {
                return Err(self.invalid(
                    "eval",
                    "[eval] is for the embedded trainers; a kind = \"command\" program runs its own evals".into(),
                ));
            }
            return Ok(Eval { every: 0, ..Eval::default() });
        }
        let raw = raw.unwrap_or_default();
        let defaults = Eval::default();
        let default_every = match kind {
            Kind::Sft => (train.steps / 4).max(1),
            _ => 0,
        };
        let every = self.int_in("eval.every", raw.every.unwrap_or(default_every as i64), 0, MAX_I64)? as u64;
        let prompts =
            self.int_in("eval.prompts", raw.prompts.unwrap_or(i64::from(defaults.prompts)), 1, MAX_EVAL_PROMPTS)?;
        // A prompt needs at least one token of the context besides what is generated.
        let most = i64::from(model.context.saturating_sub(1)).max(1);
        let max_new_tokens = self
            .int_in("eval.max_new_tokens", raw.max_new_tokens.unwrap_or(i64::from(defaults.max_new_tokens)), 1, most)
            .map_err(|_| {
                self.invalid(
                    "eval.max_new_tokens",
                    format!(
                        "{} does not fit: a prompt and its answer share {} tokens; valid: 1 to {most}",
                        self.ctx.show("eval.max_new_tokens", raw.max_new_tokens.unwrap_or(0)),
                        self.ctx.show("model.context", model.context)
                    ),
                )
            })?;
        let arith = matches!(&data.source, DataSource::Synthetic { generator } if generator.starts_with("arith"));
        let pairs_file = kind == Kind::Sft && matches!(data.source, DataSource::File { .. });
        if every > 0 && !arith && !pairs_file {
            return Err(self.invalid(
                "eval.every",
                format!(
                    "{}: held-out prompts come from synthetic:arith(-qa) or an sft run's JSONL file, and {} is neither; set eval.every = 0",
                    self.ctx.show("eval.every", every),
                    self.ctx.show("data.source", self.source_text(&data.source))
                ),
            ));
        }
        Ok(Eval { every, prompts: prompts as u32, max_new_tokens: max_new_tokens as u32 })
    }

    /// Pretraining reads sequences, fine-tuning reads (prompt, response) pairs.
    pub(super) fn pairing(&self, kind: Kind, data: &Data, model: &Model) -> R<()> {
        let DataSource::Synthetic { generator } = &data.source else { return Ok(()) };
        let pairs = PAIR_GENERATORS.contains(&generator.as_str());
        // The longest fact with its answer ("99-9=90;") is 8 tokens: a row holds context + 1.
        if kind == Kind::Sft && pairs && model.context < 8 {
            return Err(self.invalid(
                "model.context",
                format!(
                    "{} is shorter than one question and its answer (8 tokens); valid: 8 or more",
                    self.ctx.show("model.context", model.context)
                ),
            ));
        }
        let shown = || self.ctx.show("data.source", format!("\"synthetic:{generator}\""));
        match kind {
            Kind::Sft if !pairs => Err(self.invalid(
                "data.source",
                format!(
                    r#"{} makes plain sequences, and kind = "sft" trains on (prompt, response) pairs; valid: "synthetic:arith-qa", or "file:<path>.jsonl" with "prompt" and "response" on each line"#,
                    shown()
                ),
            )),
            Kind::Pretrain if pairs => Err(self.invalid(
                "data.source",
                format!(r#"{} makes (prompt, response) pairs for kind = "sft"; pretraining reads "synthetic:arith""#, shown()),
            )),
            _ => Ok(()),
        }
    }
}
