//! `checksum-verifier`: verifies a delivered batch's checksums and records `Checksums_Verified`.
//! A BagIt bag is checked against all its manifests and tag manifests (agreeing with the Library
//! of Congress `bagit --validate`); other deliveries against a configured `md5sum`-style file.
//! Its result is an `autocomp_bagit::ChecksumsVerified`: the manifests, algorithms, files and
//! bytes verified.

use autocomp_bagit::ChecksumsVerified;
use autocomp_bagit::report::check_location;
use autocomp_bagit::verify::{self, VerifySettings};

use autocomp_framework::prelude::*;

struct ChecksumVerifier;

const EVENT_TYPE: &str = "Checksums_Verified";

impl Component for ChecksumVerifier {
    type Settings = VerifySettings;

    fn name(&self) -> &str {
        "checksum-verifier"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn event_type(&self) -> &str {
        EVENT_TYPE
    }
    fn trigger(&self) -> Trigger {
        Trigger::builder().requires("Data_Received").blocked_by(EVENT_TYPE).build()
    }
    fn result_schema(&self) -> Option<Value> {
        Some(autocomp_framework::result_schema_of::<ChecksumsVerified>())
    }

    fn work(&self, _batch: &Batch, settings: &VerifySettings, context: &mut WorkContext) -> Result<(), WorkError> {
        let totals = check_location(context, |root, sink| verify::verify(root, settings, sink))?;
        let summary = totals.summary(context.failures_so_far());
        // A line of what it did, kept as the run's output (the operator's `autocomp logs`).
        autocomp_framework::tracing::info!("{summary}");
        context.set_summary(summary);
        context.set_result(&ChecksumsVerified::from(&totals))
    }
}

fn main() -> std::process::ExitCode {
    autocomp_framework::main(ChecksumVerifier)
}

#[cfg(test)]
mod tests {
    use autocomp_framework::testing::{TestBatch, run_work_on, settings};

    use super::*;

    #[test]
    fn a_received_batch_is_ready_once() {
        let received = TestBatch::new("B1").succeeded("Data_Received");
        assert!(ChecksumVerifier.trigger().matches(&received.clone().build()));
        assert!(!ChecksumVerifier.trigger().matches(&received.failed(EVENT_TYPE, false).build()));
    }

    #[test]
    fn a_plain_delivery_verifies_against_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("scan.tif"), "tiff").unwrap();
        std::fs::write(dir.path().join("MD5SUMS"), "ba75e603168423a985abe2d8c2e3c4d5  scan.tif\n").unwrap();
        let run = run_work_on(&ChecksumVerifier, &settings("plain_manifest = \"MD5SUMS\""), dir.path());
        assert!(run.succeeded(), "{:?}", run.report);
        assert_eq!(run.report.summary, "verified 1 file (4 B) against MD5SUMS (md5)");
        let result = run.result::<ChecksumsVerified>().expect("a result");
        assert_eq!((result.plain_manifest.as_deref(), result.bagit_version), (Some("MD5SUMS"), None));
        assert_eq!((result.algorithms, result.files, result.bytes), (vec!["md5".to_owned()], 1, 4));

        std::fs::write(dir.path().join("scan.tif"), "TIFF").unwrap();
        let run = run_work_on(&ChecksumVerifier, &settings("plain_manifest = \"MD5SUMS\""), dir.path());
        assert!(!run.succeeded() && !run.is_transient());
        assert_eq!(
            (run.report.failures[0].reference.as_str(), run.report.failures[0].kind.as_str()),
            ("scan.tif", "mismatch")
        );
    }

    #[test]
    fn a_bag_records_its_algorithms_files_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("data")).unwrap();
        std::fs::write(root.join("data/scan.tif"), "tiff").unwrap();
        std::fs::write(root.join("bagit.txt"), "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n").unwrap();
        std::fs::write(root.join("manifest-md5.txt"), "ba75e603168423a985abe2d8c2e3c4d5  data/scan.tif\n").unwrap();
        let run = run_work_on(&ChecksumVerifier, &settings(""), root);
        assert!(run.succeeded(), "{:?}", run.report);
        let expected = ChecksumsVerified {
            bagit_version: Some("1.0".into()),
            manifests: vec!["manifest-md5.txt".into()],
            algorithms: vec!["md5".into()],
            files: 1,
            bytes: 4,
            ..Default::default()
        };
        assert_eq!(run.result::<ChecksumsVerified>(), Some(expected.clone()));
        // A later step reads it typed from the batch's event.
        let later = TestBatch::new("B1").with_result(EVENT_TYPE, run.report.result.as_ref().unwrap()).build();
        assert_eq!(later.result::<ChecksumsVerified>(EVENT_TYPE).unwrap(), Some(expected));
        let schema = ChecksumVerifier.result_schema().expect("a published schema");
        assert!(schema["properties"]["algorithms"].is_object(), "{schema:#}");
    }

    #[test]
    fn a_missing_location_is_a_permanent_failure_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("never-delivered");
        let run = run_work_on(&ChecksumVerifier, &settings(""), &missing);
        assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
        let summary = &run.report.summary;
        assert!(summary.contains(&*missing.to_string_lossy()) && summary.contains("does not exist"), "{summary}");
    }
}
