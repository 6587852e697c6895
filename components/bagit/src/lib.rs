//! BagIt (RFC 8493) for autocomp's example components and for any component that works on
//! bags: reading a bag ([`Bag`]: its declaration, its metadata as a typed [`BagInfo`], its
//! manifests), streaming checksum verification whose verdict agrees with the Library of
//! Congress `bagit` tool, the configurable structure rules, and the structured results the
//! two BagIt components record ([`results`]). Framework-free: only `report`, behind the
//! `framework` feature the component binaries enable, turns the `Problem`s found here into
//! report failures. A component crate depends on it by path (it is not published):
//! `autocomp-bagit = { path = "../bagit" }`.

pub mod algorithm;
pub mod bag;
pub mod manifest;
pub mod paths;
pub mod pattern;
pub mod problem;
#[cfg(feature = "framework")]
pub mod report;
pub mod results;
pub mod structure;
pub mod tagfile;
pub mod verify;
pub mod walk;

#[cfg(feature = "testing")]
pub mod testing;

pub use algorithm::Algorithm;
pub use bag::{Bag, BagInfo, ManifestEntry};
pub use problem::{Abort, Collected, Kind, Problem, Sink};
pub use results::{ChecksumsVerified, StructureChecked};
