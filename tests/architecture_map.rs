//! The map stays true: every source file has a row in docs/ARCHITECTURE.md, and every file the
//! map names exists.
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_source_file_has_a_row_in_the_architecture_map_and_every_row_a_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(files.len() > 100, "found only {} files under src/", files.len());
    let missing: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root).expect("under the root").display().to_string())
        .filter(|rel| !map.contains(&format!("| `{rel}` |")))
        .collect();
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md's \"Every file\" table lacks: {missing:#?}");
    let stale: Vec<&str> = map
        .split('`')
        .filter(|w| w.starts_with("src/") && w.ends_with(".rs"))
        .filter(|w| !root.join(w).is_file())
        .collect();
    assert!(stale.is_empty(), "docs/ARCHITECTURE.md names files that do not exist: {stale:#?}");
}
