//! Quoting for the remote shell: every value that reaches a node's shell goes through `quote`.
//!
//! An SSH exec request is a single string that the node's login shell parses, so a value with
//! `;`, `$(...)`, backticks or quotes would run as code unless quoted. POSIX single quotes make
//! everything literal except the single quote itself, which is spelled `'\''`. Newlines inside
//! single quotes are literal too. NUL cannot be carried at all (C strings end there), so it is
//! refused rather than silently cut.
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
#[error("{what} {value:?} contains a NUL byte, which no remote shell can receive; remove it")]
pub struct QuoteError {
    pub what: String,
    pub value: String,
}

/// `value` as one word of a POSIX shell command line, arriving literally.
pub fn quote(what: &str, value: &str) -> Result<String, QuoteError> {
    if value.contains('\0') {
        return Err(QuoteError { what: what.to_string(), value: value.to_string() });
    }
    // Plain words stay readable in logs and error messages.
    let plain = !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:,+@%".contains(&b));
    if plain {
        return Ok(value.to_string());
    }
    Ok(format!("'{}'", value.replace('\'', r"'\''")))
}

/// A command line from words, each quoted.
pub fn command(words: &[(&str, &str)]) -> Result<String, QuoteError> {
    let quoted: Result<Vec<String>, QuoteError> = words.iter().map(|(what, v)| quote(what, v)).collect();
    Ok(quoted?.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `printf '%s\0' WORDS` through a real `sh -c` and returns the words it received.
    fn through_sh(values: &[&str]) -> Vec<String> {
        let mut line = "printf '%s\\0'".to_string();
        for v in values {
            line.push(' ');
            line.push_str(&quote("test value", v).unwrap());
        }
        let out = Command::new("sh").arg("-c").arg(&line).output().expect("sh");
        assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_terminator('\0').map(str::to_string).collect()
    }

    #[test]
    fn hostile_values_arrive_literally_and_run_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("ran");
        let c = canary.display().to_string();
        let hostile = [
            "a b  c".to_string(),
            "it's \"quoted\"".to_string(),
            format!("x; touch {c}"),
            format!("$(touch {c})"),
            format!("`touch {c}`"),
            format!("line1\ntouch {c}\nline3"),
            format!("'; touch {c}; echo '"),
            format!("${{HOME}} $HOME ~ * ? [a] | & > {c} < /dev/null"),
            "\\' \\\" \\\\".to_string(),
            String::new(),
            "-n".to_string(),
            "ünïcødé ☃".to_string(),
        ];
        let refs: Vec<&str> = hostile.iter().map(String::as_str).collect();
        assert_eq!(through_sh(&refs), hostile, "every value arrives as exactly one literal word");
        assert!(!canary.exists(), "a quoted value ran a command");
    }

    #[test]
    fn plain_words_stay_readable_and_nul_is_refused() {
        assert_eq!(
            quote("p", "/opt/flightdeck/bin/0.1.0-abc/flightdeck").unwrap(),
            "/opt/flightdeck/bin/0.1.0-abc/flightdeck"
        );
        assert_eq!(quote("p", "a'b").unwrap(), r"'a'\''b'");
        assert_eq!(quote("p", "").unwrap(), "''");
        let err = quote("cluster.remote_dir", "a\0b").unwrap_err();
        assert!(err.to_string().contains("cluster.remote_dir") && err.to_string().contains("NUL"), "{err}");
        assert_eq!(command(&[("a", "ls"), ("b", "x y")]).unwrap(), "ls 'x y'");
    }
}
