//! A checkpoint carried to the nodes of a resumed SSH run.
//!
//! Every node of a multi-node run keeps its own copy of each checkpoint (rank 0 and the first
//! rank of every other node write one into their node's run directory). A resume asks each of
//! the parent's nodes which checkpoint it would choose (`survey`: the node's own binary runs
//! `agent checkpoint`, the same `choose` as a local resume, every file's sha256 checked), then
//! gives each node of the child a copy to read (`assign`): the parent's copy on the same
//! machine in place, else one carried from a node that holds a verified copy (`copy`: file by
//! file through this process, each file's sha256 checked in transit, the manifest written last
//! so a torn copy is never a checkpoint).
use super::config::Target;
use super::launch::RemoteAgent;
use super::quote::quote;
use super::session::{self, Node};
use super::SshError;
use crate::store::checkpoints::disk::{self, Manifest};
use crate::store::checkpoints::{Chosen, Skipped};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};

/// What one node of the parent holds: the checkpoint its `choose` picked, or why none.
#[derive(Clone, Debug)]
pub struct Holding {
    pub target: Target,
    pub limits: super::Limits,
    pub chosen: Result<Chosen, String>,
}

/// Where one node of the child reads the checkpoint from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Source {
    /// A verified copy already on that machine.
    InPlace { path: String },
    /// A verified copy on another node, carried over before the node's agent starts.
    Copy { from: Box<Target>, limits: super::Limits, dir: String },
}

/// Every node's source of one checkpoint, in the child's host order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Carry {
    pub step: u64,
    pub manifest: Manifest,
    pub sources: Vec<Source>,
    /// Newer checkpoints passed over on some node, and why (the node named in the reason).
    pub skipped: Vec<Skipped>,
}

impl Carry {
    /// The first node's copy, as the run's lineage names it (`host:path`).
    pub fn describe(&self, hosts: &[Target]) -> String {
        match (self.sources.first(), hosts.first()) {
            (Some(Source::InPlace { path }), Some(t)) => format!("{}:{path}", t.spec),
            (Some(Source::Copy { from, dir, .. }), _) => format!("{}:{dir}", from.spec),
            _ => String::new(),
        }
    }
}

impl Carry {
    /// Where each node's copy came from, for the child's events: `checkpoint step 12: node0
    /// read its own copy; node2 got node1's, carried and sha256-verified`.
    pub fn said(&self, hosts: &[String]) -> String {
        let each: Vec<String> = self
            .sources
            .iter()
            .zip(hosts)
            .map(|(source, host)| match source {
                Source::InPlace { .. } => format!("{host} read its own copy"),
                Source::Copy { from, .. } => format!("{host} got {}'s, carried and sha256-verified", from.spec),
            })
            .collect();
        format!("checkpoint step {}: {}", self.step, each.join("; "))
    }
}

/// Asks every node of the parent (in parallel) which checkpoint under its `checkpoint_dir`
/// it would resume from: the one at `step`, else its newest verified one.
pub fn survey(parent: &[RemoteAgent], checkpoint_dir: &str, step: Option<u64>) -> Vec<Holding> {
    super::fanout::each(parent.len(), |i| {
        let a = &parent[i];
        let root = crate::store::checkpoints::root_of(std::path::Path::new(&a.run_dir), checkpoint_dir);
        let chosen = ask(a, &root.display().to_string(), step);
        Holding { target: a.target.clone(), limits: a.limits.clone(), chosen }
    })
}

fn ask(a: &RemoteAgent, root: &str, step: Option<u64>) -> Result<Chosen, String> {
    let node = session::connect(&a.target, &a.limits).map_err(|e| e.to_string())?;
    let step_text = step.map(|s| s.to_string());
    let mut args = vec![("", "agent"), ("", "checkpoint"), ("", "--root"), ("the checkpoint directory", root)];
    if let Some(s) = &step_text {
        args.extend([("", "--step"), ("the step", s.as_str())]);
    }
    let cmd = a.layout.command(&args).map_err(|e| e.to_string())?;
    let out = node.check("choosing a checkpoint", &cmd, None).map_err(|e| e.to_string())?;
    let line = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    let answer: Result<Chosen, String> = serde_json::from_str(line).map_err(|e| {
        format!("{}: `agent checkpoint` answered {line:?}, not a choice ({e}); is its flightdeck older?", node.host())
    })?;
    answer.map_err(|why| format!("{}: {why}", node.host()))
}

