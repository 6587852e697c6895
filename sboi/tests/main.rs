//! The index's tests: the engine, the trigger's equivalence, the service and its processes.
//! One test binary per crate, each file a module: a test binary links the whole stack, and
//! one per file filled a CI machine's disk. Run one file's tests with a filter: `module::`.

mod engine;
mod processes;
mod protocol;
mod reconcile;
mod service;
mod trigger_equivalence;
