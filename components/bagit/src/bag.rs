//! Reading a bag in a component's own work: its declaration, its metadata (`bag-info.txt`, as
//! a typed [`BagInfo`]) and its manifests, without verifying anything (that is `verify` and
//! `structure`). Errors are `io::Error`s, so a component's `.with_path(&path)?` classifies
//! them: no `bagit.txt` is `NotFound`, an unreadable declaration or tag file `InvalidData`
//! (both permanent), a share gone away transient.
//!
//! ```no_run
//! use autocomp_bagit::{Algorithm, Bag};
//!
//! let bag = Bag::open("/deliveries/B400022028241-RT1")?;
//! let info = bag.info()?;
//! println!("{:?} from {:?}", info.external_identifier, info.source_organization);
//! for entry in bag.manifest(Algorithm::Sha256)?.unwrap_or_default() {
//!     println!("{}  {}", entry.checksum, entry.path);
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Algorithm;
use crate::manifest;
use crate::paths::percent_decode;
use crate::tagfile::{Declaration, Encoding, TagFile, Version, parse_declaration};

/// A bag whose `bagit.txt` could be read.
#[derive(Debug, Clone)]
pub struct Bag {
    root: PathBuf,
    declaration: Declaration,
}

/// One line of a payload or tag manifest: the path as the bag names it (percent-decoded as
/// RFC 8493 says, relative to the bag root, e.g. `data/page-0001.tif`) and its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub path: String,
    pub checksum: String,
}

impl Bag {
    /// Opens the bag at `root` by reading its `bagit.txt`: `NotFound` when there is none (not
    /// a bag), `InvalidData` when it is malformed or declares a version or encoding this
    /// crate does not read.
    pub fn open(root: impl AsRef<Path>) -> io::Result<Bag> {
        let root = root.as_ref().to_path_buf();
        let bytes = fs::read(root.join("bagit.txt"))?;
        let declaration = parse_declaration(&bytes).map_err(|(_, why)| invalid(format!("bagit.txt {why}")))?;
        Ok(Bag { root, declaration })
    }

    /// Where the bag is.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Its `BagIt-Version`.
    pub fn version(&self) -> Version {
        self.declaration.version
    }

    /// Its `Tag-File-Character-Encoding`.
    pub fn encoding(&self) -> Encoding {
        self.declaration.encoding
    }

