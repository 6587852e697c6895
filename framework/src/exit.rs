//! The exit codes every autocomp binary uses (README: "Exit codes"), and the errors that
//! end a run, each mapped to one of them.
//!
//! 3 (busy) means another pass of the component is at work: a cron line may ignore it. 6
//! (foreign lock) is never that: a node at a lock path that no lock service made (a
//! persistent node, foreign data, a record naming another session than its owner) or a lock
//! tree whose ACL this identity may not fix. It does not go away by itself, so it needs a
//! person: `autocomp locks` and `autocomp alerts` name it. The poll lock's path foreign ends
//! the pass at once with 6; a batch's is skipped (the others are worked on), as is a pool
//! slot's (the pool's other slots are tried), and the pass then ends with 6 unless 4 or 5
//! wins.

use std::process::ExitCode;

use autocomp_sboi::IndexError;
use autocomp_store::StoreError;

use crate::config::ConfigError;
use crate::locks::LockError;

/// Ok, or nothing to do.
pub const OK: u8 = 0;
/// Some batch failed (or a write was refused).
pub const FAILED: u8 = 1;
/// Usage, configuration or input error.
pub const USAGE: u8 = 2;
/// Another pass of this component holds the poll lock.
pub const POLL_LOCK_BUSY: u8 = 3;
/// The lock service session was lost.
pub const LOCKS_LOST: u8 = 4;
/// The store or the index cannot be reached, or the store cannot take writes (a full disk).
pub const UNREACHABLE: u8 = 5;
/// A lock path (or the lock tree) holds a node no lock service made: an alarm, not busy.
pub const FOREIGN_LOCK: u8 = 6;

/// The exit codes in one paragraph, for the end of every binary's `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes: 0 ok or nothing to do, 1 some batch failed, 2 usage or config error, \
                                   3 poll lock busy, 4 lock service lost, 5 store or index unreachable (or the \
                                   store's disk full), 6 a lock node autocomp did not make (see `autocomp \
                                   locks`).";

/// Why a run stopped before finishing normally.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A config file is missing a value, or holds one that does not parse (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Bad arguments or input, or a configuration the registry refuses (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The pass refuses to start: a result the component reads is no longer published as it
    /// expects (a broken contract, exit 2). A watcher waits for it to be mended instead.
    #[error("{0}")]
    ContractBroken(String),
    /// Another pass of the named component holds its poll lock (exit 3).
    #[error("the poll lock of {0} is held by another pass; nothing to do")]
    PollLockBusy(String),
    /// The lock service could not be reached, or its session was lost (exit 4).
    #[error("lost the lock service: {0}")]
    LocksLost(String),
    /// A lock path (or the lock tree) holds a node no lock service made (exit 6).
    #[error("{0}")]
    ForeignLock(String),
    /// The store refused or could not answer (exit by kind: see [`RunError::code`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The batch index, or the store behind it, could not answer (exit 5, or by the store
    /// error's kind).
    #[error(transparent)]
    Index(#[from] IndexError),
}

impl From<LockError> for RunError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Invalid(e) => RunError::Usage(e.to_string()),
            LockError::Unavailable(e) => RunError::LocksLost(e),
            foreign @ LockError::Foreign { .. } => RunError::ForeignLock(foreign.to_string()),
        }
    }
}

impl RunError {
    /// The exit code this error ends a run with. A store error goes by its kind: bad input
    /// or an unknown batch is a usage error (2), a refused write a failure (1), an
    /// unreachable or full store 5.
    pub fn code(&self) -> u8 {
        match self {
            RunError::Config(_) | RunError::Usage(_) | RunError::ContractBroken(_) => USAGE,
            RunError::PollLockBusy(_) => POLL_LOCK_BUSY,
            RunError::LocksLost(_) => LOCKS_LOST,
            RunError::ForeignLock(_) => FOREIGN_LOCK,
            RunError::Store(e) | RunError::Index(IndexError::Store(e)) => store_code(e),
            RunError::Index(_) => UNREACHABLE,
        }
    }

    /// [`RunError::code`] as a process exit code.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code())
    }
}

fn store_code(error: &StoreError) -> u8 {
    match error {
        StoreError::Invalid(_) | StoreError::NotFound(_) => USAGE,
        error if error.is_unavailable() => UNREACHABLE,
        // A conflict or a fenced write, and what a newer store adds: a refused write.
        _ => FAILED,
    }
}
