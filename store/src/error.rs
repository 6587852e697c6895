//! `StoreError`: how an operation on the object store fails, apart from the port so that every
//! adapter, the store service and the callers that decide by an error's kind share one room.
//! A caller decides on the variant (a conflict that is the state already, a schema newer than
//! this release, ...), never on the words: those are for people and may change.

use autocomp_model::{BatchId, ComponentName, InvalidInput};

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Bad input; nothing was written.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("batch {0} does not exist")]
    NotFound(BatchId),
    /// The request contradicts what the store already holds; nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The state is that way already (paused, draining, its circuit open); nothing was written.
    #[error("conflict: {0}")]
    AlreadyInState(String),
    /// The state moved since the version the change was previewed at; nothing was written.
    #[error("conflict: {0}")]
    ChangedSincePreview(String),
    /// A fenced write whose run is no longer the current open run; nothing was written.
    #[error("fenced: run {generation} of {component} on batch {batch} {reason}")]
    Fenced { batch: BatchId, component: ComponentName, generation: i64, reason: String },
    /// The store could not be reached or read (I/O, lock timeout, corrupt file, network).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's schema is newer than this release knows: only a newer release opens it, and
    /// waiting does not help.
    #[error("store unavailable: {0}")]
    SchemaNewer(String),
    /// The store's schema is older than this release and this handle may not migrate it
    /// (`migrate=false`, or a read-only file).
    #[error("store unavailable: {0}")]
    SchemaOlder(String),
    /// No store file where the URL says, and this handle may not make one (`migrate=false`).
    #[error("store unavailable: {0}")]
    NoStoreFile(String),
    /// The store service (or the index service) runs an older release that does not offer
    /// the operation: nothing was sent, and waiting does not help; the message names both
    /// releases and the upgrade order.
    #[error("{0}")]
    ServiceOlder(String),
}

/// The kinds of `StoreError`, as the store service names them in an error body's `reason`
/// for `conflict` and `unavailable` (the `kind` stays the one every release knows), so that
/// `HttpStore` gives its caller the variant the embedded store would have.
pub(crate) const ALREADY_IN_STATE: &str = "already_in_state";
pub(crate) const CHANGED_SINCE_PREVIEW: &str = "changed_since_preview";
pub(crate) const SCHEMA_NEWER: &str = "schema_newer";
pub(crate) const SCHEMA_OLDER: &str = "schema_older";
pub(crate) const NO_STORE_FILE: &str = "no_store_file";
pub(crate) const SERVICE_OLDER: &str = "service_older";

impl StoreError {
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }

    /// The store could not be reached or read, whatever the cause (exit 5; a pass stops).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::SchemaNewer(_)
                | StoreError::SchemaOlder(_)
                | StoreError::NoStoreFile(_)
                | StoreError::ServiceOlder(_)
        )
    }

    /// The request contradicts what the store holds, whatever the cause; nothing was written.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict(_) | StoreError::AlreadyInState(_) | StoreError::ChangedSincePreview(_))
    }

    /// The store's schema is not this release's (newer, or older and not to be migrated here).
    pub fn is_schema_mismatch(&self) -> bool {
        matches!(self, StoreError::SchemaNewer(_) | StoreError::SchemaOlder(_))
    }

    /// The service's name of this error's kind within its wire kind (see [`ALREADY_IN_STATE`]).
    pub(crate) fn wire_reason(&self) -> Option<&'static str> {
        match self {
            StoreError::AlreadyInState(_) => Some(ALREADY_IN_STATE),
            StoreError::ChangedSincePreview(_) => Some(CHANGED_SINCE_PREVIEW),
            StoreError::SchemaNewer(_) => Some(SCHEMA_NEWER),
            StoreError::SchemaOlder(_) => Some(SCHEMA_OLDER),
            StoreError::NoStoreFile(_) => Some(NO_STORE_FILE),
            StoreError::ServiceOlder(_) => Some(SERVICE_OLDER),
            _ => None,
        }
    }

    /// A conflict (`conflict`) or an outage (`unavailable`) from the service, by the reason
    /// the service named: the variant the embedded store returned there.
    pub(crate) fn from_wire(unavailable: bool, reason: Option<&str>, message: String) -> Self {
        match (unavailable, reason) {
            (false, Some(ALREADY_IN_STATE)) => StoreError::AlreadyInState(message),
            (false, Some(CHANGED_SINCE_PREVIEW)) => StoreError::ChangedSincePreview(message),
            (false, _) => StoreError::Conflict(message),
            (true, Some(SCHEMA_NEWER)) => StoreError::SchemaNewer(message),
            (true, Some(SCHEMA_OLDER)) => StoreError::SchemaOlder(message),
            (true, Some(NO_STORE_FILE)) => StoreError::NoStoreFile(message),
            (true, Some(SERVICE_OLDER)) => StoreError::ServiceOlder(message),
            (true, _) => StoreError::Unavailable(message),
        }
    }
}
