//! The untyped stage: TOML text to a tree, checked against the schema, with `--set` applied.
//!
//! Checking keys and types here, before serde, is what lets every message name the dotted key,
//! the type it got and the type it needs; serde's own errors carry neither.
use super::error::{ErrorKind, RecipeError};
use super::raw::{key_names, table_keys, table_names, Ty, LISTS, TABLES, TOP_KEYS};
use serde::Deserialize;
use std::collections::BTreeMap;
use toml::{Table, Value};

/// Where values came from, so messages can name the file and mark values set on the command line.
pub(super) struct Ctx<'a> {
    pub origin: &'a str,
    /// Dotted key → the `--set` argument that last set it.
    pub set_by: BTreeMap<String, String>,
}

impl Ctx<'_> {
    pub fn err(&self, kind: ErrorKind, key: &str, message: String) -> RecipeError {
        RecipeError::new(self.origin, kind, Some(key), message)
    }

    /// `key = value`, marked `(from --set)` when the command line set it.
    pub fn show(&self, key: &str, value: impl std::fmt::Display) -> String {
        match self.set_by.contains_key(key) {
            true => format!("{key} = {value} (from --set)"),
            false => format!("{key} = {value}"),
        }
    }
}

/// Parses the text as a TOML document; a syntax error carries its line and column.
pub(super) fn parse_document(text: &str, origin: &str) -> Result<Table, RecipeError> {
    toml::from_str::<Table>(text).map_err(|e| {
        let what = e.message().trim_end().replace('\n', "; ");
        let (line, col) = e.span().map_or((1, 1), |span| line_col(text, span.start));
        let message = format!("TOML syntax error: {what}\n{}", snippet(text, line, col));
        RecipeError::new(origin, ErrorKind::Syntax, None, message).at(line, col)
    })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// The offending line with a caret under the column, as compilers show it.
fn snippet(text: &str, line: usize, col: usize) -> String {
    let src = text.lines().nth(line - 1).unwrap_or("");
    let gutter = line.to_string().len();
    format!("{:gutter$} |\n{line} | {src}\n{:gutter$} | {}^", "", "", " ".repeat(col - 1))
}

/// Checks every key against the schema and every value's type; widens integers given for floats.
pub(super) fn check_schema(doc: &mut Table, ctx: &Ctx) -> Result<(), RecipeError> {
    for (key, value) in doc.iter_mut() {
        if let Some((_, ty)) = TOP_KEYS.iter().find(|(k, _)| k == key) {
            check_file_value(ctx, key, value, *ty)?;
            continue;
        }
        let Some(keys) = table_keys(key) else {
            return Err(ctx.err(ErrorKind::UnknownKey, key, unknown_top(key)));
        };
        let listed = LISTS.contains(&key.as_str());
        let tables: Vec<(String, &mut Table)> = match value {
            Value::Table(table) => vec![(key.clone(), table)],
            Value::Array(items) if listed && items.iter().all(Value::is_table) => items
                .iter_mut()
                .enumerate()
                .filter_map(|(i, v)| v.as_table_mut().map(|t| (format!("{key}[{i}]"), t)))
                .collect(),
            other => {
                let also = if listed { format!(" (or a list of them, [[{key}]])") } else { String::new() };
                let message = format!(
                    "{key} = {} has the wrong type: expected a table [{key}] with keys {}{also}, got {}",
                    brief(other),
                    key_names(keys),
                    a_type(other)
                );
                return Err(ctx.err(ErrorKind::WrongType, key, message));
            }
        };
        for (name, table) in tables {
            for (sub, v) in table.iter_mut() {
                let dotted = format!("{name}.{sub}");
                match keys.iter().find(|(k, _)| k == sub) {
                    Some((_, ty)) => check_file_value(ctx, &dotted, v, *ty)?,
                    None => {
                        let message = unknown_in(key, sub).replacen(&format!("{key}.{sub}"), &dotted, 1);
                        return Err(ctx.err(ErrorKind::UnknownKey, &dotted, message));
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_file_value(ctx: &Ctx, key: &str, value: &mut Value, ty: Ty) -> Result<(), RecipeError> {
    match type_problem(value, ty) {
        None => Ok(()),
        Some(p) => {
            let message =
                format!("{key}{} = {} has the wrong type: expected {}, got {}", p.at, p.shown, p.expected, p.got);
            Err(ctx.err(ErrorKind::WrongType, key, message))
        }
    }
}

struct TypeProblem {
    /// `[i]` when an element of a list is wrong.
    at: String,
    shown: String,
    expected: &'static str,
    got: &'static str,
}

fn type_problem(value: &mut Value, ty: Ty) -> Option<TypeProblem> {
    let problem = |at: String, v: &Value, expected| TypeProblem { at, shown: brief(v), expected, got: a_type(v) };
    match (ty, &*value) {
        (Ty::Str, Value::String(_)) | (Ty::Int, Value::Integer(_)) => None,
        (Ty::Float, Value::Float(_)) | (Ty::Bool, Value::Boolean(_)) => None,
        (Ty::Float, Value::Integer(i)) => {
            *value = Value::Float(*i as f64);
            None
        }
        (Ty::StrList, Value::Array(items)) => {
            items.iter().enumerate().find(|(_, v)| !v.is_str()).map(|(i, v)| problem(format!("[{i}]"), v, "a string"))
        }
        (Ty::Int, Value::Float(f)) if f.fract() == 0.0 && f.is_finite() => Some(TypeProblem {
            expected: "an integer (write it without a decimal point or exponent)",
            ..problem(String::new(), value, "")
        }),
        _ => Some(problem(String::new(), value, ty.expected())),
    }
}

/// `a string`, `an integer`, ...: how messages name the type a value has.
fn a_type(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

/// The value as TOML, shortened so a pasted blob does not flood the message.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

fn unknown_top(key: &str) -> String {
    let hint = match TABLES.iter().find(|(_, keys)| keys.iter().any(|(k, _)| *k == key)) {
        Some((table, _)) => format!(" (did you mean {table}.{key}?)"),
        None => {
            let names = TOP_KEYS.iter().map(|(k, _)| *k).chain(TABLES.iter().map(|(t, _)| *t));
            did_you_mean(key, names)
        }
    };
    format!("unknown key {key}{hint}; valid top-level keys: {}; valid tables: {}", key_names(TOP_KEYS), table_names())
}

fn unknown_in(table: &str, key: &str) -> String {
    let keys = table_keys(table).unwrap_or(&[]);
    let mut hint = did_you_mean(key, keys.iter().map(|(k, _)| *k));
    if hint.is_empty() && TOP_KEYS.iter().any(|(k, _)| *k == key) {
        hint = format!(" ({key} is a top-level key: move it above the first [table])");
    }
    format!("unknown key {table}.{key}{hint}; valid keys in [{table}]: {}", key_names(keys))
}

/// ` (did you mean X?)` for the closest name within two edits, else empty (recipe keys, keymap
/// actions).
pub fn did_you_mean<'a>(key: &str, names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| (edit_distance(key, n), n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| format!(" (did you mean {n}?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Applies `--set KEY=VALUE` arguments in order (the last one for a key wins). VALUE is a TOML
/// value; a bare word that is not one (`cluster.device=cuda`) is taken as a string, and so is
/// any value given for a string key (`name=2024`).
pub(super) fn apply_overrides(doc: &mut Table, overrides: &[String], ctx: &mut Ctx) -> Result<(), RecipeError> {
    for arg in overrides {
        let bad = |message: String| {
            RecipeError::new(ctx.origin, ErrorKind::BadOverride, None, format!("--set {arg}: {message}"))
        };
        let Some((key, text)) = arg.split_once('=') else {
            return Err(bad("expected KEY=VALUE, e.g. --set train.steps=60".to_string()));
        };
        let (key, text) = (key.trim(), text.trim());
        let (table, name, ty) = resolve_key(key).map_err(&bad)?;
        if text.is_empty() {
            return Err(bad(format!("no value after '='; e.g. --set {key}={}", ty.example())));
        }
        let mut value = match Value::deserialize(toml::de::ValueDeserializer::new(text)) {
            Ok(Value::String(s)) => Value::String(s),
            Ok(_) if ty == Ty::Str => Value::String(text.to_string()),
            Ok(v) => v,
            Err(e) if text.starts_with(['"', '\'', '[', '{']) => {
                let what = e.message().trim_end().replace('\n', "; ");
                return Err(bad(format!(
                    "cannot parse {text} as a TOML value ({what}); e.g. --set {key}={}",
                    ty.example()
                )));
            }
            Err(_) => Value::String(text.to_string()),
        };
        if let Some(p) = type_problem(&mut value, ty) {
            let message = format!(
                "--set {arg}: {key}{} must be {}, got {} {}; e.g. --set {key}={}",
                p.at,
                p.expected,
                p.got,
                p.shown,
                ty.example()
            );
            return Err(RecipeError::new(ctx.origin, ErrorKind::WrongType, Some(key), message));
        }
        if let Some(t) = table.filter(|t| doc.get(*t).is_some_and(Value::is_array)) {
            return Err(bad(format!(
                "{t} is a list in the file ([[{t}]]): --set cannot pick one of them; edit the recipe instead"
            )));
        }
        let slot = match table {
            None => Some(&mut *doc),
            Some(t) => doc.entry(t).or_insert_with(|| Value::Table(Table::new())).as_table_mut(),
        };
        match slot {
            Some(slot) => slot.insert(name.to_string(), value),
            None => return Err(bad(format!("[{}] in the file is not a table", table.unwrap_or("")))),
        };
        ctx.set_by.insert(key.to_string(), arg.clone());
    }
    Ok(())
}

/// Splits a dotted `--set` key into its table and key, if the schema has it.
pub(super) fn resolve_key(key: &str) -> Result<(Option<&'static str>, &'static str, Ty), String> {
    let parts: Vec<&str> = key.split('.').map(str::trim).collect();
    match parts.as_slice() {
        [name] => {
            if let Some((k, ty)) = TOP_KEYS.iter().find(|(k, _)| k == name) {
                return Ok((None, k, *ty));
            }
            if let Some(keys) = table_keys(name) {
                let first = keys.first().map_or("", |(k, _)| *k);
                return Err(format!(
                    "{name} is a table; set one of its keys ({}), e.g. --set {name}.{first}=...",
                    key_names(keys)
                ));
            }
            Err(unknown_top(name))
        }
        [table, name] => {
            let Some((t, keys)) = TABLES.iter().find(|(t, _)| t == table) else {
                let hint = did_you_mean(table, TABLES.iter().map(|(t, _)| *t));
                return Err(format!("unknown key {key}: no table [{table}]{hint}; valid tables: {}", table_names()));
            };
            match keys.iter().find(|(k, _)| k == name) {
                Some((k, ty)) => Ok((Some(*t), *k, *ty)),
                None => Err(unknown_in(table, name)),
            }
        }
        _ => Err(format!(
            "unknown key {key}; keys are NAME or TABLE.NAME (top-level: {}; tables: {})",
            key_names(TOP_KEYS),
            table_names()
        )),
    }
}
