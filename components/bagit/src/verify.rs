//! Checksum verification of a delivered batch: a BagIt bag against every payload and tag
//! manifest (with the verdict of the Library of Congress `bagit` tool's `--validate`), or a
//! plain `md5sum`-style manifest for deliveries that are not bags. Every file is read once,
//! through one fixed buffer, for all the algorithms that list it.
//!
//! Where bagit-python and RFC 8493 differ, the verdict follows bagit-python (the tool archives
//! check deliveries with): a payload file counts as listed if any payload manifest lists it;
//! lines it cannot parse are skipped (and counted in the summary); `%` in names it wrote
//! unencoded is resolved; NFC and NFD spellings of a name are the same file. Unlike
//! bagit-python, which stops at the first failing stage, every problem is reported. One
//! deliberate difference: a manifest that encodes `%` as `%25`, as RFC 8493 requires, is read
//! as the RFC says (bagit-python 1.9 does not decode `%25`: LibraryOfCongress/bagit-python#157),
//! falling back to bagit-python's reading only when the RFC's names no file.
//!
//! A plain manifest's reading is `verify/plain.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::json;

use crate::algorithm::{self, Algorithm, BUFFER_SIZE, Digests, RECOGNISED_UNSUPPORTED};
use crate::manifest;
use crate::paths::{RelativePath, bagit_python_decode, comparable, normalize_relative, percent_decode};
use crate::problem::{Abort, IoClass, Kind, Problem, Sink, classify, location_error};
use crate::tagfile::{Encoding, TagFile, Version, lines, parse_declaration};
use crate::walk::{self, Entry, is_dir, is_file, read_small};

mod plain;

/// `checksum-verifier`'s `[settings]`. Bags need none; they are recognised by `bagit.txt`.
///
/// ```toml
/// [settings]
/// plain_manifest = "MD5SUMS"   # for deliveries without bagit.txt
/// plain_algorithm = "md5"      # optional: inferred from each checksum's length
/// plain_allow_unlisted = false # files the plain manifest does not list are failures
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySettings {
    /// The `md5sum`/`sha256sum` output file to verify a non-bag delivery against, relative to
    /// the batch root. Without it, a delivery without `bagit.txt` fails as "not a bag".
    pub plain_manifest: Option<RelativePath>,
    /// The plain manifest's algorithm; unset, each line's is inferred from its length
    /// (32 hex digits md5, 40 sha1, 56 sha224, 64 sha256, 96 sha384, 128 sha512).
    pub plain_algorithm: Option<Algorithm>,
    /// Accept files the plain manifest does not list (by default each is an `extra` failure).
    pub plain_allow_unlisted: bool,
}

/// What a delivery was checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Against {
    Bag(Version),
    Plain(String),
    /// Not a readable bag nor a configured plain manifest: nothing could be checked.
    Nothing,
}

/// The work done, for the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Totals {
    pub against: Against,
    /// Files read and hashed.
    pub files: u64,
    pub bytes: u64,
    pub algorithms: BTreeSet<Algorithm>,
    /// Manifest lines skipped because they hold no `checksum path` pair.
    pub ignored_lines: usize,
    /// The manifests read, by file name (payload then tag manifests; a plain manifest's path).
    pub manifests: Vec<String>,
}

impl Totals {
    fn new(against: Against) -> Self {
        Totals { against, files: 0, bytes: 0, algorithms: BTreeSet::new(), ignored_lines: 0, manifests: Vec::new() }
    }

    /// One line for the report, e.g. `verified 1,234 files (5.6 GB) against md5+sha256 (BagIt
    /// 1.0)`; "checked" instead when `problems` were found (the runner adds their count and the
    /// first one to the line it prints).
    pub fn summary(&self, problems: usize) -> String {
        let algorithms: Vec<&str> = self.algorithms.iter().map(|a| a.name()).collect();
        let algorithms = if algorithms.is_empty() { "no checksums".to_owned() } else { algorithms.join("+") };
        let verb = if problems == 0 { "verified" } else { "checked" };
        let files = count(self.files, "file");
        let size = human_bytes(self.bytes);
        let mut line = match &self.against {
            Against::Bag(version) => format!("{verb} {files} ({size}) against {algorithms} (BagIt {version})"),
            Against::Plain(manifest) => format!("{verb} {files} ({size}) against {manifest} ({algorithms})"),
            Against::Nothing => "nothing verified".to_owned(),
        };
        if self.ignored_lines > 0 {
            let lines = count(self.ignored_lines as u64, "unparsable manifest line");
            line.push_str(&format!("; {lines} ignored, as bagit does"));
        }
        line
    }
}

