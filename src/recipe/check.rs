//! The validation pass's state and the helpers that word its errors: key, value, what is valid.
use super::error::{ErrorKind, RecipeError};
use super::tree::Ctx;
use std::path::Path;

pub(super) const MAX_U32: i64 = u32::MAX as i64;
pub(super) const MAX_I64: i64 = i64::MAX;

/// One validation pass: the context for messages plus what later checks need to know.
pub(super) struct Check<'a> {
    pub ctx: &'a Ctx<'a>,
    /// Where relative `file:` paths resolve.
    pub base: Option<&'a Path>,
    /// The recipe's kind as written, for "required for kind = ..." messages.
    pub kind: &'static str,
}

pub(super) type R<T> = Result<T, RecipeError>;

impl<'a> Check<'a> {
    pub(super) fn new(ctx: &'a Ctx<'a>, base: Option<&'a Path>) -> Self {
        Check { ctx, base, kind: "pretrain" }
    }

    pub(super) fn invalid(&self, key: &str, message: String) -> RecipeError {
        self.ctx.err(ErrorKind::Invalid, key, message)
    }

    pub(super) fn missing(&self, key: &str, what: &str) -> RecipeError {
        let (table, name) = key.split_once('.').unwrap_or(("", key));
        self.ctx.err(
            ErrorKind::Missing,
            key,
            format!("{key} is missing; add {name} = <{what}> under [{table}] (required for kind = \"{}\")", self.kind),
        )
    }

    /// A required integer; command runs may leave it out (it reads as 0).
    pub(super) fn required(&self, key: &str, v: Option<i64>, trains: bool, min: i64, max: i64) -> R<i64> {
        match v {
            Some(v) => self.int_in(key, v, min, max),
            None if trains => Err(self.missing(key, "a positive integer")),
            None => Ok(0),
        }
    }

    pub(super) fn int_in(&self, key: &str, v: i64, min: i64, max: i64) -> R<i64> {
        let shown = self.ctx.show(key, v);
        if v < min {
            let need = match min {
                0 => "must be 0 or more".to_string(),
                1 => "must be a positive integer (1 or more)".to_string(),
                m => format!("must be at least {m}"),
            };
            return Err(self.invalid(key, format!("{shown} {need}")));
        }
        if v > max {
            return Err(self.invalid(key, format!("{shown} is too large; at most {max}")));
        }
        Ok(v)
    }

    /// A float that is finite and satisfies `ok`; `valid` says what would be.
    pub(super) fn float(&self, key: &str, v: f64, ok: bool, valid: &str) -> R<f64> {
        match v.is_finite() && ok {
            true => Ok(v),
            false => Err(self.invalid(key, format!("{} must be {valid}", self.ctx.show(key, v)))),
        }
    }

    /// One of a closed set of names, or the default when absent.
    pub(super) fn choice<T: Copy>(&self, key: &str, v: Option<String>, default: T, options: &[(&str, T)]) -> R<T> {
        let Some(v) = v else { return Ok(default) };
        match options.iter().find(|(name, _)| *name == v) {
            Some((_, value)) => Ok(*value),
            None => {
                let valid: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
                Err(self.invalid(
                    key,
                    format!("{} is not valid; valid: {}", self.ctx.show(key, format!("{v:?}")), valid.join(", ")),
                ))
            }
        }
    }
}
