//! `structure-checker`: checks a delivered batch's layout and records `Structure_Checked`: the
//! BagIt skeleton (declaration, `data/`, a payload manifest, required bag-info fields) and the
//! configured rules (required files, payload names, no empty files, no symlinks leaving it).

use autocomp_bagit::report::check_location;
use autocomp_bagit::structure::{self, StructureRules};

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

    fn work(&self, _batch: &Batch, rules: &StructureRules, context: &mut WorkContext) -> Result<(), WorkError> {
        let totals = check_location(context, |root, sink| structure::check(root, rules, sink))?;
        context.set_summary(totals.summary());
        Ok(())
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
    fn a_missing_location_is_a_permanent_failure_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("never-delivered");
        let run = run_work_on(&StructureChecker, &settings(""), &missing);
        assert!(!run.succeeded() && !run.is_transient(), "{:?}", run.report);
        assert!(run.report.summary.contains(&*missing.to_string_lossy()), "{}", run.report.summary);
    }
}
