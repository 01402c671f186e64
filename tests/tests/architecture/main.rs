//! The shape of the code itself: no module of any crate of the workspace
//! imports another in a cycle, of any length, whether the path is written
//! with `crate::`, `super::` or `self::`, through a grouped import or a
//! re-export (the graph: `modgraph.rs`).

mod modgraph;

use std::path::{Path, PathBuf};

use modgraph::Graph;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The `members` of the workspace manifest.
fn members(root: &Path) -> Vec<PathBuf> {
    let manifest =
        std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect()
}

/// Every target root of a package: its library and binaries, and its test,
/// bench and example targets (a file, or a folder with `main.rs`).
fn target_roots(package: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for file in ["src/lib.rs", "src/main.rs"] {
        roots.push(package.join(file));
    }
    for dir in ["src/bin", "tests", "benches", "examples"] {
        let Ok(entries) = std::fs::read_dir(package.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(path);
            } else if path.join("main.rs").exists() {
                roots.push(path.join("main.rs"));
            }
        }
    }
    roots.retain(|p| p.exists());
    roots.sort();
    roots
}

#[test]
fn no_module_imports_another_in_a_cycle() {
    let root = workspace_root();
    let mut cycles = Vec::new();
    let mut crates = 0;
    for package in members(&root) {
        for target in target_roots(&package) {
            let graph = Graph::read(&target)
                .unwrap_or_else(|e| panic!("reading {}: {e}", target.display()));
            crates += 1;
            for cycle in graph.cycles() {
                let shown = target
                    .strip_prefix(&root)
                    .unwrap_or(&target)
                    .display()
                    .to_string();
                let cycle = cycle.replace(&format!("{}/", root.display()), "");
                cycles.push(format!("{shown}: {cycle}"));
            }
        }
    }
    assert!(
        crates >= 6,
        "found only {crates} crate targets under {}",
        root.display()
    );
    assert!(
        cycles.is_empty(),
        "{} module cycle(s):\n{}",
        cycles.len(),
        cycles.join("\n")
    );
}

/// Writes a small crate and returns its graph's cycles.
fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
        std::fs::write(path, text).expect("a file");
    }
    let graph = Graph::read(&dir.path().join("lib.rs")).expect("the crate reads");
    graph
        .cycles()
        .iter()
        .map(|c| c.lines().next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_cycle_of_three_through_super_and_a_grouped_import_is_found() {
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod live;\n"),
        ("live/mod.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        (
            "live/a.rs",
            "use super::{b::{self, B}, x};\npub struct A;\n",
        ),
        (
            "live/b.rs",
            "/// Not [`super::a`]: a comment.\npub fn f() { let _ = \"super::a\"; self::g(crate::live::c::C) }\n",
        ),
        ("live/c.rs", "pub struct C(super::a::A);\n"),
    ]);
    assert_eq!(
        cycles,
        ["cycle among {crate::live::a, crate::live::b, crate::live::c}:"]
    );
}

#[test]
fn a_re_export_points_at_the_module_that_defines_the_name() {
    // a and b name each other only through the root's re-exports.
    let cycle = cycles_of(&[
        ("lib.rs", "mod a;\nmod b;\npub use a::A;\npub use b::B;\n"),
        ("a.rs", "pub struct A(crate::B);\n"),
        (
            "b.rs",
            "use crate::{A as Other};\npub struct B(Option<Box<Other>>);\n",
        ),
    ]);
    assert_eq!(cycle, ["cycle among {crate::a, crate::b}:"]);
}

