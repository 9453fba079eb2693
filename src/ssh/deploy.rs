//! Deploy: this very binary, installed on a node at a versioned path, checksum verified,
//! skipped when already there. Also the node's layout (home, remote dir, libtorch).
use super::quote::quote;
use super::session::Node;
use super::SshError;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::sync::OnceLock;

/// Where things are on one node.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// The absolute remote directory (`cluster.remote_dir` under the node's home when relative).
    pub root: String,
    /// The installed binary.
    pub exe: String,
    /// The directory of libtorch's libraries on the node, when the recipe names one.
    pub libtorch: Option<String>,
}

impl Layout {
    /// `env LD_LIBRARY_PATH=...` before the binary when libtorch is elsewhere on the node, then
    /// the binary and its quoted arguments.
    pub fn command(&self, args: &[(&str, &str)]) -> Result<String, SshError> {
        let mut line = String::new();
        if let Some(lib) = &self.libtorch {
            // One shell word: the quoted directory, then any existing path appended.
            line.push_str("env LD_LIBRARY_PATH=");
            line.push_str(&quote("cluster.libtorch", lib)?);
            line.push_str("\"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\" ");
        }
        line.push_str(&quote("the remote binary path", &self.exe)?);
        for (what, v) in args {
            line.push(' ');
            line.push_str(&quote(what, v)?);
        }
        Ok(line)
    }
}

/// What happened to the binary on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployed {
    Present,
    Uploaded { bytes: u64 },
}

/// SHA-256 (hex) of this executable, computed once.
pub fn local_sha256() -> Result<&'static str, String> {
    static HASH: OnceLock<Result<String, String>> = OnceLock::new();
    HASH.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| format!("locating this executable: {e}"))?;
        let mut f = std::fs::File::open(&exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| format!("reading {}: {e}", exe.display()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(hex(&h.finalize()))
    })
    .as_ref()
    .map(String::as_str)
    .map_err(Clone::clone)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Finds the node's home and architecture, and where libtorch is (a directory, or a Python
/// with PyTorch whose `torch/lib` is used).
pub fn probe(node: &Node, remote_dir: &str, libtorch: Option<&str>) -> Result<Layout, SshError> {
    let out = node.check("probing the node", "cd && pwd && uname -m", None)?;
    let mut lines = out.lines();
    let home = lines.next().unwrap_or("").trim().to_string();
    let arch = lines.next().unwrap_or("").trim().to_string();
    if arch != std::env::consts::ARCH {
        return Err(SshError::Command {
            host: node.host(),
            what: "checking the architecture".into(),
            detail: format!("the node is {arch:?}, this flightdeck is built for {:?}", std::env::consts::ARCH),
        });
    }
    let root = match remote_dir.strip_prefix("~/") {
        _ if remote_dir.starts_with('/') => remote_dir.trim_end_matches('/').to_string(),
        Some(rest) => format!("{home}/{}", rest.trim_end_matches('/')),
        None => format!("{home}/{}", remote_dir.trim_end_matches('/')),
    };
    let hash = local_sha256().map_err(|detail| SshError::Command {
        host: node.host(),
        what: "hashing this binary".into(),
        detail,
    })?;
    let exe = format!("{root}/bin/{}-{}/flightdeck", env!("CARGO_PKG_VERSION"), &hash[..16]);
    let libtorch = match libtorch {
        None => None,
        Some(l) => Some(libtorch_dir(node, l)?),
    };
    Ok(Layout { root, exe, libtorch })
}

fn libtorch_dir(node: &Node, given: &str) -> Result<String, SshError> {
    let l = quote("cluster.libtorch", given)?;
    let script = format!(
        "L={l}; if [ -d \"$L\" ]; then printf '%s\\n' \"$L\"; elif [ -x \"$L\" ]; then \"$L\" -c \
         'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), \"lib\"))'; \
         else echo \"cluster.libtorch: $L is neither a directory nor an executable Python on this node\" >&2; exit 4; fi"
    );
    let out = node.check("finding libtorch (cluster.libtorch)", &script, None)?;
    Ok(out.lines().last().unwrap_or("").trim().to_string())
}

/// Installs this binary at `layout.exe` unless a copy with the same checksum is there.
/// `tag` makes the upload's temporary name unique among concurrent uploads.
pub fn deploy(node: &Node, layout: &Layout, tag: &str) -> Result<Deployed, SshError> {
    let host = node.host();
    let hash =
        local_sha256().map_err(|detail| SshError::Command { host: host.clone(), what: "hashing".into(), detail })?;
    let exe = quote("the remote binary path", &layout.exe)?;
    // The marker is written only after a verified install, so reading it is the cheap check
    // (hashing ~100 MB again on every launch costs about a second per node).
    let marker = quote("the checksum marker path", &format!("{}.sha256", layout.exe))?;
    let present = node.run("checking the installed binary", &format!("test -x {exe} && cat -- {marker}"), None)?;
    if present.status == 0 && present.stdout.trim() == hash {
        return Ok(Deployed::Present);
    }
    let dir = layout.exe.rsplit_once('/').map(|(d, _)| d).unwrap_or(".");
    let tmp = format!("{dir}/.upload-{tag}");
    let (qdir, qtmp) = (quote("the remote binary directory", dir)?, quote("the upload path", &tmp)?);
    let local = std::env::current_exe().and_then(std::fs::read).map_err(|e| SshError::Command {
        host: host.clone(),
        what: "reading this binary".into(),
        detail: e.to_string(),
    })?;
    node.check("uploading the binary", &format!("mkdir -p -- {qdir} && cat > {qtmp}"), Some(&local))?;
    let sum = node.check("verifying the upload", &format!("sha256sum -- {qtmp}"), None)?;
    let got = sum.split_whitespace().next().unwrap_or("").to_string();
    if got != hash {
        let _ = node.run("removing a bad upload", &format!("rm -f -- {qtmp}"), None);
        return Err(SshError::Command {
            host,
            what: "verifying the upload".into(),
            detail: format!("checksum mismatch: sent sha256 {hash}, the node has {got:?}; nothing was installed"),
        });
    }
    // mv within one directory is atomic: a concurrent launch sees the old state or the whole file.
    let install = format!("chmod 700 -- {qtmp} && mv -f -- {qtmp} {exe} && printf '%s\\n' {hash} > {marker}");
    node.check("installing the binary", &install, None)?;
    Ok(Deployed::Uploaded { bytes: local.len() as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_quote_every_word_and_prepend_libtorch() {
        let l = Layout {
            root: "/r".into(),
            exe: "/r/bin/x y/flightdeck".into(),
            libtorch: Some("/opt/torch $(id)".into()),
        };
        let cmd = l.command(&[("arg", "agent"), ("dir", "/r/runs/a;b")]).unwrap();
        assert_eq!(
            cmd,
            "env LD_LIBRARY_PATH='/opt/torch $(id)'\"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\" '/r/bin/x y/flightdeck' agent '/r/runs/a;b'"
        );
        let plain = Layout { libtorch: None, ..l };
        assert!(plain.command(&[]).unwrap().starts_with("'/r/bin/x y/flightdeck'"));
    }

    #[test]
    fn the_local_hash_is_hex_sha256() {
        let h = local_sha256().unwrap();
        assert_eq!(h.len(), 64);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
