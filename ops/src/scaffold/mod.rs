//! `autocomp new`: writes a new component crate (its `main.rs`, a unit test on the test
//! helpers) and its config file; inside the autocomp workspace it also adds the member.
//! The command and its arguments are here; what it writes is decided in `plan`, from the
//! names checked in `names`, the workspace found in `workspace` and the manifest edited in
//! `manifest`, and written by `write` from the texts of `texts` and `templates`.

use std::path::PathBuf;

use autocomp_model::InvalidInput;

use crate::operator::OperatorError;

mod manifest;
mod names;
mod plan;
mod templates;
mod texts;
mod workspace;
mod write;

#[cfg(test)]
mod tests;

/// The type a new component requires when `--requires` names none: what a source records.
const DEFAULT_REQUIRES: &str = "Data_Received";

/// `autocomp new NAME --event-type T [--requires A,B] [--dir DIR]`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Writes DIR/Cargo.toml, DIR/src/main.rs (a component that records the number of files in \
                        the batch's directory as its result, failing below the setting min_files), \
                        DIR/src/tests.rs (its unit tests) and DIR/NAME.toml, the config file: copy it into the \
                        config dir (the one holding autocomp.toml, /etc/autocomp by default). Inside the autocomp \
                        workspace the crate uses the workspace's dependencies and is added to its members \
                        (unless a pattern there covers it already); elsewhere it depends on the framework \
                        sources this autocomp was built from. Nothing is written when any input is invalid \
                        or DIR exists.\n\n\
                        With --lang python it writes DIR/NAME.py (a step for autocomp-exec: a work function on \
                        the autocomp_step module of contrib/python), DIR/test_NAME.py (its unittest), DIR/NAME.toml \
                        and DIR/README.md (the autocomp-exec command and crontab line), with '-' in NAME as '_' \
                        in the Python file names; with --lang shell DIR/NAME.sh, DIR/test_NAME.sh, DIR/NAME.toml \
                        and DIR/README.md. DIR defaults to ./NAME for both.")]
pub struct NewArgs {
    /// The component's name (also its crate and binary name), e.g. page-counter.
    pub name: String,
    /// The event type it records, e.g. Pages_Counted.
    #[arg(long, value_name = "TYPE")]
    pub event_type: String,
    /// Event types that must have succeeded first (comma-separated) [default: Data_Received].
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub requires: Vec<String>,
    /// Where to write the crate (must not exist) [default: components/NAME in the autocomp
    /// workspace holding the current directory, else ./NAME; ./NAME for python and shell].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// rust (a component crate), python (a step for autocomp-exec on the autocomp_step
    /// module, contrib/python) or shell (an sh script for autocomp-exec).
    #[arg(long, value_name = "LANG", default_value = "rust")]
    pub lang: String,
}

/// The language `autocomp new` writes the step in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Rust,
    Python,
    Shell,
}

impl Lang {
    fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "rust" => Ok(Lang::Rust),
            "python" => Ok(Lang::Python),
            "shell" => Ok(Lang::Shell),
            _ => Err(InvalidInput::new("--lang", text, "must be rust, python or shell")),
        }
    }
}

/// Writes the crate and its config; returns what was written, for the terminal.
pub fn run(args: &NewArgs) -> Result<String, OperatorError> {
    let cwd = std::env::current_dir().map_err(|e| refused(format!("cannot read the current directory: {e}")))?;
    let plan = plan::plan(args, &cwd)?;
    plan.write()
}

fn refused(message: String) -> OperatorError {
    OperatorError::Refused(message)
}
