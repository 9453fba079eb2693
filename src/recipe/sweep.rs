//! `[sweep]`: one recipe expanded into points, each a validated recipe that becomes one run of
//! the sweep (`flightdeck sweep`). A grid over keys, random draws from ranges, or both (each
//! grid point with each draw):
//!
//! ```toml
//! [sweep]
//! name = "lr-sweep"      # default: the recipe's name + "-sweep"
//! max_parallel = 2       # runs of the sweep live at once (default: as many as fit)
//! max_ranks = 4          # ranks live at once (default: this machine's cores, else one point)
//! max_points = 256       # a sweep that expands to more is refused (at most 10,000)
//! [sweep.grid]
//! "train.lr" = [1e-3, 3e-3]
//! "grpo.group_size" = [4, 8]
//! [sweep.random]         # with draws (and seed): each key drawn per draw
//! "train.warmup" = { min = 0, max = 20 }                 # integers: inclusive
//! "train.lr" = { min = 1e-4, max = 1e-2, log = true }    # floats: 4 significant digits
//! "train.schedule" = { choice = ["cosine", "linear"] }
//! ```
//! Every key must be one `--set` accepts; every point is validated before anything is queued.
use super::error::{ErrorKind, RecipeError};
use super::{tree, validate, Recipe};
use serde::Deserialize;
use std::path::Path;
use toml::{Table, Value};

/// Points a sweep may expand to unless `sweep.max_points` says otherwise.
pub const DEFAULT_MAX_POINTS: u32 = 256;
/// The most `sweep.max_points` may allow.
pub const MAX_POINTS_CAP: u32 = 10_000;

/// A sweep expanded, every point validated.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    pub name: String,
    /// The swept keys: the grid's (the file's sorted by name, then `--set-grid`'s new ones),
    /// then the random ones (sorted); each point's values are in this order.
    pub keys: Vec<String>,
    pub points: Vec<PlannedPoint>,
    /// None: as many as the capacity allows.
    pub max_parallel: Option<u32>,
    /// None: the server's default (its cores for local points, else one point at a time).
    pub max_ranks: Option<u32>,
}

/// One point: each swept key's value as TOML text, and the recipe they give.
#[derive(Clone, Debug)]
pub struct PlannedPoint {
    pub values: Vec<String>,
    pub recipe: Recipe,
}

/// How a random key is drawn.
#[derive(Clone, Debug, PartialEq)]
enum Draw {
    Float { min: f64, max: f64, log: bool },
    Int { min: i64, max: i64 },
    Choice(Vec<Value>),
}

/// The `[sweep]` table's own settings, before expansion.
struct Settings {
    name: Option<String>,
    max_parallel: Option<u32>,
    max_ranks: Option<u32>,
    max_points: u32,
    grid: Vec<(String, Vec<Value>)>,
    random: Vec<(String, Draw)>,
    draws: u32,
    seed: u64,
}

const KEYS: &str = "name, max_parallel, max_ranks, max_points, grid, random, draws, seed";

/// Reads the recipe at `path`, its `[sweep]` and `--set-grid KEY=V1,V2` arguments (which add
/// to the grid, or replace a key the file's grid has), and validates every point with
/// `overrides` (`--set`) applied under the point's own values.
pub fn load_sweep(path: &Path, overrides: &[String], set_grid: &[String]) -> Result<SweepPlan, RecipeError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| validate::read_error(path, &origin, &e))?;
    let base = std::path::absolute(path).ok().and_then(|p| p.parent().map(Path::to_path_buf));
    plan(&text, &origin, base.as_deref(), overrides, set_grid)
}

/// `load_sweep` on text (`origin` names it in messages).
pub fn parse_sweep(
    text: &str,
    origin: &str,
    overrides: &[String],
    set_grid: &[String],
) -> Result<SweepPlan, RecipeError> {
    plan(text, origin, Path::new(origin).parent(), overrides, set_grid)
}

