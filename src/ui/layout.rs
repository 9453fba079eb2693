//! Layouts are data (`layouts/*.toml`): nested rows and columns with ratios; leaves name panels.
use super::config::{read_optional, ConfigError};
use ratatui::layout::{Constraint, Direction, Layout as RLayout, Rect};
use std::path::Path;

/// The built-in layouts, in the order `1`–`9` selects them.
pub const BUILTIN: [(&str, &str); 5] = [
    ("layouts/default.toml", include_str!("../../layouts/default.toml")),
    ("layouts/debug.toml", include_str!("../../layouts/debug.toml")),
    ("layouts/compare.toml", include_str!("../../layouts/compare.toml")),
    ("layouts/gpu.toml", include_str!("../../layouts/gpu.toml")),
    ("layouts/rl.toml", include_str!("../../layouts/rl.toml")),
];

/// Every panel a layout may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PanelKind {
    Chart,
    Ranks,
    Heatmap,
    Collectives,
    Logs,
    Events,
    CompareChart,
    CompareTable,
    Gpu,
    Matrix,
    Stacks,
    Verdict,
    Rl,
    Phases,
    Samples,
}

impl PanelKind {
    pub const ALL: [PanelKind; 15] = [
        PanelKind::Chart,
        PanelKind::Ranks,
        PanelKind::Heatmap,
        PanelKind::Collectives,
        PanelKind::Logs,
        PanelKind::Events,
        PanelKind::CompareChart,
        PanelKind::CompareTable,
        PanelKind::Gpu,
        PanelKind::Matrix,
        PanelKind::Stacks,
        PanelKind::Verdict,
        PanelKind::Rl,
        PanelKind::Phases,
        PanelKind::Samples,
    ];
    pub fn name(self) -> &'static str {
        match self {
            PanelKind::Chart => "chart",
            PanelKind::Ranks => "ranks",
            PanelKind::Heatmap => "heatmap",
            PanelKind::Collectives => "collectives",
            PanelKind::Logs => "logs",
            PanelKind::Events => "events",
            PanelKind::CompareChart => "compare_chart",
            PanelKind::CompareTable => "compare_table",
            PanelKind::Gpu => "gpu",
            PanelKind::Matrix => "matrix",
            PanelKind::Stacks => "stacks",
            PanelKind::Verdict => "verdict",
            PanelKind::Rl => "rl",
            PanelKind::Phases => "phases",
            PanelKind::Samples => "samples",
        }
    }
    fn screen(self) -> ScreenKind {
        match self {
            PanelKind::CompareChart | PanelKind::CompareTable => ScreenKind::Compare,
            _ => ScreenKind::Run,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScreenKind {
    Run,
    Compare,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Rows,
    Columns,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Panel { ratio: u32, panel: PanelKind },
    Split { ratio: u32, split: Split, parts: Vec<Node> },
}

impl Node {
    fn ratio(&self) -> u32 {
        match self {
            Node::Panel { ratio, .. } | Node::Split { ratio, .. } => *ratio,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayoutDef {
    pub name: String,
    pub screen: ScreenKind,
    pub root: Node,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: Option<String>,
    screen: Option<String>,
    ratio: Option<toml::Value>,
    panel: Option<String>,
    split: Option<String>,
    #[serde(default)]
    part: Vec<RawNode>,
}

impl LayoutDef {
    pub fn parse(file: &str, text: &str) -> Result<LayoutDef, ConfigError> {
        let raw: RawNode = toml::from_str(text).map_err(|e| ConfigError::syntax(file, e))?;
        let name =
            raw.name.clone().ok_or_else(|| ConfigError::invalid(file, "name", "missing: give the layout a name"))?;
        let screen = match raw.screen.as_deref() {
            None | Some("run") => ScreenKind::Run,
            Some("compare") => ScreenKind::Compare,
            Some(other) => {
                return Err(ConfigError::invalid(file, "screen", format!("{other:?}: valid screens are run, compare")))
            }
        };
        let root = node(file, "root", &raw, screen)?;
        Ok(LayoutDef { name, screen, root })
    }

    /// Panels in reading order: the order `Tab` moves focus in.
    pub fn panels(&self) -> Vec<PanelKind> {
        let mut out = Vec::new();
        collect(&self.root, &mut out);
        out
    }

    /// Each panel's rectangle inside `area`.
    pub fn solve(&self, area: Rect) -> Vec<(PanelKind, Rect)> {
        let mut out = Vec::new();
        solve(&self.root, area, &mut out);
        out
    }
}

fn collect(n: &Node, out: &mut Vec<PanelKind>) {
    match n {
        Node::Panel { panel, .. } => out.push(*panel),
        Node::Split { parts, .. } => parts.iter().for_each(|p| collect(p, out)),
    }
}

fn solve(n: &Node, area: Rect, out: &mut Vec<(PanelKind, Rect)>) {
    match n {
        Node::Panel { panel, .. } => out.push((*panel, area)),
        Node::Split { split, parts, .. } => {
            let dir = match split {
                Split::Rows => Direction::Vertical,
                Split::Columns => Direction::Horizontal,
            };
            let total: u32 = parts.iter().map(Node::ratio).sum();
            let cs: Vec<Constraint> = parts.iter().map(|p| Constraint::Ratio(p.ratio(), total.max(1))).collect();
            let rects = RLayout::default().direction(dir).constraints(cs).split(area);
            for (p, r) in parts.iter().zip(rects.iter()) {
                solve(p, *r, out);
            }
        }
    }
}

fn node(file: &str, place: &str, raw: &RawNode, screen: ScreenKind) -> Result<Node, ConfigError> {
    let ratio = match &raw.ratio {
        None => 1,
        Some(toml::Value::Integer(i)) if (1..=100).contains(i) => *i as u32,
        Some(v) => {
            return Err(ConfigError::invalid(
                file,
                place,
                format!("ratio = {v}: a ratio is a whole number from 1 to 100"),
            ))
        }
    };
    if place != "root" && (raw.name.is_some() || raw.screen.is_some()) {
        return Err(ConfigError::invalid(file, place, "name and screen belong at the top of the file"));
    }
    match (&raw.panel, &raw.split) {
        (Some(p), None) => {
            if !raw.part.is_empty() {
                return Err(ConfigError::invalid(file, place, "a panel has no parts; use split for a group"));
            }
            let valid = || {
                let names: Vec<&str> =
                    PanelKind::ALL.iter().filter(|k| k.screen() == screen).map(|k| k.name()).collect();
                names.join(", ")
            };
            let panel =
                PanelKind::ALL.iter().copied().find(|k| k.name() == p && k.screen() == screen).ok_or_else(|| {
                    ConfigError::invalid(file, place, format!("unknown panel {p:?}; valid panels: {}", valid()))
                })?;
            Ok(Node::Panel { ratio, panel })
        }
        (None, Some(s)) => {
            let split = match s.as_str() {
                "rows" => Split::Rows,
                "columns" => Split::Columns,
                other => {
                    let problem = format!("split = {other:?}: valid splits are rows, columns");
                    return Err(ConfigError::invalid(file, place, problem));
                }
            };
            if raw.part.is_empty() {
                return Err(ConfigError::invalid(file, place, "a split needs at least one [[part]]"));
            }
            let parts = raw
                .part
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let here = if place == "root" { format!("part[{i}]") } else { format!("{place}.part[{i}]") };
                    node(file, &here, p, screen)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Node::Split { ratio, split, parts })
        }
        (Some(_), Some(_)) => Err(ConfigError::invalid(file, place, "either panel or split, not both")),
        (None, None) => Err(ConfigError::invalid(file, place, "needs a panel (a leaf) or a split (a group)")),
    }
}

/// The built-in layouts, then the user's `layouts/*.toml` (same name replaces, new names append).
pub fn load_all(dir: Option<&Path>) -> Result<Vec<LayoutDef>, ConfigError> {
    let mut out = Vec::new();
    for (file, text) in BUILTIN {
        out.push(LayoutDef::parse(file, text)?);
    }
    let Some(dir) = dir.map(|d| d.join("layouts")) else {
        return Ok(out);
    };
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect(),
        Err(_) => return Ok(out),
    };
    files.sort();
    for path in files {
        if let Some(text) = read_optional(&path)? {
            let def = LayoutDef::parse(&path.display().to_string(), &text)?;
            match out.iter_mut().find(|d| d.name == def.name) {
                Some(slot) => *slot = def,
                None => out.push(def),
            }
        }
    }
    Ok(out)
}