/// Verifies the batch at `root`, reporting each problem to `sink`. `Err` only when the batch
/// cannot be checked at all: its location is missing or unreadable (permanent), or the storage
/// failed in a way worth retrying (transient), or the sink asked to stop.
pub fn verify(root: &Path, settings: &VerifySettings, sink: &mut dyn Sink) -> Result<Totals, Abort> {
    let metadata = fs::metadata(root).map_err(|e| location_error(root, &e))?;
    if !metadata.is_dir() {
        return Err(Abort::Location(format!("batch location {} is not a directory", root.display())));
    }
    let canonical_root = fs::canonicalize(root).map_err(|e| location_error(root, &e))?;
    let reader = Reader { root, canonical_root, buffer: vec![0; BUFFER_SIZE] };
    if is_file(&root.join("bagit.txt"))? {
        return reader.verify_bag(sink);
    }
    if let Some(manifest) = &settings.plain_manifest
        && is_file(&root.join(manifest.as_str()))?
    {
        return reader.verify_plain(manifest.as_str(), settings, sink);
    }
    let description = match &settings.plain_manifest {
        Some(manifest) => format!("not a BagIt bag (no bagit.txt), and the plain manifest {manifest} is missing too"),
        None => {
            "not a BagIt bag: there is no bagit.txt (configure `plain_manifest` for md5sum-style deliveries)".to_owned()
        }
    };
    sink.add(Problem::new("bagit.txt", Kind::Missing, description));
    Ok(Totals::new(Against::Nothing))
}

/// One expected checksum of a listed file.
#[derive(Debug, Clone)]
struct Expected {
    /// The algorithm's name as in the manifest's file name (it may be one we cannot compute).
    algorithm: String,
    checksum: String,
    manifest: String,
}

/// Files present, keyed by their comparable (NFC) name.
type OnDisk = HashMap<String, Entry>;

/// What the manifests are read against.
struct BagFacts {
    version: Version,
    encoding: Encoding,
    on_disk: OnDisk,
}

/// Manifest file names with their algorithm's name, e.g. (`manifest-md5.txt`, `md5`).
type ManifestFiles = Vec<(String, String)>;

struct Reader<'a> {
    root: &'a Path,
    canonical_root: PathBuf,
    buffer: Vec<u8>,
}

