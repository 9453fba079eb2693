//! Host specs (`[user@]host[:port]`) resolved through an OpenSSH client config file.
//!
//! Supported keywords, with OpenSSH's rules (first value obtained wins; `IdentityFile` and
//! `UserKnownHostsFile` accumulate; `Host` patterns with `*`, `?` and `!`): HostName, User, Port,
//! IdentityFile, UserKnownHostsFile, StrictHostKeyChecking. Other keywords are ignored, and so
//! are `Match` blocks (their lines never apply). The file is `$FLIGHTDECK_SSH_CONFIG` (like
//! `ssh -F`), else `~/.ssh/config` when it exists.
pub use crate::protocol::spec::ClientEnv;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The environment variable naming the config file to use instead of `~/.ssh/config`.
pub const CONFIG_ENV: &str = ClientEnv::CONFIG_ENV;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error(
        "host {spec:?}: {problem}; hosts are SSH destinations like \"node-a\", \"user@node-b:2222\" or \"[::1]:22\""
    )]
    BadSpec { spec: String, problem: String },
    #[error("reading the SSH config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {problem}")]
    BadLine { path: PathBuf, line: usize, problem: String },
}

/// One node as a launcher connects to it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// As written in `cluster.hosts` (the run's records show this).
    pub spec: String,
    /// The host part as written: what `Host` patterns match.
    pub alias: String,
    /// What to connect to (the config's HostName, else the alias).
    pub hostname: String,
    pub user: String,
    pub port: u16,
    /// Tried in order after the ssh-agent.
    pub identity_files: Vec<PathBuf>,
    /// Checked in order; the first is where accepted new keys are written.
    pub known_hosts: Vec<PathBuf>,
    /// `StrictHostKeyChecking accept-new` (or `no`) for this host in the config.
    pub accept_new: bool,
    /// The ssh-agent to try first: the asking client's.
    #[serde(default)]
    pub agent_socket: Option<PathBuf>,
}

impl Target {
    /// `user@host:port` as connected, for messages.
    pub fn display(&self) -> String {
        let host = if self.hostname.contains(':') { format!("[{}]", self.hostname) } else { self.hostname.clone() };
        if self.alias == self.hostname {
            format!("{}@{host}:{}", self.user, self.port)
        } else {
            format!("{} ({}@{host}:{})", self.alias, self.user, self.port)
        }
    }
}

/// `[user@]host[:port]` split into its parts; the recipe validated the same grammar.
pub fn parse_spec(spec: &str) -> Result<(Option<String>, String, Option<u16>), ConfigError> {
    let bad = |problem: &str| ConfigError::BadSpec { spec: spec.to_string(), problem: problem.to_string() };
    if spec.is_empty() || spec.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("is empty or contains whitespace or a control character"));
    }
    let (user, target) = match spec.split_once('@') {
        Some(("", _)) => return Err(bad("has no user name before '@'")),
        Some((u, t)) => (Some(u.to_string()), t),
        None => (None, spec),
    };
    let (host, port) = match target.strip_prefix('[') {
        Some(b) => match b.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, rest)) => (addr, Some(rest.strip_prefix(':').ok_or_else(|| bad("has text after ']'"))?)),
            None => return Err(bad("opens '[' without a closing ']'")),
        },
        None => match target.split_once(':') {
            Some((h, p)) if !p.contains(':') => (h, Some(p)),
            _ => (target, None),
        },
    };
    if host.is_empty() {
        return Err(bad("has no host name"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(bad("has a port that is not a number from 1 to 65535")),
        },
    };
    Ok((user, host.to_string(), port))
}

/// The config file in force for `ctx`: the one it names, else its `~/.ssh/config` if present.
pub fn config_path(ctx: &ClientEnv) -> Option<PathBuf> {
    if let Some(p) = &ctx.config {
        return Some(p.clone());
    }
    let p = ctx.home_dir().join(".ssh/config");
    p.is_file().then_some(p)
}

/// This process's user name, the default remote user.
pub fn local_user() -> String {
    if let Some(u) = std::env::var_os("USER").filter(|u| !u.is_empty()) {
        return u.to_string_lossy().into_owned();
    }
    // SAFETY: getpwuid returns a pointer into static storage or null; read once, right away.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            return std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned();
        }
    }
    "root".to_string()
}

/// Resolves a host spec through `explicit` (a recipe's cluster.ssh_config), else the config
/// file in force for `ctx` (the asking client's SSH environment).
pub fn resolve(spec: &str, explicit: Option<&Path>, ctx: &ClientEnv) -> Result<Target, ConfigError> {
    let text = match explicit.map(Path::to_path_buf).or_else(|| config_path(ctx)) {
        Some(path) => Some((
            std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?,
            path,
        )),
        None => None,
    };
    resolve_with(spec, text.as_ref().map(|(t, p)| (t.as_str(), p.as_path())), ctx)
}