    /// Every label and value of `bag-info.txt` (`package-info.txt` before BagIt 0.96), in
    /// order, repeats kept; empty when the bag has none (it is optional).
    pub fn tags(&self) -> io::Result<TagFile> {
        let info = self.version().info_file();
        match self.read_text(info) {
            Ok(text) => TagFile::parse(&text).map_err(|why| invalid(format!("{info} {why}"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(TagFile::default()),
            Err(e) => Err(e),
        }
    }

    /// The bag's declared metadata, typed: see [`BagInfo`].
    pub fn info(&self) -> io::Result<BagInfo> {
        self.tags().map(|tags| BagInfo::from_tags(&tags))
    }

    /// The algorithms of its payload manifests (`manifest-<algorithm>.txt`) this crate
    /// computes, in [`Algorithm`] order.
    pub fn payload_manifests(&self) -> io::Result<Vec<Algorithm>> {
        let mut found = Vec::new();
        for child in fs::read_dir(&self.root)? {
            let name = child?.file_name();
            let algorithm = name.to_str().and_then(|n| n.strip_prefix("manifest-")?.strip_suffix(".txt"));
            if let Some(algorithm) = algorithm.and_then(Algorithm::from_name) {
                found.push(algorithm);
            }
        }
        found.sort();
        Ok(found)
    }

    /// The lines of `manifest-<algorithm>.txt`, or `None` when the bag has no such manifest.
    /// Lines without a checksum and a path are skipped, as bagit-python skips them.
    pub fn manifest(&self, algorithm: Algorithm) -> io::Result<Option<Vec<ManifestEntry>>> {
        self.entries(&format!("manifest-{}.txt", algorithm.name()))
    }

    /// The lines of `tagmanifest-<algorithm>.txt`, or `None` when the bag has none.
    pub fn tag_manifest(&self, algorithm: Algorithm) -> io::Result<Option<Vec<ManifestEntry>>> {
        self.entries(&format!("tagmanifest-{}.txt", algorithm.name()))
    }

    fn entries(&self, file: &str) -> io::Result<Option<Vec<ManifestEntry>>> {
        let text = match self.read_text(file) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let entry = |line: manifest::Line| ManifestEntry {
            path: percent_decode(&line.raw_path).into_owned(),
            checksum: line.checksum,
        };
        Ok(Some(manifest::parse_bagit(text).lines.into_iter().map(entry).collect()))
    }

    fn read_text(&self, file: &str) -> io::Result<String> {
        let bytes = fs::read(self.root.join(file))?;
        self.encoding().decode(&bytes).map_err(|why| invalid(format!("{file} {why}")))
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A bag's declared metadata (`bag-info.txt`): the reserved fields of RFC 8493 §2.2.2 a
/// pipeline reads, typed, and every other label in `other`. A value is the label's first
/// (as bagit-python's and [`TagFile::get`]); an absent label is `None` and left out of the
/// JSON. This is also what `structure-checker` records in its result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct BagInfo {
    /// `External-Identifier`: the sender's identifier of the delivery (e.g. the batch id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_identifier: Option<String>,
    /// `Bagging-Date`: when the bag was made, `YYYY-MM-DD`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bagging_date: Option<String>,
    /// `Source-Organization`: who sent it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_organization: Option<String>,
    /// `Organization-Address`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub organization_address: Option<String>,
    /// `Contact-Name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contact_name: Option<String>,
    /// `Contact-Phone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contact_phone: Option<String>,
    /// `Contact-Email`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contact_email: Option<String>,
    /// `External-Description`: what the delivery is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_description: Option<String>,
    /// `Payload-Oxum`: `<octets>.<files>` of `data/` (checked by `checksum-verifier`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_oxum: Option<String>,
    /// `Bag-Size`: a human-readable size, e.g. `260 MB`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bag_size: Option<String>,
    /// `Bag-Group-Identifier`: the group this bag is part of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bag_group_identifier: Option<String>,
    /// `Bag-Count`: e.g. `1 of 3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bag_count: Option<String>,
    /// `Internal-Sender-Identifier`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_sender_identifier: Option<String>,
    /// `Internal-Sender-Description`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_sender_description: Option<String>,
    /// Every other label, as written in the file, with its first value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, String>,
}

impl BagInfo {
    /// The fields of a parsed tag file (labels compared as written, as bagit-python does).
    pub fn from_tags(tags: &TagFile) -> BagInfo {
        let mut info = BagInfo::default();
        for (label, value) in &tags.tags {
            let slot = match label.as_str() {
                "External-Identifier" => &mut info.external_identifier,
                "Bagging-Date" => &mut info.bagging_date,
                "Source-Organization" => &mut info.source_organization,
                "Organization-Address" => &mut info.organization_address,
                "Contact-Name" => &mut info.contact_name,
                "Contact-Phone" => &mut info.contact_phone,
                "Contact-Email" => &mut info.contact_email,
                "External-Description" => &mut info.external_description,
                "Payload-Oxum" => &mut info.payload_oxum,
                "Bag-Size" => &mut info.bag_size,
                "Bag-Group-Identifier" => &mut info.bag_group_identifier,
                "Bag-Count" => &mut info.bag_count,
                "Internal-Sender-Identifier" => &mut info.internal_sender_identifier,
                "Internal-Sender-Description" => &mut info.internal_sender_description,
                _ => {
                    info.other.entry(label.clone()).or_insert_with(|| value.clone());
                    continue;
                }
            };
            slot.get_or_insert_with(|| value.clone());
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = root.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_bag_reads_its_metadata_and_manifests() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("bagit.txt", "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n"),
                (
                    "bag-info.txt",
                    "External-Identifier: B1-RT1\nBagging-Date: 2026-11-27\nSource-Organization: Royal\n  Library\n\
                     Scanner: Zeutschel\nScanner: second\nContact-Name: A\nContact-Name: B\n",
                ),
                ("manifest-md5.txt", "ba75e603168423a985abe2d8c2e3c4d5  data/100%25 page.tif\nnot-a-line\n"),
                ("manifest-sha3_256.txt", "x  data/a\n"),
                ("data/100% page.tif", "tiff"),
            ],
        );
        let bag = Bag::open(dir.path()).unwrap();
        assert_eq!((bag.version(), bag.encoding()), (Version(1, 0), Encoding::Utf8));
        let info = bag.info().unwrap();
        assert_eq!(info.external_identifier.as_deref(), Some("B1-RT1"));
        assert_eq!(info.bagging_date.as_deref(), Some("2026-11-27"));
        assert_eq!(info.source_organization.as_deref(), Some("Royal  Library"));
        assert_eq!(info.contact_name.as_deref(), Some("A"), "the first of repeated labels");
        assert_eq!(info.other, BTreeMap::from([("Scanner".to_owned(), "Zeutschel".to_owned())]));
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["external_identifier"], "B1-RT1");
        assert!(json.get("payload_oxum").is_none(), "absent fields are left out: {json}");
        assert_eq!(serde_json::from_value::<BagInfo>(json).unwrap(), info);

        assert_eq!(bag.payload_manifests().unwrap(), [Algorithm::Md5]);
        let md5 = bag.manifest(Algorithm::Md5).unwrap().unwrap();
        assert_eq!(
            md5,
            [ManifestEntry { path: "data/100% page.tif".into(), checksum: "ba75e603168423a985abe2d8c2e3c4d5".into() }]
        );
        assert_eq!(bag.manifest(Algorithm::Sha256).unwrap(), None);
        assert_eq!(bag.tag_manifest(Algorithm::Sha256).unwrap(), None);
    }

    #[test]
    fn what_is_not_a_bag_or_not_readable_says_so_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Bag::open(dir.path()).unwrap_err().kind(), io::ErrorKind::NotFound);
        write(dir.path(), &[("bagit.txt", "BagIt-Version: 1.0\n")]);
        let error = Bag::open(dir.path()).unwrap_err();
        assert!(error.kind() == io::ErrorKind::InvalidData && error.to_string().contains("bagit.txt"), "{error}");
        write(dir.path(), &[("bagit.txt", "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")]);
        let bag = Bag::open(dir.path()).unwrap();
        assert_eq!(bag.info().unwrap(), BagInfo::default(), "bag-info.txt is optional");
        write(dir.path(), &[("bag-info.txt", "no colon\n")]);
        let error = bag.info().unwrap_err();
        assert!(error.kind() == io::ErrorKind::InvalidData && error.to_string().contains("bag-info.txt"), "{error}");
    }
}
