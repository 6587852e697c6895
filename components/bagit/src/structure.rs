//! Structure checks of a delivered batch: the BagIt skeleton (a well-formed `bagit.txt`
//! declaration, a `data/` payload directory, a payload manifest, required bag-info fields)
//! and the configurable layout rules (required files, allowed payload names and characters,
//! no empty files, no symlinks leaving the batch). Reads names and metadata only, no content.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Algorithm;
use crate::algorithm::RECOGNISED_UNSUPPORTED;
use crate::paths::normalize_relative;
use crate::pattern::{Charset, Pattern};
use crate::problem::{Abort, Kind, Problem, Sink, location_error};
use crate::tagfile::{Encoding, TagFile, Version, parse_declaration};
use crate::verify::count;
use crate::walk::{self, Entry, read_small};

/// `structure-checker`'s `[settings]`.
///
/// ```toml
/// [settings]
/// bagit = true                                    # check the BagIt skeleton
/// required_bag_info = ["Source-Organization"]     # bag-info.txt fields that must be non-empty
/// required_files = ["data/*.xml", "MD5SUMS"]      # each pattern must match at least one file
/// allowed_payload_names = ["*.tif", "*.xml"]      # payload files must match one (empty: any)
/// payload_name_characters = "A-Za-z0-9._-"        # characters allowed in payload names
/// no_empty_files = true
/// no_escaping_symlinks = true
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StructureRules {
    /// Require the BagIt skeleton. Off for deliveries that are not bags: then every file is
    /// payload for the name rules.
    pub bagit: bool,
    /// Fields of `bag-info.txt` that must be present and non-empty (with `bagit` only).
    pub required_bag_info: Vec<String>,
    /// Each pattern must match at least one file (see `Pattern` for the syntax).
    pub required_files: Vec<Pattern>,
    /// When not empty, every payload file must match one of these.
    pub allowed_payload_names: Vec<Pattern>,
    /// When set, every name below `data/` (files and directories) must use only these.
    pub payload_name_characters: Option<Charset>,
    /// Zero-byte files are failures.
    pub no_empty_files: bool,
    /// Symlinks that point outside the batch (or nowhere) are failures.
    pub no_escaping_symlinks: bool,
}

impl Default for StructureRules {
    fn default() -> Self {
        StructureRules {
            bagit: true,
            required_bag_info: Vec::new(),
            required_files: Vec::new(),
            allowed_payload_names: Vec::new(),
            payload_name_characters: None,
            no_empty_files: true,
            no_escaping_symlinks: true,
        }
    }
}

impl StructureRules {
    /// The rules in force, for the summary.
    fn describe(&self, version: Option<Version>) -> Vec<String> {
        let mut rules = Vec::new();
        if self.bagit {
            rules.push(match version {
                Some(version) => format!("BagIt {version}"),
                None => "BagIt".to_owned(),
            });
        }
        if !self.required_bag_info.is_empty() {
            rules.push(count(self.required_bag_info.len() as u64, "bag-info field"));
        }
        if !self.required_files.is_empty() {
            rules.push(count(self.required_files.len() as u64, "required file"));
        }
        if !self.allowed_payload_names.is_empty() {
            rules.push("name patterns".into());
        }
        if self.payload_name_characters.is_some() {
            rules.push("name characters".into());
        }
        if self.no_empty_files {
            rules.push("no empty files".into());
        }
        if self.no_escaping_symlinks {
            rules.push("no escaping symlinks".into());
        }
        rules
    }
}

/// What was looked at, for the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructureTotals {
    pub files: u64,
    pub directories: u64,
    pub rules: Vec<String>,
}

impl StructureTotals {
    /// E.g. `checked 12 files and 2 directories: BagIt 1.0, no empty files` (the runner adds
    /// the count of violations and the first one to the line it prints).
    pub fn summary(&self) -> String {
        format!(
            "checked {} and {}: {}",
            count(self.files, "file"),
            count(self.directories, "directory"),
            self.rules.join(", ")
        )
    }
}

