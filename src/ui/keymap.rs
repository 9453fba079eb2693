//! The keymap: keys → named actions. Defaults embedded from `assets/keymap.toml`; a user file in
//! the config dir overrides them action by action.
use super::action::Action;
use super::config::{read_optional, ConfigError};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const DEFAULT_KEYMAP: &str = include_str!("../../assets/keymap.toml");
const DEFAULT_FILE: &str = "keymap.toml (built in)";

const KEY_SYNTAX: &str = "write a character (\"j\", \"?\", \"K\"), a name (esc, enter, tab, backtab, space, up, down, \
     left, right, pageup, pagedown, home, end, backspace, delete, f1..f12), optionally after ctrl- or alt-";

/// A key with its modifiers, normalised: characters carry their shift themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chord {
    code: KeyCode,
    mods: KeyModifiers,
}

impl Chord {
    pub fn from_event(ev: &KeyEvent) -> Chord {
        let mut mods = ev.modifiers & (KeyModifiers::CONTROL | KeyModifiers::ALT | KeyModifiers::SHIFT);
        if matches!(ev.code, KeyCode::Char(_) | KeyCode::BackTab) {
            mods.remove(KeyModifiers::SHIFT);
        }
        Chord { code: ev.code, mods }
    }

    /// Parses `j`, `K`, `?`, `esc`, `ctrl-c`, `alt-x`, `f5`.
    pub fn parse(text: &str) -> Option<Chord> {
        let mut mods = KeyModifiers::NONE;
        let mut rest = text;
        loop {
            if let Some(r) = rest.strip_prefix("ctrl-").filter(|r| !r.is_empty()) {
                mods |= KeyModifiers::CONTROL;
                rest = r;
            } else if let Some(r) = rest.strip_prefix("alt-").filter(|r| !r.is_empty()) {
                mods |= KeyModifiers::ALT;
                rest = r;
            } else {
                break;
            }
        }
        let mut chars = rest.chars();
        let code = match (chars.next(), chars.next()) {
            (Some(c), None) => KeyCode::Char(c),
            _ => match rest {
                "esc" => KeyCode::Esc,
                "enter" => KeyCode::Enter,
                "tab" => KeyCode::Tab,
                "backtab" => KeyCode::BackTab,
                "space" => KeyCode::Char(' '),
                "up" => KeyCode::Up,
                "down" => KeyCode::Down,
                "left" => KeyCode::Left,
                "right" => KeyCode::Right,
                "pageup" => KeyCode::PageUp,
                "pagedown" => KeyCode::PageDown,
                "home" => KeyCode::Home,
                "end" => KeyCode::End,
                "backspace" => KeyCode::Backspace,
                "delete" => KeyCode::Delete,
                f if f.starts_with('f') => KeyCode::F(f[1..].parse().ok().filter(|n| (1..=12).contains(n))?),
                _ => return None,
            },
        };
        Some(Chord { code, mods })
    }
}

#[derive(Clone, Debug)]
pub struct Keymap {
    bindings: HashMap<Chord, Action>,
    /// Each action's keys as written, for help.
    keys: BTreeMap<Action, Vec<String>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeymap {
    #[serde(default)]
    keys: BTreeMap<String, Vec<String>>,
}

impl Keymap {
    /// The built-in keymap, then the user's `keymap.toml` in `dir` over it.
    pub fn load(dir: Option<&Path>) -> Result<Keymap, ConfigError> {
        let mut map = Keymap::parse(DEFAULT_FILE, DEFAULT_KEYMAP)?;
        if let Some(dir) = dir {
            let path = dir.join("keymap.toml");
            if let Some(text) = read_optional(&path)? {
                map.overlay(Keymap::parse(&path.display().to_string(), &text)?);
            }
        }
        Ok(map)
    }

    /// Parses one keymap file; a key bound twice in it is an error.
    pub fn parse(file: &str, text: &str) -> Result<Keymap, ConfigError> {
        let raw: RawKeymap = toml::from_str(text).map_err(|e| ConfigError::syntax(file, e))?;
        let mut map = Keymap { bindings: HashMap::new(), keys: BTreeMap::new() };
        for (name, keys) in raw.keys {
            let place = format!("[keys] {name}");
            let action = Action::from_name(&name).ok_or_else(|| {
                let valid: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
                let hint = crate::recipe::did_you_mean(&name, valid.iter().copied());
                ConfigError::invalid(file, &place, format!("unknown action{hint}; valid actions: {}", valid.join(", ")))
            })?;
            for key in &keys {
                let chord = Chord::parse(key)
                    .ok_or_else(|| ConfigError::invalid(file, &place, format!("{key:?} is not a key: {KEY_SYNTAX}")))?;
                if let Some(other) = map.bindings.insert(chord, action) {
                    let problem = format!("key {key:?} is already bound to {}; a key does one thing", other.name());
                    return Err(ConfigError::invalid(file, &place, problem));
                }
            }
            map.keys.insert(action, keys);
        }
        Ok(map)
    }

    /// The user's bindings win: an action they bind loses its default keys, and a key they take
    /// leaves the action it had.
    fn overlay(&mut self, user: Keymap) {
        for action in user.keys.keys() {
            self.bindings.retain(|_, a| a != action);
        }
        for (chord, action) in &user.bindings {
            if let Some(old) = self.bindings.insert(*chord, *action) {
                if let Some(keys) = self.keys.get_mut(&old) {
                    keys.retain(|k| Chord::parse(k).as_ref() != Some(chord));
                }
            }
        }
        self.keys.extend(user.keys);
    }

    pub fn action(&self, ev: &KeyEvent) -> Option<Action> {
        self.bindings.get(&Chord::from_event(ev)).copied()
    }

    /// The keys of an action as written in the keymap (empty when unbound).
    pub fn keys(&self, action: Action) -> &[String] {
        self.keys.get(&action).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// The first key of an action, for hints ("? help").
    pub fn hint(&self, action: Action) -> &str {
        self.keys(action).first().map(|s| s.as_str()).unwrap_or("-")
    }
}