fn plan(
    text: &str,
    origin: &str,
    base: Option<&Path>,
    overrides: &[String],
    set_grid: &[String],
) -> Result<SweepPlan, RecipeError> {
    let mut doc = tree::parse_document(text, origin)?;
    let err = |kind, key: &str, message: String| RecipeError::new(origin, kind, Some(key), message);
    let table = match doc.remove("sweep") {
        None => Table::new(),
        Some(Value::Table(t)) => t,
        Some(other) => {
            let message = format!("sweep must be a table [sweep] with keys {KEYS}, got {}", other.type_str());
            return Err(err(ErrorKind::WrongType, "sweep", message));
        }
    };
    let mut s = settings(table, origin)?;
    for arg in set_grid {
        let (key, values) = grid_arg(arg).map_err(|m| err(ErrorKind::BadOverride, "sweep.grid", m))?;
        match s.grid.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = values,
            None => s.grid.push((key, values)),
        }
    }
    if s.grid.is_empty() && s.random.is_empty() {
        let message = "nothing to sweep: give [sweep.grid] (e.g. \"train.lr\" = [1e-3, 3e-3]), [sweep.random] with \
                       draws, or --set-grid KEY=V1,V2"
            .to_string();
        return Err(err(ErrorKind::Missing, "sweep", message));
    }
    let keys: Vec<String> =
        s.grid.iter().map(|(k, _)| k.clone()).chain(s.random.iter().map(|(k, _)| k.clone())).collect();
    for (i, key) in keys.iter().enumerate() {
        if keys[..i].contains(key) {
            let message = format!("{key} is both in [sweep.grid] and [sweep.random]: sweep it one way");
            return Err(err(ErrorKind::Invalid, "sweep", message));
        }
        if let Err(why) = tree::resolve_key(key) {
            return Err(err(ErrorKind::UnknownKey, &format!("sweep.{key}"), format!("swept key {key}: {why}")));
        }
    }
    let combos = s.grid.iter().fold(1u64, |n, (_, v)| n.saturating_mul(v.len() as u64));
    let count = combos.saturating_mul(if s.random.is_empty() { 1 } else { u64::from(s.draws) });
    if count > u64::from(s.max_points) {
        let message = format!(
            "[sweep] expands to {count} points, more than sweep.max_points = {}; narrow the grid or the draws, or \
             raise sweep.max_points (at most {MAX_POINTS_CAP})",
            s.max_points
        );
        return Err(err(ErrorKind::Invalid, "sweep.max_points", message));
    }
    let drawn = draw_all(&s.random, s.draws, s.seed);
    let mut points = Vec::with_capacity(count as usize);
    for c in 0..combos {
        // The grid's last key varies fastest, as nested loops would write it.
        let mut rest = c;
        let mut grid_values = vec![Value::Boolean(false); s.grid.len()];
        for (slot, (_, values)) in grid_values.iter_mut().zip(&s.grid).rev() {
            let n = values.len() as u64;
            *slot = values[(rest % n) as usize].clone();
            rest /= n;
        }
        let draws: Vec<Vec<Value>> = if s.random.is_empty() { vec![Vec::new()] } else { drawn.clone() };
        for draw in draws {
            let values: Vec<String> = grid_values.iter().chain(draw.iter()).map(|v| v.to_string()).collect();
            let index = points.len() + 1;
            let mut sets = overrides.to_vec();
            sets.extend(keys.iter().zip(&values).map(|(k, v)| format!("{k}={v}")));
            let recipe = validate::validate_doc(doc.clone(), origin, base, &sets).map_err(|e| {
                let at: Vec<String> = keys.iter().zip(&values).map(|(k, v)| format!("{k} = {v}")).collect();
                // The point's values reach the recipe as `--set`s: say which came from the sweep.
                let said = match e.key().is_some_and(|k| keys.iter().any(|s| s == k)) {
                    true => e.message().replace(" (from --set)", " (swept)"),
                    false => e.message().to_string(),
                };
                let message = format!("sweep point {index} of {count} ({}): {said}", at.join(", "));
                RecipeError::new(origin, e.kind(), e.key(), message)
            })?;
            points.push(PlannedPoint { values, recipe });
        }
    }
    let name = match s.name {
        Some(n) => n,
        None => format!("{}-sweep", points.first().map_or("recipe", |p| p.recipe.name.as_str())),
    };
    Ok(SweepPlan { name, keys, points, max_parallel: s.max_parallel, max_ranks: s.max_ranks })
}

