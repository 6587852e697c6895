//! The structured results the two BagIt components record (`WorkContext::set_result`), for
//! the steps after them to read typed: `batch.result::<ChecksumsVerified>("Checksums_Verified")`
//! and `batch.result::<StructureChecked>("Structure_Checked")`. They live here, not in the
//! component binaries, so that a later step written in Rust depends on this crate (which it
//! likely wants anyway, to read the bag) rather than copying them. They derive `JsonSchema`:
//! the components publish `autocomp_framework::result_schema_of::<T>()` in the registry, and
//! a reader declares `reads_result::<T>(event type)`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bag::BagInfo;
use crate::verify::{Against, Totals};

/// `checksum-verifier`'s result (`Checksums_Verified`): what was verified, and how much.
///
/// ```json
/// {"bagit_version": "1.0", "manifests": ["manifest-md5.txt", "manifest-sha256.txt",
///  "tagmanifest-sha256.txt"], "algorithms": ["md5", "sha256"], "files": 7, "bytes": 41233}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChecksumsVerified {
    /// The bag's `BagIt-Version` (e.g. `1.0`); absent for a plain delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bagit_version: Option<String>,
    /// The `md5sum`-style manifest a delivery that is not a bag was verified against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_manifest: Option<String>,
    /// The manifests read: payload manifests, then tag manifests (BagIt 0.97 on).
    pub manifests: Vec<String>,
    /// The algorithms computed (BagIt names: `md5`, `sha1`, `sha256`, `sha512`...).
    pub algorithms: Vec<String>,
    /// Files read and hashed (payload and tag files).
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Manifest lines skipped because they hold no `checksum path` pair (as bagit does).
    #[serde(default)]
    pub ignored_lines: u64,
}

impl From<&Totals> for ChecksumsVerified {
    fn from(totals: &Totals) -> Self {
        let (bagit_version, plain_manifest) = match &totals.against {
            Against::Bag(version) => (Some(version.to_string()), None),
            Against::Plain(manifest) => (None, Some(manifest.clone())),
            Against::Nothing => (None, None),
        };
        ChecksumsVerified {
            bagit_version,
            plain_manifest,
            manifests: totals.manifests.clone(),
            algorithms: totals.algorithms.iter().map(|a| a.name().to_owned()).collect(),
            files: totals.files,
            bytes: totals.bytes,
            ignored_lines: totals.ignored_lines as u64,
        }
    }
}

/// `structure-checker`'s result (`Structure_Checked`): the bag's declared metadata, for the
/// steps that file, index or route the delivery by it, and what was looked at.
///
/// ```json
/// {"bagit_version": "1.0", "bag_info": {"external_identifier": "B400022028241-RT1",
///  "bagging_date": "2026-11-27", "source_organization": "autocomp demo",
///  "payload_oxum": "41233.4"}, "files": 9, "directories": 2}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StructureChecked {
    /// The bag's `BagIt-Version`, when its `bagit.txt` could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bagit_version: Option<String>,
    /// Its `bag-info.txt`, when the delivery is a readable bag (an empty one when the bag has
    /// no `bag-info.txt`); absent for a delivery that is not a bag or whose metadata cannot
    /// be read (the report's failures say why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bag_info: Option<BagInfo>,
    /// Files in the delivery (symlinks included), tag files too.
    pub files: u64,
    /// Directories in it.
    pub directories: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::tagfile::Version;

    #[test]
    fn totals_become_the_checksum_result() {
        let mut totals = Totals {
            against: Against::Bag(Version(1, 0)),
            files: 3,
            bytes: 1200,
            algorithms: [Algorithm::Sha256, Algorithm::Md5].into(),
            ignored_lines: 0,
            manifests: vec!["manifest-md5.txt".into(), "manifest-sha256.txt".into()],
        };
        let result = ChecksumsVerified::from(&totals);
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            serde_json::json!({
                "bagit_version": "1.0", "manifests": ["manifest-md5.txt", "manifest-sha256.txt"],
                "algorithms": ["md5", "sha256"], "files": 3, "bytes": 1200, "ignored_lines": 0,
            })
        );
        totals.against = Against::Plain("MD5SUMS".into());
        let plain = ChecksumsVerified::from(&totals);
        assert_eq!((plain.bagit_version, plain.plain_manifest.as_deref()), (None, Some("MD5SUMS")));
    }

    #[test]
    fn the_schemas_name_the_fields_a_reader_relies_on() {
        let schema = serde_json::to_value(schemars::schema_for!(ChecksumsVerified)).unwrap();
        let required = schema["required"].as_array().unwrap();
        for field in ["algorithms", "files", "bytes", "manifests"] {
            assert!(required.contains(&field.into()), "{field}: {schema:#}");
        }
        let schema = serde_json::to_value(schemars::schema_for!(StructureChecked)).unwrap();
        assert!(schema.to_string().contains("external_identifier"), "{schema:#}");
    }
}