#[test]
fn naming_an_enclosing_module_is_not_an_edge() {
    // The root declares x and re-exports from it; x names the root's
    // Error and its test module names x: a module sees its ancestors.
    let clean = cycles_of(&[
        ("lib.rs", "pub mod x;\npub enum Error {}\npub use x::X;\n"),
        (
            "x.rs",
            "pub struct X(crate::Error);\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
    ]);
    assert_eq!(clean, Vec::<String>::new());
}

#[test]
fn path_attributes_inline_modules_and_self_paths_are_followed() {
    let cycles = cycles_of(&[
        (
            "lib.rs",
            "pub mod outer {\n    pub mod inner;\n    pub fn f() -> self::inner::I { todo!() }\n}\n#[path = \"elsewhere.rs\"]\npub mod moved;\n",
        ),
        ("outer/inner.rs", "pub struct I(crate::moved::M);\n"),
        (
            "elsewhere.rs",
            "pub struct M;\npub fn g() { crate::outer::f(); }\n",
        ),
    ]);
    assert_eq!(
        cycles,
        ["cycle among {crate::outer, crate::outer::inner, crate::moved}:"]
    );
}

/// The edges of the controller library as `from -> to`, each with where it
/// is written, test modules left out.
fn controller_edges() -> Vec<(String, String, String)> {
    let lib = workspace_root().join("controller-shim/src/lib.rs");
    let graph = Graph::read(&lib).unwrap_or_else(|e| panic!("reading {}: {e}", lib.display()));
    let mut out = Vec::new();
    for ((from, to), site) in graph.edges() {
        let (from, to) = (graph.name(from), graph.name(to));
        if from.split("::").any(|s| s == "tests") {
            continue;
        }
        out.push((
            from,
            to,
            format!("{}:{}: {}", site.file.display(), site.line, site.text),
        ));
    }
    out
}

fn under(module: &str, folder: &str) -> bool {
    module == folder || module.starts_with(&format!("{folder}::"))
}

/// The controller's edges from a module under one of `from` to a module
/// under one of `to`, readable.
fn edges_between(from: &[&str], to: &[&str]) -> Vec<String> {
    controller_edges()
        .into_iter()
        .filter(|(f, t, _)| from.iter().any(|m| under(f, m)) && to.iter().any(|m| under(t, m)))
        .map(|(f, t, site)| format!("{f} -> {t} ({site})"))
        .collect()
}

#[test]
fn the_controller_runtime_names_nothing_above_it() {
    // Every edge out of runtime/ ("crate" holds every module), less those
    // that stay inside it.
    let up: Vec<String> = edges_between(&["crate::runtime"], &["crate"])
        .into_iter()
        .filter(|e| !e.contains(" -> crate::runtime"))
        .collect();
    assert!(
        up.is_empty(),
        "runtime/ names the floors above it:\n{}",
        up.join("\n")
    );
}

#[test]
fn the_always_on_path_names_no_opt_in_feature_and_no_client() {
    let always_on = [
        "crate::runtime",
        "crate::edge",
        "crate::intake",
        "crate::eval",
        "crate::api",
        "crate::state",
    ];
    let apart = [
        "crate::admission",
        "crate::remediation",
        "crate::query",
        "crate::offline",
        "crate::cli",
        "crate::run",
    ];
    let wrong = edges_between(&always_on, &apart);
    assert!(
        wrong.is_empty(),
        "the always-on path names what stands apart from it:\n{}",
        wrong.join("\n")
    );
}

/// Every `.rs` file below `dir`, skipping build output and hidden folders.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The files over `limit` lines among `files`, with their lengths.
fn over(files: &[PathBuf], root: &Path, limit: usize) -> Vec<String> {
    files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > limit)
                .then(|| format!("{}: {n} lines", f.strip_prefix(root).unwrap_or(f).display()))
        })
        .collect()
}

/// A file a reader can hold in mind: none over 1,500 lines outside the
/// `tests` crate, none over 800 in the controller's `src` (its folders
/// answer one question each; a larger file is two).
#[test]
fn no_source_file_is_longer_than_its_limit() {
    let root = workspace_root();
    let mut files = Vec::new();
    for m in members(&root) {
        if m.file_name().is_some_and(|n| n == "tests") {
            continue;
        }
        rust_files(&m, &mut files);
    }
    assert!(files.len() > 50, "found only {} files", files.len());
    let long = over(&files, &root, 1_500);
    assert!(long.is_empty(), "over 1,500 lines: {long:#?}");
    let controller: Vec<PathBuf> = files
        .iter()
        .filter(|f| f.starts_with(root.join("controller-shim/src")))
        .cloned()
        .collect();
    let long = over(&controller, &root, 800);
    assert!(
        long.is_empty(),
        "over 800 lines in controller-shim/src: {long:#?}"
    );
}