/// Checks the batch at `root` against `rules`, reporting each violation to `sink`.
pub fn check(root: &Path, rules: &StructureRules, sink: &mut dyn Sink) -> Result<StructureTotals, Abort> {
    let metadata = fs::metadata(root).map_err(|e| location_error(root, &e))?;
    if !metadata.is_dir() {
        return Err(Abort::Location(format!("batch location {} is not a directory", root.display())));
    }
    let canonical_root = fs::canonicalize(root).map_err(|e| location_error(root, &e))?;
    let entries = walk::walk(root, "", sink)?;

    let version = if rules.bagit { check_bag(root, rules, &entries, sink)? } else { None };

    for pattern in &rules.required_files {
        if !entries.iter().any(|e| !e.file_type.is_dir() && pattern.matches(&e.rel)) {
            let why = format!("no file matches the required pattern `{pattern}`");
            sink.add(Problem::new(pattern.as_str(), Kind::Missing, why));
        }
    }

    let in_payload = |e: &Entry| !rules.bagit || e.rel.starts_with("data/");
    for entry in &entries {
        if in_payload(entry) {
            check_name(entry, rules, sink);
        }
        if rules.no_empty_files && entry.file_type.is_file() && entry.len == 0 {
            sink.add(Problem::new(&entry.rel, Kind::Empty, "is an empty file"));
        }
        if rules.no_escaping_symlinks && entry.file_type.is_symlink() {
            check_symlink(root, &canonical_root, entry, sink);
        }
    }

    let directories = entries.iter().filter(|e| e.file_type.is_dir()).count() as u64;
    Ok(StructureTotals { files: entries.len() as u64 - directories, directories, rules: rules.describe(version) })
}

/// The BagIt skeleton; returns the declared version when it could be read.
fn check_bag(
    root: &Path,
    rules: &StructureRules,
    entries: &[Entry],
    sink: &mut dyn Sink,
) -> Result<Option<Version>, Abort> {
    let top = |name: &str| entries.iter().find(|e| e.rel == name);
    let mut declaration = None;
    match top("bagit.txt") {
        None => sink.add(Problem::new("bagit.txt", Kind::Missing, "not a BagIt bag: bagit.txt is missing")),
        Some(e) if !e.file_type.is_file() => {
            sink.add(Problem::new("bagit.txt", Kind::NotAFile, "bagit.txt is not a regular file"))
        }
        Some(_) => {
            if let Some(bytes) = read_small(root, "bagit.txt", sink)? {
                declaration = check_declaration(&bytes, sink);
            }
        }
    }
    match top("data") {
        None => sink.add(Problem::new("data/", Kind::Missing, "the payload directory data/ is missing")),
        Some(e) if !e.file_type.is_dir() => {
            sink.add(Problem::new("data/", Kind::NotAFile, "data is not a directory (a symlink or a file)"))
        }
        Some(_) => {}
    }
    let has_payload_manifest = entries.iter().any(|e| {
        let algorithm = e.rel.strip_prefix("manifest-").and_then(|rest| rest.strip_suffix(".txt"));
        algorithm.is_some_and(|a| Algorithm::from_name(a).is_some() || RECOGNISED_UNSUPPORTED.contains(&a))
            && !e.file_type.is_dir()
    });
    if !has_payload_manifest {
        let why = "the bag has no payload manifest (manifest-md5.txt, manifest-sha256.txt, ...)";
        sink.add(Problem::new("manifest-<algorithm>.txt", Kind::Missing, why));
    }
    let version = declaration.map(|(version, _)| version);
    if !rules.required_bag_info.is_empty() {
        let encoding = declaration.map_or(Encoding::Utf8, |(_, encoding)| encoding);
        check_bag_info(root, version.unwrap_or(Version(1, 0)).info_file(), encoding, rules, sink)?;
    }
    Ok(version)
}

