//! `flightdeck resume RUN`: a child run from a verified checkpoint of RUN, followed like `run`.
mod recipe_toml;

use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request};

#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The run to resume: full id, unique prefix, or name.
    pub run: String,
    /// The checkpoint's step (default: the newest one that verifies).
    #[arg(long)]
    pub step: Option<u64>,
    /// Override a key of the run's recipe: `--set train.steps=120` (repeatable). The model and
    /// the world size must stay as they were.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Comma-separated hosts for the child (overrides cluster.hosts; as many as the parent
    /// had): a node that is not one of the parent's gets the checkpoint copied from one that is.
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    /// A name for the child run (default: the parent's).
    #[arg(long)]
    pub name: Option<String>,
    /// Print progress lines instead of opening the cockpit; exit with the run's outcome.
    #[arg(long)]
    pub headless: bool,
}

pub async fn resume(db: &DbPaths, mut args: ResumeArgs) -> anyhow::Result<i32> {
    if !args.hosts.is_empty() {
        let quoted: Vec<String> = args.hosts.iter().map(|h| format!("{h:?}")).collect();
        args.overrides.push(format!("cluster.hosts=[{}]", quoted.join(",")));
    }
    let mut client = Client::connect(db).await?;
    let recipe_json = if args.overrides.is_empty() {
        None
    } else {
        match overridden(&mut client, &args.run, &args.overrides).await? {
            Ok(json) => Some(json),
            Err(message) => {
                eprintln!("flightdeck: {message}");
                return Ok(EXIT_BAD_INPUT);
            }
        }
    };
    let env = crate::protocol::spec::ClientEnv::from_env();
    let req = Request::Resume { run: args.run.clone(), step: args.step, recipe_json, name: args.name.clone(), env };
    client.send(&req).await?;
    // An SSH resume reports each host's progress (and each checkpoint copy) before the run id.
    let (run, parent, step, path, skipped) = loop {
        match client.next().await? {
            Some(Reply::LaunchProgress { host, text }) => println!("launch {host}: {text}"),
            Some(Reply::Resumed { run, parent, step, path, skipped }) => break (run, parent, step, path, skipped),
            Some(Reply::Error { message }) => {
                eprintln!("flightdeck: resume refused: {message}");
                return Ok(EXIT_BAD_INPUT);
            }
            Some(other) => anyhow::bail!("unexpected reply to resume: {other:?}"),
            None => anyhow::bail!("the server closed the connection during the resume"),
        }
    };
    for s in &skipped {
        println!("skipped checkpoint step {} of run {parent}: {}", s.step, s.reason);
    }
    println!("run {run}: resumed run {parent} from checkpoint step {step} ({path})");
    use std::io::IsTerminal;
    let cockpit = !args.headless && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if cockpit {
        return crate::ui::run(db, crate::ui::Start::Open(run.0.clone())).await;
    }
    if !args.headless {
        eprintln!("flightdeck: not a terminal: following the run headless");
    }
    super::run::follow(db, client, &run).await
}

/// The parent's recipe with `overrides`, validated like a recipe file (Err: the message).
async fn overridden(client: &mut Client, run: &str, overrides: &[String]) -> anyhow::Result<Result<String, String>> {
    let detail = match client.request(&Request::ShowRun { run: run.into() }).await? {
        Reply::Run { detail } => detail,
        Reply::Error { message } => return Ok(Err(message)),
        other => anyhow::bail!("unexpected reply: {other:?}"),
    };
    let parent: crate::recipe::Recipe = serde_json::from_str(&detail.run.recipe_json)
        .map_err(|e| anyhow::anyhow!("run {}: its stored recipe cannot be read: {e}", detail.run.id))?;
    if let Some(why) = parent.kind.not_resumable() {
        return Ok(Err(format!("run {}: {why}", detail.run.id)));
    }
    let text = recipe_toml::to_toml(&parent).map_err(|e| anyhow::anyhow!("run {}: {e}", detail.run.id))?;
    let origin = format!("run {}'s recipe", detail.run.id);
    Ok(match crate::recipe::parse_str(&text, &origin, overrides) {
        Ok(recipe) => Ok(serde_json::to_string(&recipe)?),
        Err(e) => Err(e.to_string()),
    })
}
