//! What a Python rank's own metric writers logged, as the shim reports it (`assets/shim/sitecustomize.py`): the same records as a printed line.
//!
//! The shim wraps `SummaryWriter.add_scalar`/`add_scalars` (torch.utils.tensorboard and
//! tensorboardX), HF `Trainer.log` (TRL's trainers call it too) and wandb's `Run.log`, and sends
//! each call's numbers and step as one `Logged` JSON line on the telemetry socket. The values
//! are the writer's own (full precision, the true step), so they make the same records a
//! printed line would: a Trainer's dict is a step, an eval or the final summary, as when
//! printed (`hf::kind_of`); a scalar is a step's metric under its tag. Every record is labelled
//! `writer` so the agent can tell it from the printed copy of the same dict.
use super::{hf, Label, Record, RecordKind};
use serde::{Deserialize, Deserializer};

/// The writers the shim wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Writer {
    /// `SummaryWriter.add_scalar` / `add_scalars`.
    Tensorboard,
    /// `transformers.Trainer.log`.
    HfTrainer,
    /// `wandb.sdk.wandb_run.Run.log` (what `wandb.log` calls).
    Wandb,
}

impl Writer {
    pub const ALL: [Writer; 3] = [Writer::Tensorboard, Writer::HfTrainer, Writer::Wandb];

    pub fn name(self) -> &'static str {
        match self {
            Writer::Tensorboard => "tensorboard",
            Writer::HfTrainer => "hf_trainer",
            Writer::Wandb => "wandb",
        }
    }
}

/// One writer call, as the shim sends it:
/// `{"Logged": {"writer": "hf_trainer", "step": 10, "metrics": [["loss", 0.52], ["epoch", "nan"]]}}`.
/// JSON has no NaN or infinity, so those travel as the strings `"nan"`, `"inf"`, `"-inf"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logged {
    pub writer: Writer,
    /// The writer's step (`global_step`, `state.global_step`, wandb's `step=`), if it had one.
    #[serde(default)]
    pub step: Option<u64>,
    #[serde(deserialize_with = "metrics")]
    pub metrics: Vec<(String, f64)>,
}

/// The label naming a record's writer.
pub const WRITER_LABEL: &str = "writer";

/// The record a writer call makes, numbered `line` (the telemetry line it came on).
pub fn record(line: u64, logged: Logged) -> Record {
    let kind = match logged.writer {
        Writer::HfTrainer => hf::kind_of(&logged.metrics),
        Writer::Tensorboard | Writer::Wandb => RecordKind::Step,
    };
    let mut r = Record::at(line, kind);
    r.step = logged.step;
    r.metrics = logged.metrics;
    r.labels.push((WRITER_LABEL.into(), Label::Text(logged.writer.name().into())));
    r
}

/// A record a writer call made, not a printed line: which writer.
pub fn writer_of(record: &Record) -> Option<Writer> {
    match record.label(WRITER_LABEL) {
        Some(Label::Text(name)) => Writer::ALL.into_iter().find(|w| w.name() == name),
        _ => None,
    }
}

fn metrics<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, f64)>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Number(f64),
        Text(String),
    }
    let raw = Vec::<(String, Value)>::deserialize(d)?;
    raw.into_iter()
        .map(|(name, value)| {
            let v = match value {
                Value::Number(v) => v,
                Value::Text(t) => match t.as_str() {
                    "nan" => f64::NAN,
                    "inf" => f64::INFINITY,
                    "-inf" => f64::NEG_INFINITY,
                    _ => {
                        return Err(serde::de::Error::custom(format!(
                            "metric {name:?} is {t:?}; valid: a number, \"nan\", \"inf\" or \"-inf\""
                        )))
                    }
                },
            };
            Ok((name, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Logged, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn a_trainer_dict_is_a_step_an_eval_or_the_summary_as_when_printed() {
        let step = parse(
            r#"{"writer": "hf_trainer", "step": 10, "metrics": [["loss", 0.5], ["grad_norm", 1.5], ["epoch", 0.1]]}"#,
        );
        let r = record(3, step.expect("a step"));
        assert_eq!((r.kind, r.step, r.line), (RecordKind::Step, Some(10), 3));
        assert_eq!(r.metrics, vec![("loss".into(), 0.5), ("grad_norm".into(), 1.5), ("epoch".into(), 0.1)]);
        assert_eq!(writer_of(&r), Some(Writer::HfTrainer));
        let eval = parse(r#"{"writer": "hf_trainer", "step": 10, "metrics": [["eval_loss", 0.7], ["epoch", 0.1]]}"#);
        assert_eq!(record(4, eval.expect("an eval")).kind, RecordKind::Eval);
        let summary =
            parse(r#"{"writer": "hf_trainer", "step": 20, "metrics": [["train_runtime", 3.1], ["train_loss", 0.4]]}"#);
        assert_eq!(record(5, summary.expect("a summary")).kind, RecordKind::TrainSummary);
    }

    #[test]
    fn a_scalar_is_a_step_metric_and_a_nan_loss_survives_the_json() {
        let r = record(
            1,
            parse(r#"{"writer": "tensorboard", "step": 7, "metrics": [["train/loss", "nan"]]}"#).expect("nan"),
        );
        assert_eq!((r.kind, r.step), (RecordKind::Step, Some(7)));
        assert!(r.metrics[0].1.is_nan());
        let standard = crate::adapters::standard(&r);
        assert!(standard.iter().any(|(n, v)| *n == "loss" && v.is_nan()), "{standard:?}");
        let inf = parse(r#"{"writer": "wandb", "metrics": [["reward", "-inf"]]}"#).expect("no step");
        assert_eq!((inf.step, inf.metrics[0].1), (None, f64::NEG_INFINITY));
        assert_eq!(writer_of(&crate::adapters::Record::at(1, RecordKind::Step)), None);
    }

    #[test]
    fn a_bad_writer_line_names_what_is_wrong_and_what_is_valid() {
        let e = parse(r#"{"writer": "mlflow", "metrics": []}"#).expect_err("unknown writer").to_string();
        assert!(e.contains("mlflow") && e.contains("hf_trainer"), "{e}");
        let e = parse(r#"{"writer": "wandb", "metrics": [["loss", "lots"]]}"#).expect_err("not a number").to_string();
        assert!(e.contains("\"loss\"") && e.contains("\"nan\""), "{e}");
    }
}