fn settings(table: Table, origin: &str) -> Result<Settings, RecipeError> {
    let err = |kind, key: &str, message: String| RecipeError::new(origin, kind, Some(key), message);
    let mut s = Settings {
        name: None,
        max_parallel: None,
        max_ranks: None,
        max_points: DEFAULT_MAX_POINTS,
        grid: Vec::new(),
        random: Vec::new(),
        draws: 0,
        seed: 0,
    };
    let mut draws = None;
    for (key, value) in table {
        let dotted = format!("sweep.{key}");
        let int = |lo: i64, hi: i64| match value.as_integer() {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            Some(n) => Err(err(ErrorKind::Invalid, &dotted, format!("{dotted} = {n} is out of range: {lo} to {hi}"))),
            None => Err(err(
                ErrorKind::WrongType,
                &dotted,
                format!("{dotted} = {value} has the wrong type: expected an integer, got {}", value.type_str()),
            )),
        };
        match key.as_str() {
            "name" => match value.as_str() {
                Some(n) if !n.trim().is_empty() => s.name = Some(n.trim().to_string()),
                _ => return Err(err(ErrorKind::Invalid, &dotted, format!("{dotted} must be a non-empty string"))),
            },
            "max_parallel" => s.max_parallel = Some(int(1, 4096)? as u32),
            "max_ranks" => s.max_ranks = Some(int(1, 1 << 20)? as u32),
            "max_points" => s.max_points = int(1, i64::from(MAX_POINTS_CAP))? as u32,
            "draws" => draws = Some(int(1, i64::from(MAX_POINTS_CAP))? as u32),
            "seed" => s.seed = int(0, i64::MAX)? as u64,
            "grid" => s.grid = grid(value, origin)?,
            "random" => s.random = random(value, origin)?,
            other => {
                let message = format!("unknown key sweep.{other}; valid keys in [sweep]: {KEYS}");
                return Err(err(ErrorKind::UnknownKey, &dotted, message));
            }
        }
    }
    match (s.random.is_empty(), draws) {
        (false, None) => {
            let message = "[sweep.random] needs sweep.draws: how many points to draw (e.g. draws = 8)".to_string();
            return Err(err(ErrorKind::Missing, "sweep.draws", message));
        }
        (true, Some(_)) => {
            let message = "sweep.draws without [sweep.random]: nothing to draw".to_string();
            return Err(err(ErrorKind::Invalid, "sweep.draws", message));
        }
        (_, d) => s.draws = d.unwrap_or(0),
    }
    Ok(s)
}

fn grid(value: Value, origin: &str) -> Result<Vec<(String, Vec<Value>)>, RecipeError> {
    let err = |key: &str, message: String| RecipeError::new(origin, ErrorKind::WrongType, Some(key), message);
    let Value::Table(t) = value else {
        return Err(err(
            "sweep.grid",
            "sweep.grid must be a table: \"KEY\" = [values], e.g. \"train.lr\" = [1e-3, 3e-3]".into(),
        ));
    };
    let mut out = Vec::new();
    for (key, values) in t {
        let dotted = format!("sweep.grid.\"{key}\"");
        match values {
            Value::Array(v) if !v.is_empty() => out.push((key, v)),
            Value::Array(_) => {
                let message = format!("{dotted} = []: give at least one value");
                return Err(RecipeError::new(origin, ErrorKind::Invalid, Some(&dotted), message));
            }
            // A table here is TOML's reading of an unquoted dotted key: `train.lr = [..]`.
            Value::Table(_) => {
                let message = format!("sweep.grid.{key} is a table: quote dotted keys, e.g. \"{key}.NAME\" = [1, 2]");
                return Err(err(&dotted, message));
            }
            other => {
                let message = format!("{dotted} = {other} must be a list of values, e.g. [{other}]");
                return Err(err(&dotted, message));
            }
        }
    }
    Ok(out)
}

