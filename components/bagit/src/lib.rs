//! BagIt (RFC 8493) for autocomp's example components: reading bags (tag files, manifests and
//! their path rules), streaming checksum verification whose verdict agrees with the Library of
//! Congress `bagit` tool, and the configurable structure rules. Framework-free: only `report`,
//! behind the `framework` feature the component binaries enable, turns the `Problem`s found
//! here into report failures.

pub mod algorithm;
pub mod manifest;
pub mod paths;
pub mod pattern;
pub mod problem;
#[cfg(feature = "framework")]
pub mod report;
pub mod structure;
pub mod tagfile;
pub mod verify;
pub mod walk;

#[cfg(feature = "testing")]
pub mod testing;

pub use algorithm::Algorithm;
pub use problem::{Abort, Collected, Kind, Problem, Sink};
