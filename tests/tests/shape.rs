//! The shape of the product code, held by tests: no file over 1,000 lines, no function over
//! 100, no import loop between the modules of a crate, and every Rust file of the
//! repository named in ARCHITECTURE.md's code map (`scripts/code-map` writes it). A room that grows past these holds two things: split it.
//! Product code is the `src/` of every crate but the tests crate (benches and examples are
//! not rooms of the product). `tests/tests/rooms.rs` holds the rule on error kinds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 1_000;
const MAX_FUNCTION_LINES: usize = 100;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// Every crate's `src/` directory, the tests crate's aside.
fn crate_sources() -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = crate::rooms::product_crates(&root())
        .into_iter()
        .map(|dir| dir.join("src"))
        .filter(|src| src.is_dir())
        .collect();
    sources.sort();
    sources
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

fn product_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for source in crate_sources() {
        rust_files(&source, &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "found only {} product files under {}", files.len(), root().display());
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap().display().to_string()
}

/// The functions of a rustfmt-formatted file with their lengths in lines: a body opens on
/// the signature's last line and closes on a line that is its indentation and `}`.
fn function_lengths(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(name) = function_name(trimmed) else { continue };
        let Some(open) = (start..lines.len()).find(|&i| lines[i].ends_with('{') || lines[i].ends_with(';')) else {
            continue;
        };
        if lines[open].ends_with(';') {
            continue; // a declaration without a body
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&i| lines[i] == close) {
            found.push((start + 1, name, end - start + 1));
        }
    }
    found
}

/// `name` when the line starts a function item (`pub(crate) async fn name…`).
fn function_name(line: &str) -> Option<String> {
    let mut rest = line;
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name: String = rest.strip_prefix("fn ")?.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn no_product_file_is_over_a_thousand_lines() {
    let over: Vec<String> = product_files()
        .iter()
        .map(|file| (std::fs::read_to_string(file).unwrap().lines().count(), file))
        .filter(|(lines, _)| *lines > MAX_FILE_LINES)
        .map(|(lines, file)| format!("{}: {lines} lines", relative(file)))
        .collect();
    assert!(over.is_empty(), "files over {MAX_FILE_LINES} lines (split by what they hold):\n{}", over.join("\n"));
}

#[test]
fn no_product_function_is_over_a_hundred_lines() {
    let mut over = Vec::new();
    for file in product_files() {
        for (line, name, length) in function_lengths(&std::fs::read_to_string(&file).unwrap()) {
            if length > MAX_FUNCTION_LINES {
                over.push(format!("{}:{line} {name}: {length} lines", relative(&file)));
            }
        }
    }
    assert!(over.is_empty(), "functions over {MAX_FUNCTION_LINES} lines:\n{}", over.join("\n"));
}

/// A crate's modules by path (`web::actions`), each with its file. `src/bin/*` are
/// crates of their own and left out.
fn modules(source: &Path) -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    rust_files(source, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let inside = file.strip_prefix(source).unwrap().with_extension("");
        let parts: Vec<String> = inside.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.first().is_some_and(|p| p == "bin") || parts == ["main"] {
            continue;
        }
        let mut path: Vec<String> = parts.into_iter().filter(|p| p != "mod" && p != "lib").collect();
        if path.last().is_some_and(|p| p == "main") && path.len() == 1 {
            path.clear();
        }
        modules.insert(path.join("::"), file);
    }
    modules
}

/// The `use` statements and `crate::`/`super::` paths of a file, expanded
/// (`use crate::{a::X, b}` gives `crate::a::X` and `crate::b`), as absolute module paths.
fn referenced_paths(text: &str, module: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let code = without_tests_and_comments(text);
    let mut rest = code.as_str();
    while let Some(at) = rest.find(['c', 's']) {
        let tail = &rest[at..];
        let boundary = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':');
        let prefix = ["crate::", "super::", "self::"].into_iter().find(|p| tail.starts_with(p));
        match prefix {
            Some(prefix) if boundary => {
                let end = path_end(tail);
                for expanded in expand(&tail[..end]) {
                    paths.push(absolute(&expanded, prefix, module));
                }
                rest = &tail[end.max(1)..];
            }
            _ => rest = &tail[1..],
        }
    }
    paths
}

/// The text without line comments and `#[cfg(test)]` modules: what tests import is not the
/// product's structure.
fn without_tests_and_comments(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|next| next.trim_start().starts_with("mod ") && next.ends_with('{'))
        {
            let close = format!("{indent}}}");
            i = (i + 2..lines.len()).find(|&j| lines[j] == close).unwrap_or(lines.len()) + 1;
            continue;
        }
        if !trimmed.starts_with("//") {
            kept.push(line);
        }
        i += 1;
    }
    kept.join("\n")
}

