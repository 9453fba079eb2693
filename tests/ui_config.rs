//! Config files of the cockpit: every shipped layout and the default keymap load; each kind of
//! invalid layout or keymap is refused with a message naming file, place and the valid choices.
use flightdeck::ui::keymap::{Keymap, DEFAULT_KEYMAP};
use flightdeck::ui::layout::{self, LayoutDef, PanelKind, ScreenKind};

#[test]
fn every_shipped_layout_loads_and_names_distinct_panels() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("layouts");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("layouts/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let def = LayoutDef::parse(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        let panels = def.panels();
        assert!(!panels.is_empty());
        let mut dedup = panels.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), panels.len(), "{}: a panel twice", path.display());
        n += 1;
    }
    assert_eq!(n, layout::BUILTIN.len(), "every file in layouts/ is built in");
    let all = layout::load_all(None).expect("built-in layouts");
    assert_eq!(all.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["default", "debug", "compare", "gpu", "rl"]);
    assert_eq!(all[2].screen, ScreenKind::Compare);
    assert!(all[0].panels().contains(&PanelKind::Chart));
    assert_eq!(all[4].panels()[..3], [PanelKind::Rl, PanelKind::Phases, PanelKind::Samples]);
}

fn layout_err(text: &str) -> String {
    match LayoutDef::parse("layouts/bad.toml", text) {
        Ok(d) => panic!("accepted {d:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn invalid_layouts_are_refused_with_file_place_and_choices() {
    let e = layout_err("name = \"x\"\nsplit = \"rows\"\n[[part]]\npanel = \"chart\"\n[[part]]\npanel = \"charts\"\n");
    assert_eq!(
        e,
        "layouts/bad.toml: part[1]: unknown panel \"charts\"; valid panels: chart, ranks, heatmap, collectives, logs, events, gpu, matrix, stacks, verdict, rl, phases, samples"
    );
    let e = layout_err("name = \"x\"\nsplit = \"rows\"\n[[part]]\nratio = 0\npanel = \"chart\"\n");
    assert_eq!(e, "layouts/bad.toml: part[0]: ratio = 0: a ratio is a whole number from 1 to 100");
    let e = layout_err(
        "name = \"x\"\nsplit = \"rows\"\n[[part]]\nsplit = \"columns\"\n[[part.part]]\nratio = 1.5\npanel = \"logs\"\n",
    );
    assert_eq!(e, "layouts/bad.toml: part[0].part[0]: ratio = 1.5: a ratio is a whole number from 1 to 100");
    let e = layout_err("name = \"x\"\nsplit = \"diagonal\"\n[[part]]\npanel = \"logs\"\n");
    assert_eq!(e, "layouts/bad.toml: root: split = \"diagonal\": valid splits are rows, columns");
    let e = layout_err("name = \"x\"\nsplit = \"rows\"\n[[part]]\npanel = \"logs\"\nsplit = \"rows\"\n");
    assert_eq!(e, "layouts/bad.toml: part[0]: either panel or split, not both");
    let e = layout_err("split = \"rows\"\n[[part]]\npanel = \"logs\"\n");
    assert_eq!(e, "layouts/bad.toml: name: missing: give the layout a name");
    let e = layout_err("name = \"x\"\nscreen = \"compare\"\npanel = \"chart\"\n");
    assert!(e.contains("valid panels: compare_chart, compare_table"), "{e}");
    let e = layout_err("name = \"x\"\npanel = \"chart\"\npannel = 3\n");
    assert!(e.starts_with("layouts/bad.toml: ") && e.contains("unknown field `pannel`"), "{e}");
}

fn keymap_err(text: &str) -> String {
    match Keymap::parse("keymap.toml", text) {
        Ok(_) => panic!("accepted {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn invalid_keymaps_are_refused_with_file_place_and_choices() {
    Keymap::parse("keymap.toml", DEFAULT_KEYMAP).expect("the default keymap");
    let e = keymap_err("[keys]\nfly = [\"f\"]\n");
    assert!(e.starts_with("keymap.toml: [keys] fly: unknown action; valid actions: quit, back, help,"), "{e}");
    let e = keymap_err("[keys]\nzom = [\"f\"]\n");
    assert!(e.starts_with("keymap.toml: [keys] zom: unknown action (did you mean zoom?); valid actions:"), "{e}");
    let e = keymap_err("[keys]\nup = [\"k\"]\ndown = [\"k\"]\n");
    assert_eq!(e, "keymap.toml: [keys] up: key \"k\" is already bound to down; a key does one thing");
    let e = keymap_err("[keys]\nup = [\"ctl-x\"]\n");
    assert!(e.starts_with("keymap.toml: [keys] up: \"ctl-x\" is not a key: write a character"), "{e}");
    let e = keymap_err("[keys]\nup = [\"f13\"]\n");
    assert!(e.contains("\"f13\" is not a key"), "{e}");
}

#[test]
fn a_user_keymap_overrides_the_defaults_action_by_action() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("keymap.toml"), "[keys]\nkill = [\"X\"]\nzoom = [\"j\"]\n").expect("write");
    let map = Keymap::load(Some(dir.path())).expect("user keymap");
    assert_eq!(map.keys(flightdeck::ui::action::Action::Kill), ["X"]);
    assert_eq!(map.keys(flightdeck::ui::action::Action::Zoom), ["j"]);
    // `j` moved to zoom: `down` keeps only its other key.
    assert_eq!(map.keys(flightdeck::ui::action::Action::Down), ["down"]);
    std::fs::write(dir.path().join("keymap.toml"), "[keys]\nkill = [\"X\", \"X\"]\n").expect("write");
    let e = Keymap::load(Some(dir.path())).expect_err("duplicate").to_string();
    assert!(e.starts_with(&format!("{}: [keys] kill", dir.path().join("keymap.toml").display())), "{e}");
}

#[test]
fn user_layouts_replace_by_name_and_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("layouts")).expect("mkdir");
    let mine = "name = \"mine\"\nsplit = \"columns\"\n[[part]]\npanel = \"chart\"\n[[part]]\npanel = \"logs\"\n";
    std::fs::write(dir.path().join("layouts/mine.toml"), mine).expect("write");
    std::fs::write(dir.path().join("layouts/default.toml"), "name = \"default\"\npanel = \"ranks\"\n").expect("write");
    let all = layout::load_all(Some(dir.path())).expect("layouts");
    let names: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["default", "debug", "compare", "gpu", "rl", "mine"]);
    assert_eq!(all[0].panels(), [PanelKind::Ranks]);
    std::fs::write(dir.path().join("layouts/broken.toml"), "name = \"b\"\npanel = \"nope\"\n").expect("write");
    let e = layout::load_all(Some(dir.path())).expect_err("broken").to_string();
    assert!(e.contains("broken.toml: root: unknown panel \"nope\""), "{e}");
}