#[derive(Default)]
struct Found {
    hostname: Option<String>,
    user: Option<String>,
    port: Option<u16>,
    identity_files: Vec<String>,
    known_hosts: Vec<String>,
    strict: Option<String>,
}

/// Resolves `spec` against config text (`None`: no config file), in `ctx`'s home.
pub fn resolve_with(spec: &str, config: Option<(&str, &Path)>, ctx: &ClientEnv) -> Result<Target, ConfigError> {
    let home = ctx.home_dir();
    let (user, alias, port) = parse_spec(spec)?;
    let mut found = Found::default();
    if let Some((text, path)) = config {
        apply_config(text, path, &alias, &mut found)?;
    }
    let hostname = found.hostname.map(|h| h.replace("%h", &alias)).unwrap_or_else(|| alias.clone());
    let user = user.or(found.user).unwrap_or_else(local_user);
    let expand = |p: &str| PathBuf::from(expand_tokens(p, &home, &hostname, &user));
    let mut identity_files: Vec<PathBuf> = found.identity_files.iter().map(|p| expand(p)).collect();
    if identity_files.is_empty() {
        identity_files = ["id_ed25519", "id_ecdsa", "id_rsa"].iter().map(|n| home.join(".ssh").join(n)).collect();
    }
    let mut known_hosts: Vec<PathBuf> = found.known_hosts.iter().map(|p| expand(p)).collect();
    if known_hosts.is_empty() {
        known_hosts.push(home.join(".ssh/known_hosts"));
    }
    let accept_new = matches!(found.strict.as_deref(), Some("accept-new" | "no" | "off"));
    Ok(Target {
        spec: spec.to_string(),
        alias,
        hostname,
        user,
        port: port.or(found.port).unwrap_or(22),
        identity_files,
        known_hosts,
        accept_new,
        agent_socket: ctx.agent_socket.clone(),
    })
}

fn apply_config(text: &str, path: &Path, alias: &str, found: &mut Found) -> Result<(), ConfigError> {
    // Lines before the first Host apply to every host.
    let mut active = true;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = split_keyword(line).ok_or_else(|| ConfigError::BadLine {
            path: path.to_path_buf(),
            line: i + 1,
            problem: format!("{line:?} has a keyword but no value"),
        })?;
        let key = key.to_ascii_lowercase();
        match key.as_str() {
            "host" => active = host_matches(&value, alias),
            "match" => active = false,
            _ if !active => {}
            "hostname" => set_once(&mut found.hostname, value),
            "user" => set_once(&mut found.user, value),
            "port" => {
                let port = value.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| ConfigError::BadLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    problem: format!("Port {value:?} is not a number from 1 to 65535"),
                })?;
                found.port.get_or_insert(port);
            }
            "identityfile" => found.identity_files.push(value),
            "userknownhostsfile" => found.known_hosts.extend(value.split_whitespace().map(str::to_string)),
            "stricthostkeychecking" => set_once(&mut found.strict, value.to_ascii_lowercase()),
            _ => {}
        }
    }
    Ok(())
}

fn set_once(slot: &mut Option<String>, value: String) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

/// `Keyword value`, `Keyword=value` or `Keyword = "quoted value"`.
fn split_keyword(line: &str) -> Option<(&str, String)> {
    let end = line.find(|c: char| c.is_whitespace() || c == '=')?;
    let (key, rest) = line.split_at(end);
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('=').unwrap_or(rest).trim();
    let value = rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(rest);
    (!value.is_empty()).then(|| (key, value.to_string()))
}

/// A `Host` line: any pattern matches and no negated pattern matches.
fn host_matches(patterns: &str, alias: &str) -> bool {
    let mut any = false;
    for p in patterns.split_whitespace() {
        match p.strip_prefix('!') {
            Some(neg) if glob(neg, alias) => return false,
            Some(_) => {}
            None => any |= glob(p, alias),
        }
    }
    any
}

/// OpenSSH's pattern: `*` any run of characters, `?` one character.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// `~`, `%d` (local home), `%h` (remote host), `%r` (remote user), `%u` (local user), `%%`.
fn expand_tokens(path: &str, home: &Path, host: &str, user: &str) -> String {
    let home = home.display().to_string();
    let path = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{home}{rest}"),
        _ => path.to_string(),
    };
    path.replace("%%", "\u{0}")
        .replace("%d", &home)
        .replace("%h", host)
        .replace("%r", user)
        .replace("%u", &local_user())
        .replace('\u{0}', "%")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
