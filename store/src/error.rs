//! `StoreError`: how an operation on the object store fails, apart from the port so that every
//! adapter, the store service and the callers that decide by an error's kind share one room.

use autocomp_model::{BatchId, ComponentName, InvalidInput};

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input; nothing was written.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("batch {0} does not exist")]
    NotFound(BatchId),
    /// The request contradicts what the store already holds; nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A fenced write whose run is no longer the current open run; nothing was written.
    #[error("fenced: run {generation} of {component} on batch {batch} {reason}")]
    Fenced { batch: BatchId, component: ComponentName, generation: i64, reason: String },
    /// The store could not be reached or read (I/O, lock timeout, corrupt file, network).
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }
}
