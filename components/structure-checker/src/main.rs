//! `structure-checker`: checks a delivered batch's layout and records `Structure_Checked`: the
//! BagIt skeleton (declaration, `data/`, a payload manifest, required bag-info fields) and the
//! configured rules (required files, payload names, no empty files, no symlinks leaving it).
//! Its result is an `autocomp_bagit::StructureChecked`: the bag's declared metadata
//! (`bag-info.txt`, typed) for the steps that file or route the delivery by it.

use autocomp_bagit::report::check_location;
use autocomp_bagit::structure::{self, StructureRules};
use autocomp_bagit::{Bag, StructureChecked};

use autocomp_framework::prelude::*;

struct StructureChecker;

const EVENT_TYPE: &str = "Structure_Checked";

impl Component for StructureChecker {
    type Settings = StructureRules;

    fn name(&self) -> &str {
        "structure-checker"
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
        Some(autocomp_framework::result_schema_of::<StructureChecked>())
    }

    fn work(&self, _batch: &Batch, rules: &StructureRules, context: &mut WorkContext) -> Result<(), WorkError> {
        let totals = check_location(context, |root, sink| structure::check(root, rules, sink))?;
        let summary = totals.summary();
        // A line of what it did, kept as the run's output (the operator's `autocomp logs`).
        autocomp_framework::tracing::info!("{summary}");
        context.set_summary(summary);
        let mut result =
            StructureChecked { files: totals.files, directories: totals.directories, ..Default::default() };
        // The metadata as declared; a bag that cannot be read has already failed the check above.
        if rules.bagit
            && let Ok(bag) = Bag::open(context.location()?)
        {
            result.bagit_version = Some(bag.version().to_string());
            result.bag_info = bag.info().ok();
        }
        context.set_result(&result)
    }
}

fn main() -> std::process::ExitCode {
    autocomp_framework::main(StructureChecker)
}

#[cfg(test)]
mod tests {
    use autocomp_framework::testing::{TestBatch, run_work_on, settings};

    use super::*;

    #[test]
    fn a_received_batch_is_ready_once() {
        let received = TestBatch::new("B1").succeeded("Data_Received");
        assert!(StructureChecker.trigger().matches(&received.clone().build()));
        assert!(!StructureChecker.trigger().matches(&received.succeeded(EVENT_TYPE).build()));
    }

    #[test]
    fn each_violation_is_one_failure_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("page-1.tif"), "II*\0").unwrap();
        std::fs::write(dir.path().join("empty.tif"), "").unwrap();
        let rules = settings("bagit = false\nallowed_payload_names = [\"*.tif\"]");
        let run = run_work_on(&StructureChecker, &rules, dir.path());
        assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
        assert_eq!(run.report.failures_total, 1, "{:?}", run.report.failures);
        assert_eq!(
            (run.report.failures[0].reference.as_str(), run.report.failures[0].kind.as_str()),
            ("empty.tif", "empty")
        );

        std::fs::write(dir.path().join("empty.tif"), "II*\0").unwrap();
        assert!(run_work_on(&StructureChecker, &rules, dir.path()).succeeded());
    }

    #[test]
    fn a_bag_records_its_declared_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("data")).unwrap();
        std::fs::write(root.join("data/scan.tif"), "tiff").unwrap();
        std::fs::write(root.join("bagit.txt"), "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n").unwrap();
        std::fs::write(root.join("manifest-md5.txt"), "ba75e603168423a985abe2d8c2e3c4d5  data/scan.tif\n").unwrap();
        let info = "External-Identifier: B1\nBagging-Date: 2026-11-27\nSource-Organization: Scan Co\nScanner: Z\n";
        std::fs::write(root.join("bag-info.txt"), info).unwrap();
        let run = run_work_on(&StructureChecker, &settings("required_bag_info = [\"External-Identifier\"]"), root);
        assert!(run.succeeded(), "{:?}", run.report);
        let result = run.result::<StructureChecked>().expect("a result");
        assert_eq!((result.bagit_version.as_deref(), result.files, result.directories), (Some("1.0"), 4, 1));
        let bag_info = result.bag_info.clone().expect("the bag's metadata");
        assert_eq!(bag_info.external_identifier.as_deref(), Some("B1"));
        assert_eq!(bag_info.bagging_date.as_deref(), Some("2026-11-27"));
        assert_eq!(bag_info.source_organization.as_deref(), Some("Scan Co"));
        assert_eq!(bag_info.other["Scanner"], "Z");
        // A later step reads it typed from the batch's event.
        let later = TestBatch::new("B1").with_result(EVENT_TYPE, run.report.result.as_ref().unwrap()).build();
        assert_eq!(later.result::<StructureChecked>(EVENT_TYPE).unwrap(), Some(result));
        let schema = StructureChecker.result_schema().expect("a published schema");
        assert!(schema["properties"]["bag_info"].is_object(), "{schema:#}");

        // Not a bag: no metadata, still the counts.
        let run = run_work_on(&StructureChecker, &settings("bagit = false"), &root.join("data"));
        assert_eq!(run.result::<StructureChecked>(), Some(StructureChecked { files: 1, ..Default::default() }));
    }

    #[test]
    fn a_missing_location_is_a_permanent_failure_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("never-delivered");
        let run = run_work_on(&StructureChecker, &settings(""), &missing);
        assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
        assert!(run.report.summary.contains(&*missing.to_string_lossy()), "{}", run.report.summary);
    }
}
