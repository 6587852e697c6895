//! `checksum-verifier`: verifies a delivered batch's checksums and records `Checksums_Verified`.
//! A BagIt bag is checked against all its manifests and tag manifests (agreeing with the Library
//! of Congress `bagit --validate`); other deliveries against a configured `md5sum`-style file.

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

    fn work(&self, _batch: &Batch, settings: &VerifySettings, context: &mut WorkContext) -> Result<(), WorkError> {
        let totals = check_location(context, |root, sink| verify::verify(root, settings, sink))?;
        let summary = totals.summary(context.failures_so_far());
        context.set_summary(summary);
        Ok(())
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

        std::fs::write(dir.path().join("scan.tif"), "TIFF").unwrap();
        let run = run_work_on(&ChecksumVerifier, &settings("plain_manifest = \"MD5SUMS\""), dir.path());
        assert!(!run.succeeded() && !run.is_transient());
        assert_eq!(
            (run.report.failures[0].reference.as_str(), run.report.failures[0].kind.as_str()),
            ("scan.tif", "mismatch")
        );
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
