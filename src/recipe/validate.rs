//! Validation: the raw recipe checked once into the typed `Recipe`, defaults filled in.
//!
//! Flow: text → TOML tree → schema and type check → `--set` overrides → raw serde structs →
//! the checks below. Every error names the file, the dotted key and what would be valid.
use super::check::{Check, MAX_I64, MAX_U32, R};
use super::error::{ErrorKind, RecipeError};
use super::raw::*;
use super::tree::{self, Ctx};
use super::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Parses and validates recipe text. `origin` names the input in messages; relative `file:` data
/// paths resolve against its directory.
pub fn parse_str(text: &str, origin: &str, overrides: &[String]) -> Result<Recipe, RecipeError> {
    parse_with_base(text, origin, Path::new(origin).parent(), overrides)
}

/// Reads, parses and validates a recipe file. Messages name `path` as given; relative `file:`
/// data paths become absolute, because the server that launches the run has its own directory.
pub fn load_file(path: &Path, overrides: &[String]) -> Result<Recipe, RecipeError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| read_error(path, &origin, &e))?;
    let base = std::path::absolute(path).ok().and_then(|p| p.parent().map(Path::to_path_buf));
    parse_with_base(&text, &origin, base.as_deref(), overrides)
}

pub(super) fn read_error(path: &Path, origin: &str, e: &std::io::Error) -> RecipeError {
    let message = match e.kind() {
        std::io::ErrorKind::InvalidData => "is not UTF-8 text; recipes are UTF-8 TOML".to_string(),
        std::io::ErrorKind::NotFound => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let mut found: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".toml"))
                .collect();
            found.sort();
            match found.is_empty() {
                true => format!("no such file; there are no .toml recipes in {}", dir.display()),
                false => format!("no such file; recipes in {}: {}", dir.display(), found.join(", ")),
            }
        }
        _ => format!("cannot read the recipe: {e}"),
    };
    RecipeError::new(origin, ErrorKind::Io, None, message)
}

fn parse_with_base(text: &str, origin: &str, base: Option<&Path>, overrides: &[String]) -> Result<Recipe, RecipeError> {
    let doc = tree::parse_document(text, origin)?;
    if doc.contains_key("sweep") {
        let message = format!(
            "[sweep] makes many runs of this recipe: start them with `flightdeck sweep {origin}` \
             (`flightdeck run` starts one run; leave [sweep] out of a recipe meant for it)"
        );
        return Err(RecipeError::new(origin, ErrorKind::Invalid, Some("sweep"), message));
    }
    validate_doc(doc, origin, base, overrides)
}

/// Checks a parsed recipe document (without `[sweep]`), applies `overrides`, and validates it.
pub(super) fn validate_doc(
    mut doc: toml::Table,
    origin: &str,
    base: Option<&Path>,
    overrides: &[String],
) -> Result<Recipe, RecipeError> {
    let mut ctx = Ctx { origin, set_by: BTreeMap::new() };
    tree::check_schema(&mut doc, &ctx)?;
    tree::apply_overrides(&mut doc, overrides, &mut ctx)?;
    // The schema check has vetted every key and type, so serde failing here means the schema
    // and the raw structs disagree: a bug, reported rather than panicked on.
    let raw: RawRecipe = toml::Value::Table(doc).try_into().map_err(|e: toml::de::Error| {
        let message = format!("internal error: schema and raw structs disagree: {}", e.message());
        RecipeError::new(origin, ErrorKind::WrongType, None, message)
    })?;
    Check::new(&ctx, base).recipe(raw)
}

