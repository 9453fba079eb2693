//! Errors of the cockpit's config files (layouts, keymap): each names the file, the place and what is valid.
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: {place}: {problem}")]
    Invalid { file: String, place: String, problem: String },
    #[error("{file}: {source}")]
    Read { file: String, source: std::io::Error },
}

impl ConfigError {
    pub fn invalid(file: &str, place: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { file: file.to_string(), place: place.into(), problem: problem.into() }
    }

    pub fn syntax(file: &str, e: toml::de::Error) -> ConfigError {
        ConfigError::Syntax { file: file.to_string(), message: e.to_string().trim_end().to_string() }
    }
}

/// The user's config dir: `$XDG_CONFIG_HOME/flightdeck`, else `~/.config/flightdeck`;
/// `FLIGHTDECK_CONFIG` overrides (tests point it at an empty dir).
pub fn config_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLIGHTDECK_CONFIG") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(p).join("flightdeck"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/flightdeck"))
}

/// Reads a file if it exists; a missing file is `None`, any other failure an error naming it.
pub fn read_optional(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read { file: path.display().to_string(), source }),
    }
}
