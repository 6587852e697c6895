//! Reading a batch's tree: every entry under a directory with its path relative to the batch
//! root, never following symlinked directories (no loops, no wandering out of the batch), and
//! small-file reads and existence tests whose I/O errors become problems or aborts.

use std::fs::{self, FileType};
use std::path::{Path, PathBuf};

use crate::problem::{Abort, IoClass, Kind, Problem, Sink, classify};

#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the batch root, `/`-separated (lossy if a name is not UTF-8).
    pub rel: String,
    pub path: PathBuf,
    /// The entry itself: a symlink is a symlink here, whatever it points to.
    pub file_type: FileType,
    /// The entry's own size (a symlink's is its target text's).
    pub len: u64,
}

impl Entry {
    /// What bagit-python's `os.walk` counts as a file: anything but a directory, where a
    /// symlink to a directory is a directory (listed, not entered).
    pub fn is_file_like(&self) -> bool {
        if self.file_type.is_dir() {
            return false;
        }
        if self.file_type.is_symlink() {
            return !fs::metadata(&self.path).map(|m| m.is_dir()).unwrap_or(false);
        }
        true
    }

    /// The last path component.
    pub fn name(&self) -> &str {
        self.rel.rsplit('/').next().unwrap_or(&self.rel)
    }
}

/// Lists everything below `root/under` (`under` empty for the whole batch), sorted by path.
/// A directory that cannot be listed becomes an `unreadable` problem; a transient error aborts.
pub fn walk(root: &Path, under: &str, sink: &mut dyn Sink) -> Result<Vec<Entry>, Abort> {
    let mut entries = Vec::new();
    let mut pending = vec![(root.join(under), under.trim_end_matches('/').to_owned())];
    while let Some((dir, rel_dir)) = pending.pop() {
        if sink.cancelled() {
            return Err(Abort::Cancelled);
        }
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(e) => {
                unreadable_dir(&dir, &rel_dir, &e, sink)?;
                continue;
            }
        };
        let mut children = Vec::new();
        for child in listing {
            let child = match child {
                Ok(child) => child,
                Err(e) => {
                    unreadable_dir(&dir, &rel_dir, &e, sink)?;
                    break;
                }
            };
            let name = child.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() { name } else { format!("{rel_dir}/{name}") };
            let path = child.path();
            let metadata = match fs::symlink_metadata(&path) {
                Ok(metadata) => metadata,
                // Deleted while we looked: it is simply not there.
                Err(e) if classify(&e) == IoClass::NotFound => continue,
                Err(e) if classify(&e) == IoClass::Transient => {
                    return Err(Abort::Transient(format!("{} is unavailable: {e}", path.display())));
                }
                Err(e) => {
                    sink.add(Problem::new(&rel, Kind::Unreadable, format!("cannot be examined: {e}")));
                    continue;
                }
            };
            children.push(Entry { rel, path, file_type: metadata.file_type(), len: metadata.len() });
        }
        children.sort_by(|a, b| a.rel.cmp(&b.rel));
        // Depth-first, in name order: subdirectories are pushed in reverse so they pop in order.
        for child in children.iter().rev() {
            if child.file_type.is_dir() {
                pending.push((child.path.clone(), child.rel.clone()));
            }
        }
        entries.extend(children);
    }
    entries.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(entries)
}

fn unreadable_dir(dir: &Path, rel: &str, error: &std::io::Error, sink: &mut dyn Sink) -> Result<(), Abort> {
    match classify(error) {
        IoClass::NotFound => Ok(()),
        IoClass::Transient => Err(Abort::Transient(format!("{} is unavailable: {error}", dir.display()))),
        _ => {
            let shown = if rel.is_empty() { "." } else { rel };
            sink.add(Problem::new(
                format!("{shown}/"),
                Kind::Unreadable,
                format!("directory cannot be listed: {error}"),
            ));
            Ok(())
        }
    }
}

/// Reads a (small) file of the batch whole. `None` after reporting it `missing` or
/// `unreadable`; a transient error aborts the check.
pub fn read_small(root: &Path, rel: &str, sink: &mut dyn Sink) -> Result<Option<Vec<u8>>, Abort> {
    let path = root.join(rel);
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) => match classify(&e) {
            IoClass::NotFound => {
                sink.add(Problem::new(rel, Kind::Missing, format!("{rel} is missing")));
                Ok(None)
            }
            IoClass::Transient => Err(Abort::Transient(format!("{} is unavailable: {e}", path.display()))),
            IoClass::Denied | IoClass::Other => {
                sink.add(Problem::new(rel, Kind::Unreadable, format!("{rel} cannot be read: {e}")));
                Ok(None)
            }
        },
    }
}

/// Whether `path` is a file (following symlinks, as Python's `os.path.isfile`). Present but
/// impossible to examine counts as a file, so that reading it reports why.
pub fn is_file(path: &Path) -> Result<bool, Abort> {
    Ok(match stat(path)? {
        Stat::Absent => false,
        Stat::Present(metadata) => metadata.is_file(),
        Stat::Unknown => true,
    })
}

/// Whether `path` is a directory (following symlinks, as Python's `os.path.isdir`).
pub fn is_dir(path: &Path) -> Result<bool, Abort> {
    Ok(matches!(stat(path)?, Stat::Present(metadata) if metadata.is_dir()))
}

enum Stat {
    Absent,
    Present(fs::Metadata),
    Unknown,
}

fn stat(path: &Path) -> Result<Stat, Abort> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Stat::Present(metadata)),
        Err(e) => match classify(&e) {
            IoClass::NotFound => Ok(Stat::Absent),
            IoClass::Transient => Err(Abort::Transient(format!("{} is unavailable: {e}", path.display()))),
            IoClass::Denied | IoClass::Other => Ok(Stat::Unknown),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Collected;

    #[test]
    fn lists_the_tree_without_following_directory_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("data/sub dir")).unwrap();
        fs::write(root.join("data/sub dir/a.txt"), "a").unwrap();
        fs::write(root.join("data/b.txt"), "bb").unwrap();
        std::os::unix::fs::symlink(root.join("data/sub dir"), root.join("data/linked")).unwrap();
        let mut sink = Collected::default();
        let entries = walk(root, "data", &mut sink).unwrap();
        let rels: Vec<&str> = entries.iter().map(|e| e.rel.as_str()).collect();
        assert_eq!(rels, ["data/b.txt", "data/linked", "data/sub dir", "data/sub dir/a.txt"]);
        let files: Vec<&str> = entries.iter().filter(|e| e.is_file_like()).map(|e| e.rel.as_str()).collect();
        assert_eq!(files, ["data/b.txt", "data/sub dir/a.txt"]);
        assert!(sink.problems.is_empty());
    }
}