impl Check<'_> {
    fn recipe(mut self, raw: RawRecipe) -> R<Recipe> {
        let name = self.name(raw.name)?;
        let kind = self.kind(raw.kind)?;
        // `command` runs launch any program, so the model and trainer sections are optional for
        // them; absent numbers read as 0 and the cross-checks that only matter to training skip.
        let trains = kind != Kind::Command;
        let model = self.model(raw.model.unwrap_or_default(), trains)?;
        let data = self.data(raw.data.unwrap_or_default(), trains, &model)?;
        let cluster = self.cluster(raw.cluster.unwrap_or_default())?;
        let train = self.train(raw.train.unwrap_or_default(), trains, cluster.device)?;
        let parallel = self.parallel(raw.parallel.unwrap_or_default(), &cluster)?;
        let checkpoint = self.checkpoint(raw.checkpoint.unwrap_or_default())?;
        let telemetry = self.telemetry(raw.telemetry.unwrap_or_default())?;
        let written = raw.fault.map(super::raw::OneOrMany::into_vec).unwrap_or_default();
        let listed = written.len() > 1;
        let mut faults = Vec::new();
        for (i, f) in written.into_iter().enumerate() {
            let at = if listed { format!("fault[{i}]") } else { "fault".to_string() };
            faults.push(self.fault(&at, f, parallel.data, &train, trains)?);
        }
        faults.retain(|f| f.kind != FaultKind::None);
        let recovery = self.recovery(raw.recovery.unwrap_or_default())?;
        let command = self.command(raw.command, kind)?;
        let analysis = self.analysis(raw.analysis.unwrap_or_default())?;
        self.pairing(kind, &data, &model)?;
        let init = self.init(raw.init, kind)?;
        let eval = self.eval(raw.eval, kind, &model, &data, &train)?;
        let dpo = self.dpo(raw.dpo, kind)?;
        let grpo = self.grpo(raw.grpo, kind, &model)?;
        Ok(Recipe {
            name,
            kind,
            model,
            data,
            train,
            parallel,
            checkpoint,
            cluster,
            telemetry,
            faults,
            command,
            analysis,
            init,
            eval,
            dpo,
            grpo,
            recovery,
        })
    }

    fn name(&self, name: Option<String>) -> R<String> {
        let Some(name) = name else {
            let message = r#"name is missing; add name = "my-run" at the top of the file, above the first [table]"#;
            return Err(self.ctx.err(ErrorKind::Missing, "name", message.to_string()));
        };
        let ok = (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        match ok {
            true => Ok(name),
            false => Err(self.invalid(
                "name",
                format!(
                    "{} is not a valid run name; use 1 to 64 letters, digits, '-', '_' or '.'",
                    self.ctx.show("name", format!("{name:?}"))
                ),
            )),
        }
    }

    fn kind(&mut self, kind: Option<String>) -> R<Kind> {
        use Kind::*;
        let options = [("pretrain", Pretrain), ("sft", Sft), ("dpo", Dpo), ("grpo", Grpo), ("command", Command)];
        let kind = self.choice("kind", kind, Pretrain, &options)?;
        self.kind = options.iter().find(|(_, k)| *k == kind).map_or("pretrain", |(n, _)| n);
        Ok(kind)
    }

    fn model(&self, raw: RawModel, trains: bool) -> R<Model> {
        let size = |key: &str, v| self.required(key, v, trains, 1, MAX_U32).map(|v| v as u32);
        let model = Model {
            n_layer: size("model.n_layer", raw.n_layer)?,
            n_head: size("model.n_head", raw.n_head)?,
            d_model: size("model.d_model", raw.d_model)?,
            context: size("model.context", raw.context)?,
            vocab: size("model.vocab", raw.vocab)?,
        };
        if trains && !model.d_model.is_multiple_of(model.n_head) {
            return Err(self.invalid(
                "model.n_head",
                format!(
                    "{} does not divide {}; choose n_head from {}",
                    self.ctx.show("model.n_head", model.n_head),
                    self.ctx.show("model.d_model", model.d_model),
                    divisors(model.d_model)
                ),
            ));
        }
        Ok(model)
    }

    fn data(&self, raw: RawData, trains: bool, model: &Model) -> R<Data> {
        let seed = self.int_in("data.seed", raw.seed.unwrap_or(0), 0, MAX_I64)? as u64;
        let source = match raw.source {
            Some(s) => self.source(&s)?,
            None if trains => return Err(self.missing("data.source", r#""synthetic:arith" or "file:<path>""#)),
            // Unused by command runs; any valid value will do.
            None => DataSource::Synthetic { generator: first_generator() },
        };
        let needs = match &source {
            DataSource::Synthetic { generator } => {
                SYNTHETIC_GENERATORS.iter().find(|(g, _)| g == generator).map_or(0, |(_, vocab)| *vocab)
            }
            DataSource::File { .. } => FILE_VOCAB,
        };
        if trains && model.vocab < needs {
            let shown = self.ctx.show("model.vocab", model.vocab);
            let from = self.ctx.show("data.source", self.source_text(&source));
            return Err(self.invalid(
                "model.vocab",
                format!(
                "{shown} is smaller than the {needs} token ids that {from} produces; set model.vocab to {needs} or more"
            ),
            ));
        }
        let skip_batches = self.int_in("data.skip_batches", raw.skip_batches.unwrap_or(0), 0, MAX_I64)? as u64;
        Ok(Data { source, seed, skip_batches })
    }

    fn source(&self, text: &str) -> R<DataSource> {
        let shown = self.ctx.show("data.source", format!("{text:?}"));
        let generators = || {
            let names: Vec<String> = SYNTHETIC_GENERATORS.iter().map(|(g, _)| format!("synthetic:{g}")).collect();
            names.join(", ")
        };
        if let Some(generator) = text.strip_prefix("synthetic:") {
            return match SYNTHETIC_GENERATORS.iter().any(|(g, _)| *g == generator) {
                true => Ok(DataSource::Synthetic { generator: generator.to_string() }),
                false => {
                    Err(self
                        .invalid("data.source", format!("{shown} names no shipped generator; valid: {}", generators())))
                }
            };
        }
        if let Some(path) = text.strip_prefix("file:") {
            if path.trim().is_empty() {
                return Err(self.invalid(
                    "data.source",
                    format!(r#"{shown} has no path; e.g. "file:data/corpus.txt" (relative to the recipe's directory)"#),
                ));
            }
            let path = PathBuf::from(path);
            let path = match (path.is_relative(), self.base) {
                (true, Some(base)) => base.join(path),
                _ => path,
            };
            return Ok(DataSource::File { path });
        }
        Err(self.invalid(
            "data.source",
            format!(
                r#"{shown} is not a data source; valid: "synthetic:<generator>" ({}) or "file:<path>""#,
                generators()
            ),
        ))
    }

    pub(super) fn source_text(&self, source: &DataSource) -> String {
        match source {
            DataSource::Synthetic { generator } => format!("\"synthetic:{generator}\""),
            DataSource::File { path } => format!("\"file:{}\"", path.display()),
        }
    }
}

/// `1, 2, 4, 8, ...`: the head counts that divide `d_model`, for the n_head message.
fn divisors(d_model: u32) -> String {
    let mut all: Vec<u32> =
        (1..=d_model.isqrt()).filter(|h| d_model.is_multiple_of(*h)).flat_map(|h| [h, d_model / h]).collect();
    all.sort_unstable();
    all.dedup();
    let shown: Vec<String> = all.iter().take(8).map(u32::to_string).collect();
    match all.len() > 8 {
        true => format!("{}, ...", shown.join(", ")),
        false => shown.join(", "),
    }
}

fn first_generator() -> String {
    SYNTHETIC_GENERATORS.first().map_or("arith", |(g, _)| g).to_string()
}
