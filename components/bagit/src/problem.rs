//! What the checks report: a `Problem` per offending path (the verdict), handed to a `Sink`
//! as it is found, and an `Abort` when the batch cannot be checked at all. Also decides which
//! I/O errors are worth a retry.

use std::io;
use std::path::Path;

use serde_json::Value;

/// The kind of a problem; `as_str` is what the report records as the failure's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Listed (in a manifest, or required) but not there.
    Missing,
    /// In `data/` (or the delivery) but in no manifest.
    Extra,
    /// Content differs from the manifest's checksum.
    Mismatch,
    /// An absolute path, or one that leaves the bag (`..`, a symlink pointing out).
    UnsafePath,
    /// A manifest lists a path twice.
    Duplicate,
    /// A tag file, manifest line or declaration that cannot be read as BagIt.
    Malformed,
    /// `Payload-Oxum` disagrees with the payload.
    PayloadOxum,
    /// Present but cannot be read (permissions, a directory the walk cannot enter).
    Unreadable,
    /// Listed as a file but is a directory, device or pipe.
    NotAFile,
    /// A BagIt version, encoding or algorithm this tool does not handle.
    Unsupported,
    /// A zero-byte file.
    Empty,
    /// A payload name outside the allowed patterns or characters.
    Name,
    /// A symlink whose target is outside the batch.
    SymlinkEscape,
    /// A symlink whose target does not exist.
    BrokenSymlink,
    /// A required `bag-info.txt` field is absent or empty.
    MissingField,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Extra => "extra",
            Kind::Mismatch => "mismatch",
            Kind::UnsafePath => "unsafe-path",
            Kind::Duplicate => "duplicate",
            Kind::Malformed => "malformed",
            Kind::PayloadOxum => "payload-oxum",
            Kind::Unreadable => "unreadable",
            Kind::NotAFile => "not-a-file",
            Kind::Unsupported => "unsupported",
            Kind::Empty => "empty",
            Kind::Name => "name",
            Kind::SymlinkEscape => "symlink-escape",
            Kind::BrokenSymlink => "broken-symlink",
            Kind::MissingField => "missing-field",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding, named by its path relative to the batch root (`/`-separated).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub path: String,
    pub kind: Kind,
    pub description: String,
    /// Structured facts (expected and found checksums, the manifest, a line number).
    pub details: Value,
}

impl Problem {
    pub fn new(path: impl Into<String>, kind: Kind, description: impl Into<String>) -> Self {
        Self { path: path.into(), kind, description: description.into(), details: Value::Null }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

/// Where findings go as they are found (a component's report, or a list in tests), so a batch
/// with a million bad files is not held in memory twice; also how a long check learns it
/// should stop.
pub trait Sink {
    fn add(&mut self, problem: Problem);
    fn cancelled(&self) -> bool {
        false
    }
}

/// A `Sink` that keeps everything: for tests and tools.
#[derive(Debug, Default)]
pub struct Collected {
    pub problems: Vec<Problem>,
}

impl Collected {
    /// The problems of one kind, by path.
    pub fn paths_of(&self, kind: Kind) -> Vec<&str> {
        self.problems.iter().filter(|p| p.kind == kind).map(|p| p.path.as_str()).collect()
    }
}

impl Sink for Collected {
    fn add(&mut self, problem: Problem) {
        self.problems.push(problem);
    }
}

/// Why a batch could not be checked at all (as opposed to checked and found wanting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The batch's location is missing, not a directory or unreadable: retrying will not help.
    Location(String),
    /// The storage failed in a way that may heal (a stale NFS handle, a share offline).
    Transient(String),
    /// The sink asked to stop.
    Cancelled,
}

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abort::Location(message) | Abort::Transient(message) => f.write_str(message),
            Abort::Cancelled => f.write_str("cancelled before the check finished"),
        }
    }
}

impl std::error::Error for Abort {}

/// How an I/O error on one path should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    NotFound,
    /// Permission denied and its kin: a property of the delivery, reported on the file.
    Denied,
    /// Network file systems and flaky media: worth a retry, so the whole check is aborted.
    Transient,
    /// Anything else is reported on the file.
    Other,
}

pub fn classify(error: &io::Error) -> IoClass {
    use io::ErrorKind as K;
    match error.kind() {
        K::NotFound => return IoClass::NotFound,
        K::PermissionDenied => return IoClass::Denied,
        K::TimedOut
        | K::Interrupted
        | K::WouldBlock
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::NotConnected
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NetworkDown
        | K::StaleNetworkFileHandle
        | K::ResourceBusy => return IoClass::Transient,
        _ => {}
    }
    // EIO is how a dropped NFS/SMB mount or a failing disk shows up; a later attempt (after
    // the share is back, or on a replica) may well succeed.
    match error.raw_os_error() {
        Some(libc::EIO) | Some(libc::ENOMEDIUM) | Some(libc::EHOSTDOWN) => IoClass::Transient,
        _ => IoClass::Other,
    }
}

/// An I/O error on the batch location itself: the whole check cannot start.
pub fn location_error(root: &Path, error: &io::Error) -> Abort {
    let root = root.display();
    match classify(error) {
        IoClass::NotFound => Abort::Location(format!("batch location {root} does not exist")),
        IoClass::Denied => Abort::Location(format!("batch location {root} cannot be read: {error}")),
        IoClass::Transient => Abort::Transient(format!("batch location {root} is unavailable: {error}")),
        IoClass::Other => Abort::Location(format!("batch location {root} cannot be read: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_that_drop_out_are_worth_a_retry_and_permissions_are_not() {
        let class = |errno| classify(&io::Error::from_raw_os_error(errno));
        assert_eq!(class(libc::ENOENT), IoClass::NotFound);
        assert_eq!(class(libc::EACCES), IoClass::Denied);
        for transient in [libc::EIO, libc::ESTALE, libc::ETIMEDOUT, libc::ENOTCONN, libc::EHOSTDOWN] {
            assert_eq!(class(transient), IoClass::Transient, "errno {transient}");
        }
        assert_eq!(class(libc::EISDIR), IoClass::Other);
        let abort = location_error(Path::new("/mnt/share/B1"), &io::Error::from_raw_os_error(libc::ESTALE));
        assert!(matches!(&abort, Abort::Transient(m) if m.contains("/mnt/share/B1")), "{abort:?}");
    }
}