fn random(value: Value, origin: &str) -> Result<Vec<(String, Draw)>, RecipeError> {
    let err = |kind, key: &str, message: String| RecipeError::new(origin, kind, Some(key), message);
    let Value::Table(t) = value else {
        let message = "sweep.random must be a table: \"KEY\" = { min = .., max = .. }".to_string();
        return Err(err(ErrorKind::WrongType, "sweep.random", message));
    };
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        min: Option<Value>,
        max: Option<Value>,
        log: Option<bool>,
        choice: Option<Vec<Value>>,
    }
    let mut out = Vec::new();
    for (key, spec) in t {
        let dotted = format!("sweep.random.\"{key}\"");
        let shape = "{ min = A, max = B } (integers, or floats with log = true|false) or { choice = [..] }";
        let raw: Raw = spec.clone().try_into().map_err(|e: toml::de::Error| {
            err(ErrorKind::WrongType, &dotted, format!("{dotted} = {spec}: {}; expected {shape}", e.message().trim()))
        })?;
        let draw = match (raw.min, raw.max, raw.choice) {
            (None, None, Some(c)) if !c.is_empty() && raw.log.is_none() => Draw::Choice(c),
            (Some(Value::Integer(min)), Some(Value::Integer(max)), None) if raw.log.is_none() => {
                if min > max {
                    return Err(err(
                        ErrorKind::Invalid,
                        &dotted,
                        format!("{dotted}: min = {min} is above max = {max}"),
                    ));
                }
                Draw::Int { min, max }
            }
            (Some(min), Some(max), None) if min.as_float().or(min.as_integer().map(|i| i as f64)).is_some() => {
                let f = |v: &Value| v.as_float().or(v.as_integer().map(|i| i as f64)).unwrap_or(f64::NAN);
                let (min, max, log) = (f(&min), f(&max), raw.log.unwrap_or(false));
                if !(min.is_finite() && max.is_finite() && min < max) {
                    let message = format!("{dotted}: min = {min} must be below max = {max}, both finite");
                    return Err(err(ErrorKind::Invalid, &dotted, message));
                }
                if log && min <= 0.0 {
                    let message = format!("{dotted}: log = true needs min > 0, got min = {min}");
                    return Err(err(ErrorKind::Invalid, &dotted, message));
                }
                Draw::Float { min, max, log }
            }
            _ => return Err(err(ErrorKind::Invalid, &dotted, format!("{dotted} = {spec}: expected {shape}"))),
        };
        out.push((key, draw));
    }
    Ok(out)
}

/// `KEY=V1,V2,...` from `--set-grid`: values split at top-level commas (not inside quotes or
/// brackets), each read as a TOML value, else as a string.
fn grid_arg(arg: &str) -> Result<(String, Vec<Value>), String> {
    let Some((key, text)) = arg.split_once('=') else {
        return Err(format!("--set-grid {arg}: expected KEY=V1,V2,..., e.g. --set-grid train.lr=1e-3,3e-3"));
    };
    let key = key.trim().to_string();
    let mut values = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0usize);
    let mut pieces = Vec::new();
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&text[start..]);
    for piece in pieces.into_iter().map(str::trim) {
        if piece.is_empty() {
            return Err(format!("--set-grid {arg}: an empty value; e.g. --set-grid {key}=1e-3,3e-3"));
        }
        values.push(Value::deserialize(toml::de::ValueDeserializer::new(piece)).unwrap_or(Value::String(piece.into())));
    }
    Ok((key, values))
}

