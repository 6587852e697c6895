//! The cargo workspace a new crate would belong to, read from the manifests on disk: which
//! one it is, its members' names and patterns, and where the crate sits below its root.

use std::collections::BTreeSet;
use std::path::{Component as PathPart, Path, PathBuf};

use super::refused;
use crate::operator::OperatorError;

pub(super) fn absolute(cwd: &Path, dir: &Path) -> PathBuf {
    let mut path = PathBuf::new();
    for part in cwd.join(dir).components() {
        match part {
            PathPart::CurDir => {}
            PathPart::ParentDir => {
                path.pop();
            }
            other => path.push(other),
        }
    }
    path
}

/// The nearest directory at or above `from` that exists, resolved (symlinks followed), with
/// the part of `from` that does not exist yet.
fn existing_ancestor(from: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut rest = Vec::new();
    let mut dir = from;
    loop {
        if let Ok(resolved) = dir.canonicalize() {
            let missing: PathBuf = rest.iter().rev().collect();
            return Some((resolved, missing));
        }
        rest.push(dir.file_name()?.to_owned());
        dir = dir.parent()?;
    }
}

pub(super) enum Workspace {
    /// The autocomp workspace's root directory.
    Autocomp(PathBuf),
    /// Another cargo workspace, which would claim a crate written below it.
    Other,
}

/// The cargo workspace a crate written in `dir` would belong to: the first `Cargo.toml` with a
/// `[workspace]` table at or above it, as cargo looks for one. It is the autocomp workspace if
/// its members include "framework".
pub(super) fn find_workspace(dir: &Path) -> Option<Workspace> {
    let (start, _) = existing_ancestor(dir)?;
    for dir in start.ancestors() {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        let Ok(manifest) = text.parse::<toml::Table>() else { continue };
        let Some(workspace) = manifest.get("workspace") else { continue };
        let members = workspace.get("members").and_then(toml::Value::as_array);
        let autocomp = members.is_some_and(|m| m.iter().any(|m| m.as_str() == Some("framework")));
        return Some(if autocomp { Workspace::Autocomp(dir.to_path_buf()) } else { Workspace::Other });
    }
    None
}

/// `target`'s path below `root` as a members entry ("components/page-counter").
pub(super) fn relative_member(root: &Path, target: &Path) -> Result<String, OperatorError> {
    let (resolved, missing) =
        existing_ancestor(target).ok_or_else(|| refused(format!("{} has no parent", target.display())))?;
    let relative = resolved.join(missing);
    let relative = relative
        .strip_prefix(root)
        .map_err(|_| refused(format!("{} is not below the workspace root {}", target.display(), root.display())))?;
    let parts: Option<Vec<&str>> = relative.components().map(|p| p.as_os_str().to_str()).collect();
    parts.map(|parts| parts.join("/")).ok_or_else(|| refused(format!("{} is not UTF-8", relative.display())))
}

/// Package and binary names of the workspace at `root` (its members' `Cargo.toml`s).
pub(super) fn workspace_names(root: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Ok(text) = std::fs::read_to_string(root.join("Cargo.toml")) else { return names };
    let Ok(manifest) = text.parse::<toml::Table>() else { return names };
    let members = manifest.get("workspace").and_then(|w| w.get("members")).and_then(toml::Value::as_array);
    for pattern in members.into_iter().flatten().filter_map(toml::Value::as_str) {
        for dir in expand(root, pattern) {
            let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
            let Ok(member) = text.parse::<toml::Table>() else { continue };
            let package = member.get("package").and_then(|p| p.get("name")).and_then(toml::Value::as_str);
            names.extend(package.map(str::to_owned));
            let bins = member.get("bin").and_then(toml::Value::as_array).into_iter().flatten();
            names.extend(bins.filter_map(|b| b.get("name")?.as_str().map(str::to_owned)));
            if let Ok(entries) = std::fs::read_dir(dir.join("src/bin")) {
                let stems = entries.flatten().filter_map(|e| Some(e.path().file_stem()?.to_str()?.to_owned()));
                names.extend(stems);
            }
        }
    }
    names
}

/// The directories a members pattern names ('*' and '?' within one path segment).
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    for segment in pattern.split('/').filter(|s| !s.is_empty() && *s != ".") {
        let mut next = Vec::new();
        for dir in dirs {
            if !segment.contains(['*', '?']) {
                next.push(dir.join(segment));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let matched = entry.file_name().to_str().is_some_and(|name| segment_matches(segment, name));
                if matched && entry.path().is_dir() {
                    next.push(entry.path());
                }
            }
        }
        dirs = next;
    }
    dirs
}

/// Whether a members pattern (glob: '*', '?', "**" for any number of segments) covers `path`.
pub(super) fn pattern_covers(pattern: &str, path: &str) -> bool {
    fn parts(text: &str) -> Vec<&str> {
        text.split('/').filter(|s| !s.is_empty() && *s != ".").collect()
    }
    fn matches(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.split_first(), path.split_first()) {
            (None, None) => true,
            (Some((&"**", rest)), _) => matches(rest, path) || (!path.is_empty() && matches(pattern, &path[1..])),
            (Some((segment, rest)), Some((name, names))) => segment_matches(segment, name) && matches(rest, names),
            _ => false,
        }
    }
    matches(&parts(pattern), &parts(path))
}

fn segment_matches(pattern: &str, name: &str) -> bool {
    fn go(pattern: &[char], name: &[char]) -> bool {
        match pattern.split_first() {
            None => name.is_empty(),
            Some(('*', rest)) => (0..=name.len()).any(|skip| go(rest, &name[skip..])),
            Some(('?', rest)) => !name.is_empty() && go(rest, &name[1..]),
            Some((c, rest)) => name.first() == Some(c) && go(rest, &name[1..]),
        }
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    go(&pattern, &name)
}

/// The `members` patterns of the workspace at `root`.
pub(super) fn workspace_patterns(root: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(root.join("Cargo.toml")) else { return Vec::new() };
    let Ok(manifest) = text.parse::<toml::Table>() else { return Vec::new() };
    let members = manifest.get("workspace").and_then(|w| w.get("members")).and_then(toml::Value::as_array);
    members.into_iter().flatten().filter_map(toml::Value::as_str).map(str::to_owned).collect()
}
