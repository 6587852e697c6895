//! End-to-end tests: the pipeline's binaries run as users run them, against real servers.
//! One test binary per crate, each file a module: a test binary links the whole stack, and
//! one per file filled a CI machine's disk. Run one file's tests with a filter: `module::`.

mod careless;
mod chaos;
mod contracts;
mod demo;
mod disk_full;
mod doctor;
mod hand_ons;
mod layers;
mod lock_contract;
mod logs;
mod metrics;
mod monitor;
mod multihost;
mod notify;
mod operator;
mod output;
mod packages;
mod partition;
mod pg_liveness;
mod pg_locks;
mod postgres;
mod premis;
mod protocol;
mod python_contracts;
mod python_step;
mod redelivery;
mod registry;
mod restore;
mod retention;
mod rooms;
mod round_trips;
mod runner;
mod scaffold;
mod shape;
mod steering;
mod steering_cli;
mod telemetry;
mod tls_trust;
mod upgrade;
mod watch;
mod watch_concerns;
mod watch_feed;
mod zk_security;
mod zookeeper;
