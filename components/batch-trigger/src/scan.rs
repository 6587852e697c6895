//! What one delivery folder looks like right now (files, bytes, newest modification, newest
//! change of any kind, its completion marker), whether it has settled, and the fingerprint
//! that tells a re-delivery apart from the delivery already registered.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::pattern::NamePattern;

#[derive(Debug, Clone)]
pub struct FolderScan {
    /// Everything that is not a directory (regular files, symlinks, ...).
    pub files: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
    /// The newest modification time of any entry, directories included (a removed file
    /// shows as its directory's mtime).
    pub newest_mtime: SystemTime,
    /// The newest mtime or ctime of any entry. Copy tools can backdate mtimes (`rsync -a`,
    /// `cp -p`) but not ctimes, so a copy in progress always shows here.
    pub newest_change: SystemTime,
    /// The newest-changed top-level file matching the marker pattern, and its change time.
    pub marker: Option<(String, SystemTime)>,
    /// The newest change among non-directories other than that marker.
    newest_other_file_change: SystemTime,
}

/// Why a folder counts as settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The completion marker is present and nothing changed after it was written.
    Marker(String),
    /// No change anywhere inside for this long.
    Quiet(Duration),
    /// `--force`.
    Forced,
}

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Settled::Marker(name) => write!(f, "marker {name}"),
            Settled::Quiet(quiet) => write!(f, "no change for {}", whole_seconds(*quiet)),
            Settled::Forced => f.write_str("forced"),
        }
    }
}

pub fn whole_seconds(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(duration.as_secs()))
}

impl FolderScan {
    /// Walks `folder` without following symlinks inside it. An entry vanishing mid-walk is a
    /// `NotFound` error: the folder is still changing.
    pub fn of(folder: &Path, marker: Option<&NamePattern>) -> io::Result<Self> {
        let root = std::fs::metadata(folder)?;
        let mut scan = FolderScan {
            files: 0,
            bytes: 0,
            newest_mtime: mtime(&root),
            newest_change: changed(&root),
            marker: None,
            newest_other_file_change: UNIX_EPOCH,
        };
        let mut markers = Vec::new();
        let mut file_changes = Vec::new();
        let mut pending = vec![(folder.to_path_buf(), true)];
        while let Some((dir, top)) = pending.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let meta = entry.path().symlink_metadata()?;
                scan.newest_mtime = scan.newest_mtime.max(mtime(&meta));
                scan.newest_change = scan.newest_change.max(changed(&meta));
                if meta.is_dir() {
                    pending.push((entry.path(), false));
                    continue;
                }
                scan.files += 1;
                if meta.is_file() {
                    scan.bytes += meta.len();
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if top && meta.is_file() && marker.is_some_and(|m| m.matches(&name)) {
                    markers.push((name, changed(&meta)));
                } else {
                    file_changes.push(changed(&meta));
                }
            }
        }
        // With several markers (tagmanifest-md5.txt and -sha256.txt), the newest is the one
        // written last; the others count as ordinary files it must postdate.
        markers.sort_by_key(|(_, at)| *at);
        scan.marker = markers.pop();
        file_changes.extend(markers.into_iter().map(|(_, at)| at));
        scan.newest_other_file_change = file_changes.into_iter().max().unwrap_or(UNIX_EPOCH);
        Ok(scan)
    }

    /// Settled, or how long it has been quiet so far. A marker counts only if no other file
    /// changed after it: an old marker in a folder being re-delivered does not.
    pub fn settled(&self, now: SystemTime, settle_for: Duration) -> Result<Settled, Duration> {
        if let Some((name, at)) = &self.marker
            && *at >= self.newest_other_file_change
        {
            return Ok(Settled::Marker(name.clone()));
        }
        // A change time in the future (clock skew) counts as a change right now.
        let quiet = now.duration_since(self.newest_change).unwrap_or_default();
        if quiet >= settle_for { Ok(Settled::Quiet(quiet)) } else { Err(quiet) }
    }

    /// Stored in the batch metadata under `fingerprint`; a different one means re-delivered.
    pub fn fingerprint(&self) -> Value {
        json!({
            "files": self.files,
            "bytes": self.bytes,
            "newest_mtime": humantime::format_rfc3339_nanos(self.newest_mtime).to_string(),
        })
    }
}

fn mtime(meta: &std::fs::Metadata) -> SystemTime {
    meta.modified().unwrap_or(UNIX_EPOCH)
}

/// The later of mtime and ctime.
fn changed(meta: &std::fs::Metadata) -> SystemTime {
    let ctime = match (u64::try_from(meta.ctime()), u32::try_from(meta.ctime_nsec())) {
        (Ok(secs), Ok(nanos)) => UNIX_EPOCH + Duration::new(secs, nanos),
        _ => UNIX_EPOCH,
    };
    ctime.max(mtime(meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_files_and_bytes_and_finds_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
        std::fs::write(dir.path().join("data/sub/a.txt"), "12345").unwrap();
        std::fs::write(dir.path().join("data/b.txt"), "123").unwrap();
        std::fs::write(dir.path().join("tagmanifest-sha256.txt"), "x").unwrap();
        let marker = NamePattern::parse("tagmanifest-*.txt").unwrap();
        let scan = FolderScan::of(dir.path(), Some(&marker)).unwrap();
        assert_eq!((scan.files, scan.bytes), (3, 9));
        assert_eq!(scan.marker.as_ref().unwrap().0, "tagmanifest-sha256.txt");
        let now = SystemTime::now();
        assert_eq!(scan.settled(now, Duration::from_secs(3600)), Ok(Settled::Marker("tagmanifest-sha256.txt".into())));

        // Any change makes a different fingerprint.
        std::fs::write(dir.path().join("data/late.txt"), "late").unwrap();
        assert_ne!(FolderScan::of(dir.path(), Some(&marker)).unwrap().fingerprint(), scan.fingerprint());
    }

    #[test]
    fn a_marker_counts_only_if_nothing_changed_after_it() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        let minute = Duration::from_secs(60);
        let marker = Some(("tagmanifest-md5.txt".to_owned(), at(100)));
        let rewritten = FolderScan {
            files: 2,
            bytes: 2,
            newest_mtime: at(101),
            newest_change: at(101),
            marker,
            newest_other_file_change: at(101),
        };
        assert_eq!(rewritten.settled(at(130), minute), Err(Duration::from_secs(29)));
        assert_eq!(rewritten.settled(at(161), minute), Ok(Settled::Quiet(minute)));
        let written_last = FolderScan { newest_other_file_change: at(100), ..rewritten };
        assert_eq!(written_last.settled(at(100), minute), Ok(Settled::Marker("tagmanifest-md5.txt".into())));
    }
}
