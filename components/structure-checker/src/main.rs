//! `structure-checker`: checks a delivered batch's layout and records `Structure_Checked`: the
//! BagIt skeleton (declaration, `data/`, a payload manifest, required bag-info fields) and the
//! configured rules (required files, payload names, no empty files, no symlinks leaving it).

use autocomp_bagit::structure::{self, StructureRules};
use autocomp_bagit::{Abort, Problem, Sink};
use autocomp_framework::{Component, WorkContext, WorkError, cli};
use autocomp_store::{Batch, EventType, Trigger};

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
        Trigger {
            requires: vec![EventType::new("Data_Received").expect("valid name")],
            blocked_by: vec![EventType::new(EVENT_TYPE).expect("valid name")],
            ..Trigger::default()
        }
    }

    fn work(&self, _batch: &Batch, rules: &StructureRules, context: &mut WorkContext) -> Result<(), WorkError> {
        let root = context.location()?.to_path_buf();
        let totals = structure::check(&root, rules, &mut Failures(context)).map_err(work_error)?;
        context.set_summary(totals.summary());
        Ok(())
    }
}

/// Each violation becomes one report failure, named by its path; cancellation is the runner's.
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
    cli::main(StructureChecker)
}
