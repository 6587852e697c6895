//! The store's tests: the port's contract on each backend, its service, its files and processes.
//! One test binary per crate, each file a module: a test binary links the whole stack, and
//! one per file filled a CI machine's disk. Run one file's tests with a filter: `module::`.

mod bounded_reads;
mod bounded_upgrade;
mod carried_hand_ons;
mod claim_as_lock;
mod feed_horizon;
mod kept_summaries;
mod migration_locks;
mod operations;
mod postgres_connection;
mod postgres_processes;
mod processes;
mod protocol;
mod secrets;
mod service;
mod store_file;
mod untrusted_text;
mod young_plans;
