//! The layout ARCHITECTURE.md promises, checked: no module imports one that imports it back
//! (in any crate), the controllers never reach into each other or into `run.rs`, and no module
//! of the controller grows past 700 lines.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The controllers of the controller crate: each a module of reconcile functions over the
/// shared context.
const CONTROLLERS: [&str; 5] = ["namespaces", "owners", "trust", "singletons", "signing"];

/// The Rust files of a crate's `src/`, by top-level module (a directory is one module).
fn modules(src: &str) -> BTreeMap<String, Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(ROOT).join(src);
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for file in files {
        let top = file.strip_prefix(&root).unwrap().components().next().unwrap();
        let name = top.as_os_str().to_str().unwrap().trim_end_matches(".rs").to_string();
        modules.entry(name).or_default().push(file);
    }
    modules
}

/// The code of a file without its comments and its test modules: what it imports to build.
/// An inline test module (`#[cfg(test)] mod tests {`) ends the code; a test module declared
/// in another file (`#[cfg(test)] mod tests;`) is skipped, and the code after it kept.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut kept = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            match lines.peek().map(|next| next.trim()) {
                Some(next) if next.starts_with("mod ") && next.ends_with(';') => {
                    lines.next();
                    continue;
                }
                _ => break,
            }
        }
        kept.push(line.split("//").next().unwrap());
    }
    kept.join("\n")
}

/// The top-level modules `code` names through `crate::` (`crate::a::b`, `crate::{a, b::c}`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The names at the group's first level.
            let (mut depth, mut start) = (1, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => start = true,
                    c if depth == 1 && start && !c.is_whitespace() => {
                        refs.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs.remove("");
    refs
}

/// Who imports whom, among a crate's top-level modules.
fn graph(src: &str) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    modules
        .iter()
        .map(|(name, files)| {
            let refs = files.iter().flat_map(|f| crate_refs(&code(f))).filter(|r| r != name && modules.contains_key(r));
            (name.clone(), refs.collect())
        })
        .collect()
}

/// Every import cycle: each module that can reach itself, with the path back.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in graph.keys() {
        // Breadth-first from `start`, remembering how each module was reached.
        let mut via: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = vec![start.as_str()];
        while let Some(m) = queue.pop() {
            for next in &graph[m] {
                if next == start {
                    let mut path = vec![start.clone(), m.to_string()];
                    let mut at = m;
                    while let Some(prev) = via.get(at) {
                        path.push(prev.to_string());
                        at = prev;
                    }
                    path.pop();
                    path.reverse();
                    path.insert(0, start.clone());
                    found.push(path);
                    queue.clear();
                    break;
                }
                if !via.contains_key(next.as_str()) {
                    via.insert(next, m);
                    queue.push(next);
                }
            }
        }
    }
    found
}

#[test]
fn the_import_graph_reader_sees_groups_and_ignores_comments_and_tests() {
    let refs = crate_refs("use crate::{a, b::{c, d}, e::f};\nuse crate::g::h;\nlet x = crate::i::j();");
    assert_eq!(refs, ["a", "b", "e", "g", "i"].map(String::from).into());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.rs");
    std::fs::write(&file, "use crate::a; // crate::b\n/// [`crate::c`]\n#[cfg(test)]\nmod tests { use crate::d; }\n")
        .unwrap();
    assert_eq!(crate_refs(&code(&file)), ["a"].map(String::from).into());
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .iter()
        .map(|(m, to)| (m.to_string(), [to.to_string()].into()))
        .collect();
    assert_eq!(cycles(&g)[0], ["a", "b", "c", "a"]);
    assert_eq!(cycles(&g).len(), 3, "each of a, b and c is on the cycle; d only leads to it");
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for src in ["controller/src", "webhooks/src", "certs/src", "src"] {
        let graph = graph(src);
        assert!(graph.len() > 5, "{src}: {graph:?}");
        let cycles = cycles(&graph);
        assert!(cycles.is_empty(), "{src} has import cycles (move what both need below both): {cycles:?}");
    }
}

#[test]
fn the_controllers_use_the_shared_layer_and_never_each_other() {
    let graph = graph("controller/src");
    for controller in CONTROLLERS {
        let imports = &graph[controller];
        assert!(imports.contains("context"), "{controller} works over the context");
        for other in CONTROLLERS.iter().chain(&["run"]).filter(|o| **o != controller) {
            assert!(!imports.contains(*other), "{controller} imports {other}: move what both need to context.rs");
        }
    }
    // The shared layer and the pure modules know no controller.
    for (module, imports) in
        graph.iter().filter(|(m, _)| !CONTROLLERS.contains(&m.as_str()) && *m != "run" && *m != "lib")
    {
        for controller in CONTROLLERS {
            assert!(!imports.contains(controller), "{module} imports the controller {controller}");
        }
    }
}

#[test]
fn run_calls_each_controller_only_through_its_entry_points() {
    let run = code(&Path::new(ROOT).join("controller/src/run.rs"));
    for controller in CONTROLLERS {
        let source = code(&Path::new(ROOT).join(format!("controller/src/{controller}.rs")));
        let entry_points: BTreeSet<String> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub async fn ").or_else(|| l.strip_prefix("pub fn ")))
            .map(|l| l.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
            .collect();
        assert!(!entry_points.is_empty(), "{controller} has no entry point");
        let needle = format!("{controller}::");
        for (at, _) in run.match_indices(&needle) {
            let before = run[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String =
                run[at + needle.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            assert!(entry_points.contains(&name), "run.rs uses {controller}::{name}, not one of {entry_points:?}");
        }
    }
}

/// issue 59: the gate is a sidecar of its own; it shares how keyward reaches a cluster
/// (`kubeconfig`) and the serving layer, never the controller's command.
#[test]
fn the_gate_builds_nothing_from_the_controllers_command() {
    let graph = graph("src");
    assert!(graph["gate"].contains("kubeconfig"), "{:?}", graph["gate"]);
    assert!(!graph["gate"].contains("controller"), "the gate imports src/controller.rs: {:?}", graph["gate"]);
}

#[test]
fn no_module_of_the_controller_passes_700_lines() {
    for (module, files) in modules("controller/src") {
        for file in files {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            assert!(lines <= 700, "{module}: {} has {lines} lines: split it by the kind of work", file.display());
        }
    }
}