impl Reader<'_> {
    fn verify_bag(mut self, sink: &mut dyn Sink) -> Result<Totals, Abort> {
        let mut totals = Totals::new(Against::Nothing);
        let Some(bytes) = read_small(self.root, "bagit.txt", sink)? else { return Ok(totals) };
        let declaration = match parse_declaration(&bytes) {
            Ok(declaration) => declaration,
            Err((kind, why)) => {
                // bagit-python cannot open such a bag at all; neither can we.
                sink.add(Problem::new("bagit.txt", kind, format!("bagit.txt {why}")));
                return Ok(totals);
            }
        };
        let version = declaration.version;
        let encoding = declaration.encoding;
        totals.against = Against::Bag(version);
        if declaration.has_bom {
            sink.add(Problem::new(
                "bagit.txt",
                Kind::Malformed,
                "bagit.txt starts with a byte-order mark (RFC 8493 forbids it)",
            ));
        }

        let payload = self.payload(sink)?;
        let on_disk: OnDisk = payload.iter().map(|e| (comparable(&e.rel), e.clone())).collect();

        let (payload_manifests, tag_manifests) = self.manifest_files()?;
        if payload_manifests.is_empty() {
            let why = "the bag has no payload manifest (manifest-md5.txt, manifest-sha256.txt, ...)";
            sink.add(Problem::new("manifest-<algorithm>.txt", Kind::Missing, why));
        }
        let mut manifests = payload_manifests;
        if version.has_tag_manifests() {
            manifests.extend(tag_manifests);
        }
        totals.manifests = manifests.iter().map(|(file, _)| file.clone()).collect();
        let bag = BagFacts { version, encoding, on_disk };
        let mut entries: BTreeMap<String, Vec<Expected>> = BTreeMap::new();
        for (file, algorithm) in &manifests {
            totals.ignored_lines += self.read_manifest(file, algorithm, &bag, &mut entries, sink)?;
        }
        let on_disk = bag.on_disk;

        self.check_fetch(encoding, sink)?;
        self.check_completeness(&entries, &payload, &on_disk, sink)?;
        self.check_oxum(version, encoding, &payload, sink)?;

        self.hash_listed(&entries, &on_disk, &mut totals, sink)?;
        Ok(totals)
    }

    /// The files under `data/` (a missing `data/` is a problem, and the payload is empty).
    fn payload(&self, sink: &mut dyn Sink) -> Result<Vec<Entry>, Abort> {
        if is_dir(&self.root.join("data"))? {
            Ok(walk::walk(self.root, "data", sink)?.into_iter().filter(Entry::is_file_like).collect())
        } else {
            sink.add(Problem::new("data/", Kind::Missing, "the payload directory data/ is missing"));
            Ok(Vec::new())
        }
    }

    /// Hashes every listed file that exists (a missing one is reported already) and compares.
    fn hash_listed(
        &mut self,
        entries: &BTreeMap<String, Vec<Expected>>,
        on_disk: &OnDisk,
        totals: &mut Totals,
        sink: &mut dyn Sink,
    ) -> Result<(), Abort> {
        for (path, expected) in entries {
            let actual = if path.starts_with("data/") {
                match on_disk.get(&comparable(path)) {
                    Some(entry) => entry.path.clone(),
                    None => continue, // reported missing
                }
            } else {
                let actual = self.root.join(path);
                if !is_file(&actual)? {
                    continue; // reported missing
                }
                actual
            };
            self.hash_and_compare(path, &actual, expected, totals, sink)?;
        }
        Ok(())
    }

    /// `manifest-<alg>.txt` and `tagmanifest-<alg>.txt` files in the bag root, with `<alg>`,
    /// for every algorithm bagit-python recognises (others are just tag files).
    fn manifest_files(&self) -> Result<(ManifestFiles, ManifestFiles), Abort> {
        let listing = fs::read_dir(self.root).map_err(|e| location_error(self.root, &e))?;
        let (mut payload, mut tag) = (Vec::new(), Vec::new());
        for child in listing {
            let child = child.map_err(|e| location_error(self.root, &e))?;
            let name = child.file_name().to_string_lossy().into_owned();
            let (list, algorithm) = if let Some(alg) = name.strip_prefix("tagmanifest-") {
                (&mut tag, alg)
            } else if let Some(alg) = name.strip_prefix("manifest-") {
                (&mut payload, alg)
            } else {
                continue;
            };
            let Some(algorithm) = algorithm.strip_suffix(".txt") else { continue };
            let recognised = Algorithm::from_name(algorithm).is_some() || RECOGNISED_UNSUPPORTED.contains(&algorithm);
            if recognised && is_file(&child.path())? {
                let algorithm = algorithm.to_owned();
                list.push((name, algorithm));
            }
        }
        payload.sort();
        tag.sort();
        Ok((payload, tag))
    }

    /// Adds one manifest's lines to `entries`; returns how many lines it had to skip.
    fn read_manifest(
        &self,
        file: &str,
        algorithm: &str,
        bag: &BagFacts,
        entries: &mut BTreeMap<String, Vec<Expected>>,
        sink: &mut dyn Sink,
    ) -> Result<usize, Abort> {
        if Algorithm::from_name(algorithm).is_none() {
            let why = format!("{algorithm} checksums cannot be computed by this tool (it does md5, sha1, sha2)");
            sink.add(Problem::new(file, Kind::Unsupported, why));
        }
        let Some(bytes) = read_small(self.root, file, sink)? else { return Ok(0) };
        let text = match bag.encoding.decode(&bytes) {
            Ok(text) => text,
            Err(why) => {
                sink.add(Problem::new(file, Kind::Malformed, format!("{file} {why}")));
                return Ok(0);
            }
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let parsed = manifest::parse_bagit(text);
        for line in parsed.lines {
            let path = match self.resolve(&line.raw_path, &bag.on_disk) {
                Ok(path) => path,
                Err(why) => {
                    let details = json!({ "manifest": file, "line": line.number });
                    let problem = Problem::new(&line.raw_path, Kind::UnsafePath, format!("listed in {file} but {why}"));
                    sink.add(problem.with_details(details));
                    continue;
                }
            };
            let listed = entries.entry(path.clone()).or_default();
            match listed.iter().find(|e| e.algorithm == algorithm) {
                None => listed.push(Expected {
                    algorithm: algorithm.to_owned(),
                    checksum: line.checksum,
                    manifest: file.to_owned(),
                }),
                // bagit-python tolerates a repeated identical line before BagIt 1.0 only.
                Some(previous) if previous.checksum == line.checksum && bag.version < Version(1, 0) => {}
                Some(previous) => {
                    let listers = if previous.manifest == file {
                        format!("{file} lists it twice")
                    } else {
                        format!("{} and {file} both list it", previous.manifest)
                    };
                    let how = if previous.checksum == line.checksum { "" } else { ", with different checksums" };
                    let details = json!({
                        "manifest": file, "line": line.number,
                        "checksums": [previous.checksum, line.checksum],
                    });
                    let why = format!("{listers} for {algorithm}{how}");
                    sink.add(Problem::new(&path, Kind::Duplicate, why).with_details(details));
                }
            }
        }
        Ok(parsed.ignored.len())
    }

    /// The path a manifest line names: RFC 8493 percent-decoding, unless that names nothing and
    /// bagit-python's reading (which leaves `%25` alone) names a file that is there.
    fn resolve(&self, raw: &str, on_disk: &OnDisk) -> Result<String, String> {
        let decoded = percent_decode(raw);
        let path = normalize_relative(&decoded).map_err(|why| why.to_string())?;
        let python = bagit_python_decode(raw);
        if python != decoded
            && let Ok(alternative) = normalize_relative(&python)
            && !self.exists(&path, on_disk)
            && self.exists(&alternative, on_disk)
        {
            return Ok(alternative);
        }
        Ok(path)
    }

    fn exists(&self, path: &str, on_disk: &OnDisk) -> bool {
        if path.starts_with("data/") {
            on_disk.contains_key(&comparable(path))
        } else {
            fs::symlink_metadata(self.root.join(path)).is_ok()
        }
    }

    fn check_completeness(
        &self,
        entries: &BTreeMap<String, Vec<Expected>>,
        payload: &[Entry],
        on_disk: &OnDisk,
        sink: &mut dyn Sink,
    ) -> Result<(), Abort> {
        for (path, expected) in entries {
            let present = if path.starts_with("data/") {
                on_disk.contains_key(&comparable(path))
            } else {
                is_file(&self.root.join(path))?
            };
            if !present {
                let manifests: BTreeSet<&str> = expected.iter().map(|e| e.manifest.as_str()).collect();
                let why = format!("listed in {} but not in the bag", and_list(&manifests));
                sink.add(Problem::new(path, Kind::Missing, why).with_details(json!({ "manifests": manifests })));
            }
        }
        let listed: HashSet<String> =
            entries.keys().filter(|p| p.starts_with("data/")).map(|p| comparable(p)).collect();
        for file in payload {
            if !listed.contains(&comparable(&file.rel)) {
                sink.add(Problem::new(&file.rel, Kind::Extra, "in data/ but in no payload manifest"));
            }
        }
        Ok(())
    }

    /// `Payload-Oxum: <octets>.<files>` in bag-info.txt, when present, against `data/`.
    fn check_oxum(
        &self,
        version: Version,
        encoding: Encoding,
        payload: &[Entry],
        sink: &mut dyn Sink,
    ) -> Result<(), Abort> {
        let info = version.info_file();
        if !is_file(&self.root.join(info))? {
            return Ok(());
        }
        let Some(bytes) = read_small(self.root, info, sink)? else { return Ok(()) };
        let tags = match encoding.decode(&bytes).and_then(|text| TagFile::parse(&text)) {
            Ok(tags) => tags,
            Err(why) => {
                sink.add(Problem::new(info, Kind::Malformed, format!("{info} {why}")));
                return Ok(());
            }
        };
        let Some(oxum) = tags.get("Payload-Oxum") else { return Ok(()) };
        let digits =
            |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
        let parsed = oxum.split_once('.').and_then(|(octets, files)| Some((digits(octets)?, digits(files)?)));
        let Some((expected_bytes, expected_files)) = parsed else {
            let why = format!("Payload-Oxum {oxum:?} is not <octets>.<files>");
            sink.add(Problem::new(info, Kind::Malformed, why));
            return Ok(());
        };
        let found_files = payload.len() as u64;
        // Sizes as `os.stat` sees them: through symlinks (a dangling one is reported elsewhere).
        let found_bytes: u64 = payload.iter().map(|e| fs::metadata(&e.path).map(|m| m.len()).unwrap_or(0)).sum();
        if (found_bytes, found_files) != (expected_bytes, expected_files) {
            let why = format!(
                "Payload-Oxum {oxum} promises {} in {}; data/ holds {} in {}",
                count(expected_bytes, "byte"),
                count(expected_files, "file"),
                count(found_bytes, "byte"),
                count(found_files, "file"),
            );
            let details = json!({
                "expected": { "bytes": expected_bytes, "files": expected_files },
                "found": { "bytes": found_bytes, "files": found_files },
            });
            sink.add(Problem::new(info, Kind::PayloadOxum, why).with_details(details));
        }
        Ok(())
    }

    /// `fetch.txt` as bagit-python validates it: `URL LENGTH PATH` lines with a usable URL and
    /// a path inside the bag. Nothing is fetched; listed files that are absent are `missing`.
    fn check_fetch(&self, encoding: Encoding, sink: &mut dyn Sink) -> Result<(), Abort> {
        if !is_file(&self.root.join("fetch.txt"))? {
            return Ok(());
        }
        let Some(bytes) = read_small(self.root, "fetch.txt", sink)? else { return Ok(()) };
        let text = match encoding.decode(&bytes) {
            Ok(text) => text,
            Err(why) => {
                sink.add(Problem::new("fetch.txt", Kind::Malformed, format!("fetch.txt {why}")));
                return Ok(());
            }
        };
        for (index, line) in lines(&text).enumerate() {
            let number = index + 1;
            let mut fields = line.trim().splitn(3, char::is_whitespace);
            let (Some(url), Some(_length), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
                let why = format!("fetch.txt line {number} is not `URL LENGTH PATH`");
                sink.add(Problem::new("fetch.txt", Kind::Malformed, why));
                continue;
            };
            if !usable_url(url) {
                let why = format!("fetch.txt line {number} has a malformed URL {url:?}");
                sink.add(Problem::new("fetch.txt", Kind::Malformed, why));
            }
            let path = path.trim_start();
            if let Err(why) = normalize_relative(&percent_decode(path)) {
                let why = format!("fetch.txt line {number} names a path that {why}");
                sink.add(Problem::new(path, Kind::UnsafePath, why));
            }
        }
        Ok(())
    }

    /// Reads one listed file once for every algorithm that lists it and reports a mismatch.
    fn hash_and_compare(
        &mut self,
        path: &str,
        actual: &Path,
        expected: &[Expected],
        totals: &mut Totals,
        sink: &mut dyn Sink,
    ) -> Result<(), Abort> {
        if sink.cancelled() {
            return Err(Abort::Cancelled);
        }
        let mut algorithms: Vec<Algorithm> =
            expected.iter().filter_map(|e| Algorithm::from_name(&e.algorithm)).collect();
        algorithms.sort();
        algorithms.dedup();
        if algorithms.is_empty() {
            return Ok(());
        }
        let Some(digests) = self.hash(path, actual, &algorithms, sink)? else { return Ok(()) };
        totals.files += 1;
        totals.bytes += digests.bytes;
        totals.algorithms.extend(algorithms.iter().copied());
        let mismatches: Vec<(&Expected, &str)> = expected
            .iter()
            .filter_map(|e| {
                let found = digests.get(Algorithm::from_name(&e.algorithm)?)?;
                (!e.checksum.eq_ignore_ascii_case(found)).then_some((e, found))
            })
            .collect();
        if mismatches.is_empty() {
            return Ok(());
        }
        let description = match mismatches.as_slice() {
            [(e, found)] => {
                format!("{} checksum differs: {} has {}, the file has {found}", e.algorithm, e.manifest, e.checksum)
            }
            many => {
                let names: BTreeSet<&str> = many.iter().map(|(e, _)| e.algorithm.as_str()).collect();
                let files: BTreeSet<&str> = many.iter().map(|(e, _)| e.manifest.as_str()).collect();
                format!("{} checksums differ from {}", and_list(&names), and_list(&files))
            }
        };
        let details: Vec<_> = mismatches
            .iter()
            .map(|(e, found)| {
                json!({ "algorithm": e.algorithm, "manifest": e.manifest, "expected": e.checksum, "found": found })
            })
            .collect();
        sink.add(Problem::new(path, Kind::Mismatch, description).with_details(json!({ "mismatches": details })));
        Ok(())
    }

    /// The digests of one file, or `None` after reporting why it cannot be read. Refuses a file
    /// that (through symlinks) lies outside the batch, as bagit-python refuses such paths.
    fn hash(
        &mut self,
        path: &str,
        actual: &Path,
        algorithms: &[Algorithm],
        sink: &mut dyn Sink,
    ) -> Result<Option<Digests>, Abort> {
        let io_problem = |e: std::io::Error, sink: &mut dyn Sink| -> Result<Option<Digests>, Abort> {
            let (kind, why) = match classify(&e) {
                IoClass::Transient => {
                    return Err(Abort::Transient(format!("{} is unavailable: {e}", actual.display())));
                }
                IoClass::NotFound if fs::symlink_metadata(actual).is_ok() => {
                    (Kind::Missing, "is a symlink to a file that does not exist".to_owned())
                }
                IoClass::NotFound => (Kind::Missing, "disappeared while being verified".to_owned()),
                IoClass::Denied | IoClass::Other => (Kind::Unreadable, format!("cannot be read: {e}")),
            };
            sink.add(Problem::new(path, kind, why));
            Ok(None)
        };
        let real = match fs::canonicalize(actual) {
            Ok(real) => real,
            Err(e) => return io_problem(e, sink),
        };
        if !real.starts_with(&self.canonical_root) {
            let why = format!("is a symlink to {}, outside the batch", real.display());
            sink.add(Problem::new(path, Kind::UnsafePath, why));
            return Ok(None);
        }
        match fs::metadata(&real) {
            Ok(metadata) if metadata.is_file() => {}
            Ok(metadata) => {
                let what = if metadata.is_dir() { "a directory" } else { "not a regular file" };
                sink.add(Problem::new(path, Kind::NotAFile, format!("is {what}, so it has no checksum")));
                return Ok(None);
            }
            Err(e) => return io_problem(e, sink),
        }
        let mut file = match File::open(&real) {
            Ok(file) => file,
            Err(e) => return io_problem(e, sink),
        };
        let cancelled = || sink.cancelled();
        match algorithm::hash_file(&mut file, algorithms, &mut self.buffer, &cancelled) {
            Ok(Some(digests)) => Ok(Some(digests)),
            Ok(None) => Err(Abort::Cancelled),
            Err(e) => io_problem(e, sink),
        }
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &BTreeSet<&str>) -> String {
    let items: Vec<&str> = items.iter().copied().collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// What Python's `urlparse` accepts in bagit-python's check: a scheme and a host, or `file:`.
fn usable_url(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once(':') else { return false };
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return false;
    }
    if scheme.eq_ignore_ascii_case("file") {
        return true;
    }
    rest.strip_prefix("//").is_some_and(|authority| !authority.split(['/', '?', '#']).next().unwrap_or("").is_empty())
}

/// `1,234 files`, `1 file`, `2 directories`.
pub fn count(n: u64, noun: &str) -> String {
    let digits = n.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match noun.strip_suffix('y') {
        _ if n == 1 => format!("{grouped} {noun}"),
        Some(stem) => format!("{grouped} {stem}ies"),
        None => format!("{grouped} {noun}s"),
    }
}

/// Decimal units, as disks and networks are sold: `5.6 GB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1000.0 {
            break;
        }
        value /= 1000.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
