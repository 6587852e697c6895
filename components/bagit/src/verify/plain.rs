//! Verification against a plain `md5sum`-style manifest, for deliveries that are not bags:
//! its lines read into the expected checksums (the algorithm configured or inferred from a
//! checksum's length), then every listed file hashed and every unlisted one reported unless
//! allowed. Apart from the bag's verification, with which it shares only the hashing.

use std::collections::{BTreeMap, HashSet};

use serde_json::json;

use super::{Against, Expected, OnDisk, Reader, Totals, VerifySettings};
use crate::algorithm::Algorithm;
use crate::manifest;
use crate::paths::{comparable, normalize_relative};
use crate::problem::{Abort, Kind, Problem, Sink};
use crate::walk::{self, Entry, read_small};

impl Reader<'_> {
    pub(super) fn verify_plain(
        mut self,
        manifest: &str,
        settings: &VerifySettings,
        sink: &mut dyn Sink,
    ) -> Result<Totals, Abort> {
        let mut totals = Totals::new(Against::Plain(manifest.to_owned()));
        totals.manifests.push(manifest.to_owned());
        let Some(bytes) = read_small(self.root, manifest, sink)? else { return Ok(totals) };
        let entries = plain_entries(manifest, &bytes, settings, sink);

        let files: Vec<Entry> = walk::walk(self.root, "", sink)?.into_iter().filter(Entry::is_file_like).collect();
        let on_disk: OnDisk = files.iter().map(|e| (comparable(&e.rel), e.clone())).collect();
        for path in entries.keys() {
            if !on_disk.contains_key(&comparable(path)) {
                sink.add(Problem::new(path, Kind::Missing, format!("listed in {manifest} but not in the batch")));
            }
        }
        if !settings.plain_allow_unlisted {
            let listed: HashSet<String> = entries.keys().map(|p| comparable(p)).collect();
            for file in &files {
                if file.rel != manifest && !listed.contains(&comparable(&file.rel)) {
                    sink.add(Problem::new(
                        &file.rel,
                        Kind::Extra,
                        format!("in the batch but not listed in {manifest}"),
                    ));
                }
            }
        }
        for (path, expected) in &entries {
            if let Some(entry) = on_disk.get(&comparable(path)) {
                let actual = entry.path.clone();
                self.hash_and_compare(path, &actual, expected, &mut totals, sink)?;
            }
        }
        Ok(totals)
    }
}

/// The entries of a plain manifest: each listed path with the checksums it is listed with.
/// A malformed line, an unsafe path or a path listed twice with different checksums is a
/// problem, and the line is left out.
fn plain_entries(
    manifest: &str,
    bytes: &[u8],
    settings: &VerifySettings,
    sink: &mut dyn Sink,
) -> BTreeMap<String, Vec<Expected>> {
    let mut entries: BTreeMap<String, Vec<Expected>> = BTreeMap::new();
    let algorithm_name = manifest.rsplit('/').next().unwrap_or(manifest);
    for (index, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let number = index + 1;
        let malformed = |why: String| {
            Problem::new(manifest, Kind::Malformed, format!("{manifest} line {number} {why}"))
                .with_details(json!({ "line": number }))
        };
        let Ok(line) = std::str::from_utf8(line) else {
            sink.add(malformed("is not UTF-8".into()));
            continue;
        };
        let parsed = match manifest::parse_plain_line(line) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => continue,
            Err(why) => {
                sink.add(malformed(why));
                continue;
            }
        };
        let length = parsed.checksum.len();
        let algorithm = match plain_algorithm(settings.plain_algorithm, length) {
            Ok(algorithm) => algorithm,
            Err(why) => {
                sink.add(malformed(why));
                continue;
            }
        };
        let path = match normalize_relative(&parsed.path) {
            Ok(path) => path,
            Err(why) => {
                let why = format!("listed in {manifest} but {why}");
                sink.add(Problem::new(&parsed.path, Kind::UnsafePath, why).with_details(json!({ "line": number })));
                continue;
            }
        };
        let listed = entries.entry(path.clone()).or_default();
        match listed.iter().find(|e| e.algorithm == algorithm.name()) {
            None => listed.push(Expected {
                algorithm: algorithm.name().to_owned(),
                checksum: parsed.checksum,
                manifest: algorithm_name.to_owned(),
            }),
            Some(previous) if previous.checksum.eq_ignore_ascii_case(&parsed.checksum) => {}
            Some(_) => {
                let why = format!("{manifest} lists it twice with different checksums (line {number})");
                sink.add(Problem::new(&path, Kind::Duplicate, why));
            }
        }
    }
    entries
}

/// The algorithm of a plain manifest's checksum of `length` hex digits: the configured one
/// if its digests are that long, else the one whose are; why not, if neither.
fn plain_algorithm(configured: Option<Algorithm>, length: usize) -> Result<Algorithm, String> {
    match configured {
        Some(algorithm) if algorithm.hex_len() == length => Ok(algorithm),
        Some(algorithm) => {
            Err(format!("has a checksum of {length} hex digits; {algorithm} has {}", algorithm.hex_len()))
        }
        None => Algorithm::from_hex_len(length)
            .ok_or_else(|| format!("has a checksum of {length} hex digits, which matches no algorithm")),
    }
}
