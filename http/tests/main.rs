//! The shared HTTP toolkit's tests: limits before a body is read, TLS, and the client's words
//! for answers that are not the service's.
//! One test binary per crate, each file a module: a test binary links the whole stack, and
//! one per file filled a CI machine's disk. Run one file's tests with a filter: `module::`.

mod answers;
mod limits;
mod support;
mod tls;