/// Where a path starting here ends: after its braces, if it has any.
fn path_end(text: &str) -> usize {
    let mut depth = 0;
    let mut brace_opened = None;
    for (i, c) in text.char_indices() {
        match c {
            '{' => {
                brace_opened.get_or_insert(i);
                depth += 1
            }
            '}' if depth > 0 => depth -= 1,
            c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => return i,
            // Not a `use` group after all (a block, a format string): the path ends at the brace.
            c if depth > 0 && !(c.is_alphanumeric() || c.is_whitespace() || "_:,*".contains(c)) => {
                return brace_opened.unwrap_or(i);
            }
            _ => {}
        }
    }
    if depth > 0 { brace_opened.unwrap_or(text.len()) } else { text.len() }
}

/// `a::{b::C, d}` -> [`a::b::C`, `a::d`].
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else { return vec![path.to_owned()] };
    let (head, body) = (&path[..open], &path[open + 1..path.rfind('}').unwrap_or(path.len())]);
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
        .into_iter()
        .map(|p| p.split_whitespace().collect::<String>())
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{head}{p}")))
        .collect()
}

fn absolute(path: &str, prefix: &str, module: &str) -> Vec<String> {
    let mut base: Vec<String> =
        if module.is_empty() { Vec::new() } else { module.split("::").map(str::to_owned).collect() };
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    match prefix {
        "crate::" => {
            base.clear();
            segments.remove(0);
        }
        _ => {
            // `self` is the module itself; `super` its parent (from a.rs and from a/mod.rs alike).
            while segments.first().is_some_and(|s| *s == "super" || *s == "self") {
                if segments.remove(0) == "super" {
                    base.pop();
                }
            }
        }
    }
    base.extend(segments.into_iter().map(str::to_owned));
    base
}

/// The module a path lands in: its longest prefix that is a module of the crate.
fn landing(path: &[String], modules: &BTreeMap<String, PathBuf>) -> Option<String> {
    (0..=path.len()).rev().map(|n| path[..n].join("::")).find(|candidate| modules.contains_key(candidate))
}

fn is_within(module: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || module == ancestor || module.starts_with(&format!("{ancestor}::"))
}

/// The module graph of a crate without the arrows between a module and its ancestors (a
/// child may use its parent's items and a parent re-export its child's).
fn module_graph(source: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(source);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let arrows = graph.entry(module.clone()).or_default();
        for path in referenced_paths(&text, module) {
            if let Some(target) = landing(&path, &modules)
                && !is_within(module, &target)
                && !is_within(&target, module)
            {
                arrows.insert(target);
            }
        }
    }
    siblings_only(graph)
}

/// Each arrow between two modules as the arrow between their ancestors that are siblings
/// (`web::a::x -> web::b` is `web::a -> web::b`): a folder is one room seen from beside it,
/// so a loop through a parent's re-export is still a loop.
fn siblings_only(graph: BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").collect(), to.split("::").collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let (a, b) = (a[..=common].join("::"), b[..=common].join("::"));
            siblings.entry(a).or_default().insert(b);
        }
    }
    siblings
}

/// The loops of a graph (Tarjan's strongly connected components of more than one module).
fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, node: &'g str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next.as_str()]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[node].min(self.index[next.as_str()]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_module_of_a_crate_imports_in_a_loop() {
    let mut found = Vec::new();
    for source in crate_sources() {
        for cycle in loops(&module_graph(&source)) {
            found.push(format!("{}: {}", relative(&source), cycle.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "modules that import each other in a loop (one must go one way):\n{}", found.join("\n"));
}

#[test]
fn a_loop_is_found_and_a_child_using_its_parent_is_not_one() {
    let graph = |arrows: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in arrows {
            graph.entry((*from).to_owned()).or_default().insert((*to).to_owned());
            graph.entry((*to).to_owned()).or_default();
        }
        graph
    };
    assert_eq!(loops(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])), vec![vec!["a", "b", "c"]]);
    assert!(loops(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    let paths = referenced_paths("use crate::{web::html::esc, filter};\nlet x = super::sibling::f();", "web::page");
    assert_eq!(paths, vec![vec!["web", "html", "esc"], vec!["filter"], vec!["web", "sibling", "f"]]);
}

/// Every Rust file of the repository (product, tests, benches, examples), `target/` aside.
fn every_rust_file(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() && name != "target" && !name.starts_with('.') {
            every_rust_file(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn the_code_map_names_every_rust_file() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    every_rust_file(&root(), &mut files);
    files.sort();
    let missing: Vec<String> =
        files.iter().map(|file| relative(file)).filter(|file| !map.contains(&format!("`{file}`"))).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name (scripts/code-map writes it):\n{}",
        missing.join("\n")
    );
}