/// Which copy each of the child's `hosts` reads: the step is `step`, else the newest any node
/// verified; a machine that holds a verified copy reads it in place, any other gets one carried
/// from the parent's node of its own index when that one holds it, else from the first that
/// does. Err when no node holds the step, naming each node's reason.
pub fn assign(hosts: &[Target], holdings: &[Holding], step: Option<u64>) -> Result<Carry, String> {
    let verified: Vec<(&Holding, &Chosen)> =
        holdings.iter().filter_map(|h| h.chosen.as_ref().ok().map(|c| (h, c))).collect();
    let Some(best) = step.or_else(|| verified.iter().map(|(_, c)| c.step).max()) else {
        let why: Vec<String> = holdings.iter().filter_map(|h| h.chosen.as_ref().err().cloned()).collect();
        return Err(format!("no node holds a checkpoint that verifies: {}", why.join("; ")));
    };
    let holders: Vec<(usize, &Holding, &Chosen)> = holdings
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.chosen.as_ref().ok().filter(|c| c.step == best).map(|c| (i, h, c)))
        .collect();
    let Some(&(_, _, first)) = holders.first() else {
        let why: Vec<String> = holdings
            .iter()
            .map(|h| match &h.chosen {
                Ok(c) => format!("{}: its newest verified checkpoint is step {}", h.target.spec, c.step),
                Err(e) => e.clone(),
            })
            .collect();
        return Err(format!("no node holds a verified checkpoint at step {best}: {}", why.join("; ")));
    };
    let same_machine = |a: &Target, b: &Target| a.hostname == b.hostname && a.port == b.port && a.user == b.user;
    let sources = hosts
        .iter()
        .enumerate()
        .map(|(k, host)| match holders.iter().find(|(_, h, _)| same_machine(&h.target, host)) {
            Some((_, _, c)) => Source::InPlace { path: c.path.display().to_string() },
            None => {
                let (_, h, c) = holders.iter().find(|(i, _, _)| *i == k).unwrap_or(&holders[0]);
                let from = Box::new(h.target.clone());
                Source::Copy { from, limits: h.limits.clone(), dir: c.path.display().to_string() }
            }
        })
        .collect();
    let mut skipped = Vec::new();
    for h in holdings {
        if let Ok(c) = &h.chosen {
            skipped.extend(
                c.skipped
                    .iter()
                    .map(|s| Skipped { step: s.step, reason: format!("on {}: {}", h.target.spec, s.reason) }),
            );
        }
    }
    Ok(Carry { step: best, manifest: first.manifest.clone(), sources, skipped })
}

/// Carries checkpoint `dir` from the node `from` to `dest` on `to`: the source's own manifest
/// (which must list the files of `expected`, the checkpoint the resume chose), then each file,
/// checked against its sha256 as it passes, then that manifest, byte for byte, last. Returns the
/// bytes carried. A copy that fails leaves no manifest (so no checkpoint) behind.
pub fn copy(from: &Node, dir: &str, to: &Node, dest: &str, expected: &Manifest) -> Result<u64, SshError> {
    let what = "reading the checkpoint's manifest";
    let manifest_path = format!("{dir}/{}", disk::MANIFEST);
    let text = from.check(what, &format!("cat -- {}", quote("the checkpoint file", &manifest_path)?), None)?;
    let bad = |detail: String| SshError::Command { host: from.host(), what: what.into(), detail };
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| bad(format!("{manifest_path}: {e}")))?;
    if manifest.step != expected.step || manifest.files != expected.files {
        return Err(bad(format!(
            "{manifest_path} lists other files than the checkpoint chosen for step {}: it changed after it was verified",
            expected.step
        )));
    }
    let qdest = quote("the checkpoint's copy", dest)?;
    to.check("preparing the checkpoint's copy", &format!("rm -rf -- {qdest} && mkdir -p -- {qdest}"), None)?;
    let mut total = 0;
    for f in &manifest.files {
        total += copy_file(from, &format!("{dir}/{}", f.name), to, &format!("{dest}/{}", f.name), f)?;
    }
    let qmanifest = quote("the checkpoint's copy", &format!("{dest}/{}", disk::MANIFEST))?;
    to.check("writing the checkpoint's manifest", &format!("cat > {qmanifest}"), Some(text.as_bytes()))?;
    Ok(total)
}

fn copy_file(from: &Node, src: &str, to: &Node, dest: &str, want: &disk::FileEntry) -> Result<u64, SshError> {
    let what = format!("carrying {}", want.name);
    let mut reader = from.exec(&what, &format!("cat -- {}", quote("the checkpoint file", src)?))?;
    let mut writer = to.exec(&what, &format!("cat > {}", quote("the checkpoint's copy", dest)?))?;
    let (src_host, dest_host, t) = (from.host(), to.host(), from.limits.command);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = reader.read(&mut buf).map_err(|e| SshError::io(&src_host, &what, e, t))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        writer.write_all(&buf[..n]).map_err(|e| SshError::io(&dest_host, &what, e, t))?;
        bytes += n as u64;
    }
    session::finish(reader, &src_host, &what, t)?;
    writer.send_eof().map_err(|e| SshError::ssh(&dest_host, &what, e, t))?;
    session::finish(writer, &dest_host, &what, t)?;
    let sha256: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if bytes != want.bytes || sha256 != want.sha256 {
        return Err(SshError::Command {
            host: src_host,
            what,
            detail: format!(
                "{src} read as {bytes} bytes with sha256 {}…, the manifest says {} bytes with {}…: the copy there \
                 changed after it was verified",
                &sha256[..12],
                want.bytes,
                want.sha256.get(..12).unwrap_or(&want.sha256)
            ),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
#[path = "carry_tests.rs"]
mod tests;
