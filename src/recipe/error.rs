//! `RecipeError`: one message that names the file, the place and what would be valid.
/// What went wrong, for code that reacts to the class of error (tests, the CLI's exit codes)
/// without matching message text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The recipe file could not be read.
    Io,
    /// The text is not TOML.
    Syntax,
    /// A key or table the schema does not have.
    UnknownKey,
    /// A value of the wrong TOML type (a string where an integer belongs).
    WrongType,
    /// A required key is absent.
    Missing,
    /// A value of the right type outside its valid range or set, or values that disagree.
    Invalid,
    /// A `--set` argument that is not `KEY=VALUE`, names no schema key, or does not parse.
    BadOverride,
    /// Valid, but not runnable yet (`kind = "sft"`).
    Unsupported,
}

/// A recipe that cannot be loaded. `Display` is the whole user-facing message, for example
/// `recipes/x.toml: model.n_head = 5 does not divide model.d_model = 128; choose n_head from 1, 2, 4, 8, ...`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {message}", place(.line_col))]
pub struct RecipeError {
    origin: String,
    /// 1-based line and column (in characters), for syntax errors.
    line_col: Option<(usize, usize)>,
    /// The dotted key the error is about (`model.n_head`), or the `--set` key.
    key: Option<String>,
    kind: ErrorKind,
    message: String,
}

impl RecipeError {
    pub(super) fn new(origin: &str, kind: ErrorKind, key: Option<&str>, message: String) -> Self {
        RecipeError { origin: origin.to_string(), line_col: None, key: key.map(str::to_string), kind, message }
    }

    pub(super) fn at(mut self, line: usize, column: usize) -> Self {
        self.line_col = Some((line, column));
        self
    }

    /// The message without the input's name (to wrap in another message).
    pub(super) fn message(&self) -> &str {
        &self.message
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The input the error is in: the recipe's file name as given.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The dotted key the error is about, when there is one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// 1-based line and column, for syntax errors.
    pub fn line_col(&self) -> Option<(usize, usize)> {
        self.line_col
    }
}

/// `:LINE:COL` after the file name, when the error has one.
fn place(line_col: &Option<(usize, usize)>) -> String {
    match line_col {
        Some((line, col)) => format!(":{line}:{col}"),
        None => String::new(),
    }
}
