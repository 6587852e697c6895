//! `checksum-verifier`: verifies a delivered batch's checksums and records `Checksums_Verified`.
//! A BagIt bag is checked against all its manifests and tag manifests (agreeing with the Library
//! of Congress `bagit --validate`); other deliveries against a configured `md5sum`-style file.

use autocomp_bagit::verify::{self, VerifySettings};
use autocomp_bagit::{Abort, Problem, Sink};
use autocomp_framework::{Component, WorkContext, WorkError, cli};
use autocomp_store::{Batch, EventType, Trigger};

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
        Trigger {
            requires: vec![EventType::new("Data_Received").expect("valid name")],
            blocked_by: vec![EventType::new(EVENT_TYPE).expect("valid name")],
            ..Trigger::default()
        }
    }

    fn work(&self, _batch: &Batch, settings: &VerifySettings, context: &mut WorkContext) -> Result<(), WorkError> {
        let root = context.location()?.to_path_buf();
        let totals = verify::verify(&root, settings, &mut Failures(context)).map_err(work_error)?;
        let summary = totals.summary(context.failures_so_far());
        context.set_summary(summary);
        Ok(())
    }
}

/// Each problem becomes one report failure, named by its path; cancellation is the runner's.
struct Failures<'a>(&'a mut WorkContext);

impl Sink for Failures<'_> {
    fn add(&mut self, problem: Problem) {
        self.0.add_failure(problem.path, problem.kind.as_str(), problem.description, problem.details);
    }
    fn cancelled(&self) -> bool {
        self.0.is_cancelled()
    }
}

fn work_error(abort: Abort) -> WorkError {
    match abort {
        Abort::Transient(message) => WorkError::transient(message),
        other => WorkError::permanent(other.to_string()),
    }
}

fn main() -> std::process::ExitCode {
    cli::main(ChecksumVerifier)
}