/// `draws` rows of one value per random key, from `seed` (splitmix64: the same seed gives the
/// same points on every machine).
fn draw_all(random: &[(String, Draw)], draws: u32, seed: u64) -> Vec<Vec<Value>> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..draws)
        .map(|_| {
            random
                .iter()
                .map(|(_, d)| match d {
                    Draw::Int { min, max } => {
                        let span = (*max as i128 - *min as i128 + 1) as u128;
                        Value::Integer((*min as i128 + (u128::from(next()) % span) as i128) as i64)
                    }
                    Draw::Float { min, max, log } => {
                        let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                        let x = match log {
                            true => (min.ln() + (max.ln() - min.ln()) * u).exp(),
                            false => min + (max - min) * u,
                        };
                        Value::Float(four_digits(x).clamp(*min, *max))
                    }
                    Draw::Choice(c) => c[(next() % c.len() as u64) as usize].clone(),
                })
                .collect()
        })
        .collect()
}

/// `x` to 4 significant digits: a drawn learning rate reads 0.003162, not 0.0031622776601683794.
fn four_digits(x: f64) -> f64 {
    format!("{x:.3e}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped tiny recipe, so every point validates as a real run's would.
    const BASE: &str = include_str!("../../recipes/tiny-gpt.toml");

    fn sweep(extra: &str, set_grid: &[&str]) -> Result<SweepPlan, RecipeError> {
        let grid: Vec<String> = set_grid.iter().map(|s| s.to_string()).collect();
        parse_sweep(&format!("{BASE}{extra}"), "r.toml", &[], &grid)
    }

    #[test]
    fn a_grid_expands_to_every_combination_last_key_fastest() {
        let p = sweep(
            "[sweep]\nmax_parallel = 2\n[sweep.grid]\n\"train.lr\" = [0.001, 0.003]\n\"train.seed\" = [1, 2, 3]\n",
            &[],
        )
        .expect("plans");
        assert_eq!(p.name, "tiny-gpt-sweep");
        assert_eq!(p.keys, ["train.lr", "train.seed"]);
        assert_eq!(p.max_parallel, Some(2));
        let got: Vec<(f64, u64)> = p.points.iter().map(|pt| (pt.recipe.train.lr, pt.recipe.train.seed)).collect();
        assert_eq!(got, [(0.001, 1), (0.001, 2), (0.001, 3), (0.003, 1), (0.003, 2), (0.003, 3)]);
        assert_eq!(p.points[4].values, ["0.003", "2"]);
    }

    #[test]
    fn set_grid_adds_keys_and_replaces_the_files_values() {
        let p = sweep(
            "[sweep.grid]\n\"train.lr\" = [0.001, 0.003]\n",
            &["train.lr=0.01", "train.schedule=constant,\"linear\""],
        )
        .expect("plans");
        assert_eq!(p.keys, ["train.lr", "train.schedule"]);
        assert_eq!(p.points.len(), 2);
        assert_eq!(p.points[1].values, ["0.01", "\"linear\""]);
        assert_eq!(p.points[1].recipe.train.schedule, super::super::Schedule::Linear);
        // Without [sweep] at all, --set-grid alone is a sweep.
        assert_eq!(sweep("", &["train.seed=1,2,3,4"]).expect("plans").points.len(), 4);
    }

    #[test]
    fn random_draws_are_the_same_for_the_same_seed_and_inside_their_ranges() {
        let text =
            "[sweep]\ndraws = 16\nseed = 7\n[sweep.random]\n\"train.lr\" = { min = 1e-4, max = 1e-2, log = true }\n\
                    \"train.warmup\" = { min = 0, max = 3 }\n";
        let a = sweep(text, &[]).expect("plans");
        let b = sweep(text, &[]).expect("plans");
        assert_eq!(a.points.len(), 16);
        let lrs: Vec<f64> = a.points.iter().map(|p| p.recipe.train.lr).collect();
        assert_eq!(lrs, b.points.iter().map(|p| p.recipe.train.lr).collect::<Vec<_>>());
        assert!(lrs.iter().all(|lr| (1e-4..=1e-2).contains(lr)), "{lrs:?}");
        assert!(lrs.windows(2).any(|w| w[0] != w[1]), "draws differ: {lrs:?}");
        let warmups: std::collections::BTreeSet<u64> = a.points.iter().map(|p| p.recipe.train.warmup).collect();
        assert!(warmups.iter().all(|w| *w <= 3) && warmups.len() > 1, "{warmups:?}");
        let other = sweep(&text.replace("seed = 7", "seed = 8"), &[]).expect("plans");
        assert_ne!(lrs, other.points.iter().map(|p| p.recipe.train.lr).collect::<Vec<_>>());
    }

    #[test]
    fn bad_sweeps_are_refused_naming_the_key_the_count_or_the_point() {
        let cases: &[(&str, &[&str], &str)] = &[
            ("", &[], "nothing to sweep"),
            (
                "[sweep.grid]\n\"train.lrr\" = [1, 2]\n",
                &[],
                "swept key train.lrr: unknown key train.lrr (did you mean lr?)",
            ),
            ("[sweep.grid]\n\"train.seed\" = [1, 2]\n", &["train.bogus=1,2"], "swept key train.bogus"),
            (
                "[sweep]\nmax_points = 3\n[sweep.grid]\n\"train.seed\" = [1, 2]\n\"train.lr\" = [0.1, 0.2]\n",
                &[],
                "expands to 4 points, more than sweep.max_points = 3",
            ),
            (
                "[sweep.grid]\n\"train.seed\" = [1, 2]\n\"train.lr\" = [0.1, -1.0]\n",
                &[],
                "sweep point 3 of 4 (train.lr = -1.0, train.seed = 1): train.lr = -1 (swept) must be a positive number",
            ),
            ("[sweep.grid]\n\"train.seed\" = []\n", &[], "give at least one value"),
            ("[sweep.grid]\ntrain.seed = [1]\n", &[], "quote dotted keys"),
            ("[sweep]\nmax_points = 20000\n", &[], "sweep.max_points = 20000 is out of range"),
            ("[sweep]\nbogus = 1\n", &[], "unknown key sweep.bogus"),
            ("[sweep.random]\n\"train.lr\" = { min = 0.1, max = 0.2 }\n", &[], "needs sweep.draws"),
            (
                "[sweep]\ndraws = 2\n[sweep.random]\n\"train.lr\" = { min = 0.0, max = 0.2, log = true }\n",
                &[],
                "log = true needs min > 0",
            ),
            ("[sweep]\ndraws = 2\n[sweep.random]\n\"train.lr\" = { lo = 0.0 }\n", &[], "unknown field `lo`"),
        ];
        for (extra, grid, want) in cases {
            let e = sweep(extra, grid).expect_err(extra).to_string();
            assert!(e.starts_with("r.toml: ") && e.contains(want), "{extra:?} {grid:?}: {e}");
        }
        // A cap counts before expanding: a huge grid is refused without building its points.
        let huge = format!(
            "[sweep.grid]\n\"train.seed\" = [{}]\n\"train.lr\" = [{}]\n",
            vec!["1"; 200].join(","),
            vec!["0.1"; 200].join(",")
        );
        assert!(sweep(&huge, &[]).expect_err("cap").to_string().contains("expands to 40000 points"));
    }

    #[test]
    fn run_refuses_a_recipe_with_a_sweep_and_names_the_command_that_takes_it() {
        let e =
            super::super::parse_str(&format!("{BASE}[sweep.grid]\n\"train.lr\" = [0.1]\n"), "r.toml", &[]).unwrap_err();
        assert!(e.to_string().contains("flightdeck sweep r.toml"), "{e}");
    }
}
