//! A validated recipe written back as recipe TOML, so `resume --set k=v` goes through the same
//! parser, overrides and validation (and the same messages) as `run`.
use crate::recipe::{DataSource, Recipe};
use serde_json::Value as Json;

/// The recipe as TOML that `recipe::parse_str` reads back into an equal `Recipe`.
pub fn to_toml(recipe: &Recipe) -> Result<String, String> {
    let mut doc = serde_json::to_value(recipe).map_err(|e| e.to_string())?;
    let Some(obj) = doc.as_object_mut() else {
        return Err("a recipe is not a JSON object".into());
    };
    // The typed source is an enum; the file spells it "synthetic:<name>" or "file:<path>".
    let source = match &recipe.data.source {
        DataSource::Synthetic { generator } => format!("synthetic:{generator}"),
        DataSource::File { path } => format!("file:{}", path.display()),
    };
    if let Some(data) = obj.get_mut("data").and_then(Json::as_object_mut) {
        data.insert("source".into(), Json::String(source));
    }
    // A kind's own table is written only for that kind (the parser refuses it elsewhere).
    use crate::recipe::Kind;
    for (table, kind) in [("dpo", Kind::Dpo), ("grpo", Kind::Grpo)] {
        if recipe.kind != kind {
            obj.remove(table);
        }
    }
    // `[init] from` is one string in the file.
    if let Some(init) = &recipe.init {
        obj.insert("init".into(), serde_json::json!({ "from": init.from.text() }));
    }
    // The typed `cluster.ssh` group is spelled as flat keys of `[cluster]` in the file.
    if let Some(cluster) = obj.get_mut("cluster").and_then(Json::as_object_mut) {
        if let Some(Json::Object(ssh)) = cluster.remove("ssh") {
            cluster.extend(ssh);
        }
        // So is `cluster.slurm`, only under `launcher = "slurm"` (the parser refuses its keys
        // elsewhere), without the limit's parsed seconds, and then without hosts.
        match cluster.remove("slurm") {
            Some(Json::Object(mut slurm)) if recipe.is_slurm() => {
                slurm.remove("time_limit_s");
                cluster.extend(slurm);
                cluster.remove("hosts");
            }
            _ => {
                cluster.remove("launcher");
            }
        }
    }
    let table = to_toml_value(doc)?.ok_or("the recipe is empty")?;
    toml::to_string(&table).map_err(|e| e.to_string())
}

/// JSON → TOML: `null` (an absent option) is left out; integers stay integers.
fn to_toml_value(v: Json) -> Result<Option<toml::Value>, String> {
    Ok(Some(match v {
        Json::Null => return Ok(None),
        Json::Bool(b) => toml::Value::Boolean(b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if !n.is_f64() => toml::Value::Integer(i),
            (_, Some(f)) if n.is_f64() => toml::Value::Float(f),
            _ => return Err(format!("{n} does not fit a TOML integer")),
        },
        Json::String(s) => toml::Value::String(s),
        Json::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.extend(to_toml_value(item)?);
            }
            toml::Value::Array(out)
        }
        Json::Object(map) => {
            let mut table = toml::map::Map::new();
            for (k, v) in map {
                if let Some(v) = to_toml_value(v)? {
                    table.insert(k, v);
                }
            }
            toml::Value::Table(table)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slurm_recipe_round_trips_through_toml() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/tiny-gpt.toml");
        let sets =
            ["cluster.launcher=\"slurm\"", "cluster.nodes=2", "cluster.time_limit=\"1:00:00\"", "cluster.grace_s=120"];
        let recipe = crate::recipe::load_file(&path, &sets.map(String::from)).unwrap();
        let text = to_toml(&recipe).unwrap();
        let back = crate::recipe::parse_str(&text, "round trip", &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, recipe);
        assert_eq!(back.cluster.slurm.time_limit_s, Some(3600));
    }

    #[test]
    fn every_shipped_recipe_round_trips_through_toml() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let recipe = crate::recipe::load_file(&path, &[]).unwrap();
            if recipe.kind == crate::recipe::Kind::Command {
                continue; // no checkpoints, so never resumed
            }
            let text = to_toml(&recipe).unwrap();
            let back = crate::recipe::parse_str(&text, "round trip", &[])
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
            assert_eq!(back, recipe, "{}", path.display());
            seen += 1;
        }
        assert!(seen >= 2, "found {seen} recipes in {}", dir.display());
    }

    #[test]
    fn overrides_apply_and_bad_ones_name_the_key() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/tiny-gpt.toml");
        let recipe = crate::recipe::load_file(&path, &[]).unwrap();
        let text = to_toml(&recipe).unwrap();
        let longer = crate::recipe::parse_str(&text, "run X's recipe", &["train.steps=999".into()]).unwrap();
        assert_eq!(longer.train.steps, 999);
        assert_eq!(longer.model, recipe.model);
        let err = crate::recipe::parse_str(&text, "run X's recipe", &["train.stepz=1".into()]).unwrap_err();
        assert!(err.to_string().contains("train.stepz"), "{err}");
    }
}