/// RFC 8493 §2.1.1: exactly `BagIt-Version: M.N` then `Tag-File-Character-Encoding: ENC`.
fn check_declaration(bytes: &[u8], sink: &mut dyn Sink) -> Option<(Version, Encoding)> {
    let declaration = match parse_declaration(bytes) {
        Ok(declaration) => declaration,
        Err((kind, why)) => {
            sink.add(Problem::new("bagit.txt", kind, format!("bagit.txt {why}")));
            return None;
        }
    };
    let malformed = |why: &str| Problem::new("bagit.txt", Kind::Malformed, format!("bagit.txt {why}"));
    if declaration.has_bom {
        sink.add(malformed("starts with a byte-order mark (RFC 8493 forbids it)"));
    }
    let labels: Vec<&str> = declaration.tags.tags.iter().map(|(label, _)| label.as_str()).collect();
    if labels != ["BagIt-Version", "Tag-File-Character-Encoding"] {
        sink.add(malformed(&format!(
            "must hold exactly BagIt-Version then Tag-File-Character-Encoding, in that order; it holds {}",
            labels.join(", ")
        )));
    }
    let version_text = declaration.tags.get("BagIt-Version").unwrap_or_default();
    let well_formed = version_text.split_once('.').is_some_and(|(major, minor)| {
        [major, minor].iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if !well_formed {
        sink.add(malformed(&format!("BagIt-Version {version_text:?} is not MAJOR.MINOR")));
    }
    Some((declaration.version, declaration.encoding))
}

fn check_bag_info(
    root: &Path,
    info: &str,
    encoding: Encoding,
    rules: &StructureRules,
    sink: &mut dyn Sink,
) -> Result<(), Abort> {
    if fs::symlink_metadata(root.join(info)).is_err() {
        let why = format!("{info} is missing, and the fields {} are required", rules.required_bag_info.join(", "));
        sink.add(Problem::new(info, Kind::Missing, why));
        return Ok(());
    }
    let Some(bytes) = read_small(root, info, sink)? else { return Ok(()) };
    let tags = match encoding.decode(&bytes).and_then(|text| TagFile::parse(&text)) {
        Ok(tags) => tags,
        Err(why) => {
            sink.add(Problem::new(info, Kind::Malformed, format!("{info} {why}")));
            return Ok(());
        }
    };
    for field in &rules.required_bag_info {
        let why = match tags.get(field) {
            None => format!("required field {field} is missing"),
            Some("") => format!("required field {field} is empty"),
            Some(_) => continue,
        };
        let problem = Problem::new(info, Kind::MissingField, why);
        sink.add(problem.with_details(serde_json::json!({ "field": field })));
    }
    Ok(())
}

fn check_name(entry: &Entry, rules: &StructureRules, sink: &mut dyn Sink) {
    if let Some(charset) = &rules.payload_name_characters
        && let Some(bad) = charset.first_outside(entry.name())
    {
        let why = format!("name contains {bad:?}, which is not among the allowed characters {}", charset.as_str());
        sink.add(Problem::new(&entry.rel, Kind::Name, why));
    }
    let is_file = !entry.file_type.is_dir();
    if is_file
        && !rules.allowed_payload_names.is_empty()
        && !rules.allowed_payload_names.iter().any(|p| p.matches(&entry.rel))
    {
        let allowed: Vec<&str> = rules.allowed_payload_names.iter().map(Pattern::as_str).collect();
        let why = format!("name matches none of the allowed patterns {}", allowed.join(", "));
        sink.add(Problem::new(&entry.rel, Kind::Name, why));
    }
}

/// A symlink may point anywhere inside the batch; outside it (or nowhere) is a violation.
fn check_symlink(root: &Path, canonical_root: &Path, entry: &Entry, sink: &mut dyn Sink) {
    let target = fs::read_link(&entry.path).unwrap_or_default();
    let shown = target.display();
    match fs::canonicalize(&entry.path) {
        Ok(real) if real.starts_with(canonical_root) => {}
        Ok(real) => {
            let why = format!("is a symlink to {shown}, which resolves to {}, outside the batch", real.display());
            sink.add(Problem::new(&entry.rel, Kind::SymlinkEscape, why));
        }
        Err(_) if escapes_lexically(root, entry, &target) => {
            let why = format!("is a symlink to {shown}, outside the batch (and it does not exist)");
            sink.add(Problem::new(&entry.rel, Kind::SymlinkEscape, why));
        }
        Err(e) => {
            let why = format!("is a symlink to {shown}, which cannot be followed: {e}");
            sink.add(Problem::new(&entry.rel, Kind::BrokenSymlink, why));
        }
    }
}

/// For a dangling link: does its target text leave the batch?
fn escapes_lexically(root: &Path, entry: &Entry, target: &Path) -> bool {
    if target.is_absolute() {
        let Ok(canonical_root) = fs::canonicalize(root) else { return true };
        return !(target.starts_with(root) || target.starts_with(canonical_root));
    }
    let parent = entry.rel.rsplit_once('/').map_or("", |(parent, _)| parent);
    let joined: PathBuf = Path::new(parent).join(target);
    normalize_relative(&joined.to_string_lossy()).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_from_toml_with_defaults_and_refuse_typos() {
        let rules: StructureRules = serde_json::from_value(serde_json::json!({
            "required_files": ["data/*.xml"],
            "payload_name_characters": "A-Za-z0-9._-",
        }))
        .unwrap();
        assert!(rules.bagit && rules.no_empty_files && rules.no_escaping_symlinks);
        assert_eq!(rules.required_files[0].as_str(), "data/*.xml");
        let err = serde_json::from_value::<StructureRules>(serde_json::json!({ "no_empty_file": false })).unwrap_err();
        assert!(err.to_string().contains("no_empty_file"), "{err}");
        let err =
            serde_json::from_value::<StructureRules>(serde_json::json!({ "required_files": ["/abs"] })).unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[test]
    fn summary_names_the_rules() {
        let totals =
            StructureTotals { files: 3, directories: 1, rules: vec!["BagIt 1.0".into(), "no empty files".into()] };
        assert_eq!(totals.summary(), "checked 3 files and 1 directory: BagIt 1.0, no empty files");
    }
}
