//! `autocomp new`: writes a new component crate (its `main.rs`, a unit test on the test
//! helpers) and its config file; inside the autocomp workspace it also adds the member.

use std::path::PathBuf;

use crate::operator::OperatorError;

/// `autocomp new NAME --event-type T [--requires A,B]`.
#[derive(Debug, Clone, clap::Args)]
pub struct NewArgs {
    /// The component's name (also its crate and binary name), e.g. page-counter.
    pub name: String,
    /// The event type it records, e.g. Pages_Counted.
    #[arg(long, value_name = "TYPE")]
    pub event_type: String,
    /// Event types that must have succeeded first (comma-separated).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub requires: Vec<String>,
}

/// Writes the crate and its config; returns what was written, for the terminal.
pub fn run(args: &NewArgs) -> Result<String, OperatorError> {
    let _ = (args, PathBuf::new());
    Err(OperatorError::Refused("not written yet".into()))
}
