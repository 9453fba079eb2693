//! Validation of what post-training adds: `[init]`, `[eval]`, and which data each kind trains on.
use super::check::{Check, MAX_I64, R};
use super::raw::{RawDpo, RawEval, RawGrpo, RawInit};
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
            Kind::Sft | Kind::Dpo | Kind::Grpo => (train.steps / 4).max(1),
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
        let pairs_file =
            matches!(kind, Kind::Sft | Kind::Dpo | Kind::Grpo) && matches!(data.source, DataSource::File { .. });
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

    /// `[dpo] beta`: positive (β = 0 makes the loss a constant, β < 0 prefers the rejected).
    pub(super) fn dpo(&self, raw: Option<RawDpo>, kind: Kind) -> R<Dpo> {
        let Some(raw) = raw else { return Ok(Dpo::default()) };
        if kind != Kind::Dpo {
            return Err(self.invalid(
                "dpo",
                format!(
                    "[dpo] is read by kind = \"dpo\" only, and this recipe is kind = \"{}\"; remove the table",
                    self.kind
                ),
            ));
        }
        let beta = raw.beta.unwrap_or(Dpo::default().beta);
        let beta = self.float("dpo.beta", beta, beta > 0.0, "a positive number, e.g. 0.1 (TRL's default)")?;
        Ok(Dpo { beta })
    }

    /// `[grpo]`: a group of at least 2 (advantages compare completions of one prompt), sampling
    /// that is a distribution, completions that leave the prompt room in the context.
    pub(super) fn grpo(&self, raw: Option<RawGrpo>, kind: Kind, model: &Model) -> R<Grpo> {
        let Some(raw) = raw else { return Ok(Grpo::default()) };
        if kind != Kind::Grpo {
            return Err(self.invalid(
                "grpo",
                format!(
                    "[grpo] is read by kind = \"grpo\" only, and this recipe is kind = \"{}\"; remove the table",
                    self.kind
                ),
            ));
        }
        let d = Grpo::default();
        let group_size = raw.group_size.unwrap_or(i64::from(d.group_size));
        if group_size < 2 {
            return Err(self.invalid(
                "grpo.group_size",
                format!(
                    "{} must be at least 2: a completion's advantage is its reward against its group's, and a group of one has nothing to compare (valid: 2 to 256, e.g. 8)",
                    self.ctx.show("grpo.group_size", group_size)
                ),
            ));
        }
        let group_size = self.int_in("grpo.group_size", group_size, 2, 256)? as u32;
        let t = raw.temperature.unwrap_or(d.temperature);
        let temperature =
            self.float("grpo.temperature", t, t > 0.0 && t <= 10.0, "above 0 and at most 10, e.g. 1.0")?;
        let p = raw.top_p.unwrap_or(d.top_p);
        let top_p = self.float("grpo.top_p", p, p > 0.0 && p <= 1.0, "above 0 and at most 1 (1: no nucleus cut)")?;
        // The prompt keeps at least 8 tokens: the shortest question with its answer.
        let most = i64::from(model.context) - 8;
        let max_new = raw.max_new_tokens.unwrap_or(i64::from(d.max_new_tokens));
        if max_new < 1 || max_new > most {
            return Err(self.invalid(
                "grpo.max_new_tokens",
                format!(
                    "{} does not fit: a prompt (at least 8 tokens) and its completion share {} tokens; valid: 1 to {}",
                    self.ctx.show("grpo.max_new_tokens", max_new),
                    self.ctx.show("model.context", model.context),
                    most.max(1)
                ),
            ));
        }
        let ppo_epochs =
            self.int_in("grpo.ppo_epochs", raw.ppo_epochs.unwrap_or(i64::from(d.ppo_epochs)), 1, 16)? as u32;
        let e = raw.clip_eps.unwrap_or(d.clip_eps);
        let clip_eps = self.float("grpo.clip_eps", e, e > 0.0 && e < 1.0, "above 0 and below 1, e.g. 0.2")?;
        let b = raw.beta.unwrap_or(d.beta);
        let beta =
            self.float("grpo.beta", b, b >= 0.0, "0 or more (0: no KL penalty, no reference model), e.g. 0.04")?;
        let f = raw.format_reward.unwrap_or(d.format_reward);
        let format_reward =
            self.float("grpo.format_reward", f, f >= 0.0, "0 or more (0: exact match only), e.g. 0.1")?;
        let samples = self.int_in("grpo.samples", raw.samples.unwrap_or(i64::from(d.samples)), 0, 16)? as u32;
        Ok(Grpo {
            group_size,
            temperature,
            top_p,
            max_new_tokens: max_new as u32,
            ppo_epochs,
            clip_eps,
            beta,
            format_reward,
            samples,
        })
    }

    /// Pretraining reads sequences, fine-tuning reads (prompt, response) pairs.
    pub(super) fn pairing(&self, kind: Kind, data: &Data, model: &Model) -> R<()> {
        let DataSource::Synthetic { generator } = &data.source else { return Ok(()) };
        let pairs = PAIR_GENERATORS.contains(&generator.as_str());
        // The longest fact with its answer ("99-9=90;") is 8 tokens, and a wrong answer may have
        // a digit more: a row holds context + 1.
        if matches!(kind, Kind::Sft | Kind::Dpo | Kind::Grpo) && pairs && model.context < 8 {
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
            Kind::Dpo if !pairs => Err(self.invalid(
                "data.source",
                format!(
                    r#"{} makes plain sequences, and kind = "dpo" trains on preferences; valid: "synthetic:arith-qa" (the true answer chosen, a wrong one rejected), or "file:<path>.jsonl" with "prompt", "chosen" and "rejected" on each line"#,
                    shown()
                ),
            )),
            Kind::Grpo if !pairs => Err(self.invalid(
                "data.source",
                format!(
                    r#"{} makes plain sequences, and kind = "grpo" needs prompts with checkable answers; valid: "synthetic:arith-qa", or "file:<path>.jsonl" with "prompt" and "response" (the answer) on each line"#,
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
