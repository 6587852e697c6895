//! `Checked`: the bound and input checks every SQL backend shares, done once in a wrapper around
//! it (as a `Directory` is wrapped by a managed one), so a backend only stores and a new backend
//! cannot forget one. Its impls are generated beside each trait (`port_trait!`), where each
//! operation declares its checks. `SqliteStore` and `PgStore` are their backends checked; the
//! store service checks for `HttpStore` at the other end. Checks that depend on what the store
//! holds (a batch's bytes, a run's fence) stay with the backend that reads it.

use std::ops::Deref;

/// A backend behind the checks: every operation is checked, then handed to the backend.
/// Derefs to the backend for what is its own (its file, its schema version).
#[derive(Clone)]
pub struct Checked<S> {
    pub(crate) inner: S,
}

impl<S> Checked<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S> Deref for Checked<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.inner
    }
}
