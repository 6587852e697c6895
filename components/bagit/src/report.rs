//! The checks as a component's work: each `Problem` becomes one report failure named by its
//! path, the runner's cancellation stops the check, and an `Abort` becomes the work's error.
//! The one place the framework meets this crate (the `framework` feature).

use std::path::Path;

use autocomp_framework::{WorkContext, WorkError};

use crate::{Abort, Problem, Sink};

/// Runs `check` on the batch's location with its problems going into `context`'s report.
pub fn check_location<T>(
    context: &mut WorkContext,
    check: impl FnOnce(&Path, &mut dyn Sink) -> Result<T, Abort>,
) -> Result<T, WorkError> {
    let root = context.location()?.to_path_buf();
    check(&root, &mut Failures(context)).map_err(work_error)
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

/// A transient abort is retried by the component; any other fails the batch.
fn work_error(abort: Abort) -> WorkError {
    match abort {
        Abort::Transient(message) => WorkError::transient(message),
        other => WorkError::permanent(other.to_string()),
    }
}
