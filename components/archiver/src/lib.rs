//! The archiver's result, for the steps after it: where the batch's copy is and the fixity
//! of that copy, read typed with `batch.result::<ArchivedCopy>("Data_Archived")`. A library
//! target beside the `archiver` binary so that a later step written in Rust depends on it
//! (`archiver = { path = "../archiver" }`) instead of copying the type; [`Fixity::compute`]
//! recomputes a copy's fixity, e.g. for a periodic audit of the archive.

use std::io::{self, Read};
use std::path::Path;

use autocomp_framework::prelude::*;
use sha2::{Digest, Sha256};

/// `archiver`'s result (`Data_Archived`):
///
/// ```json
/// {"archive_path": "/archive/B400022028241-RT1", "version": 1,
///  "fixity": {"algorithm": "sha256", "manifest_digest": "9f2c…", "files": 9, "bytes": 41533}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ArchivedCopy {
    /// The published copy: `<archive_root>/<batch id>`, or `<batch id>.v<n>` for a
    /// re-delivery archived beside the earlier versions.
    pub archive_path: String,
    /// 1 for the first copy, then 2, 3, ... for the re-deliveries' copies.
    pub version: u32,
    /// The copy's fixity as the archiver verified it, re-read from disk after the copy.
    pub fixity: Fixity,
}

/// The fixity of a copy: one digest over a manifest of its regular files, so that it has
/// the same size however many files the batch holds. The manifest is the `sha256sum` format,
/// `<sha256 of the file>  <path relative to the copy>\n`, one line per regular file (symlinks
/// are kept as links and not listed), sorted by path bytewise; `manifest_digest` is that
/// text's sha256. For names without a newline or backslash, the shell gives the same:
///
/// ```sh
/// cd "$archive_path" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Fixity {
    /// The algorithm of the files' and the manifest's digests: `sha256`.
    pub algorithm: String,
    /// The sha256 (hex) of the manifest of the copy's files.
    pub manifest_digest: String,
    /// Regular files in the copy (the manifest's lines).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One regular file of a copy: its path relative to the copy (`/`-separated), its sha256
/// (hex) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

impl Fixity {
    /// The fixity of these files (in any order).
    pub fn of_files(mut files: Vec<FileDigest>) -> Fixity {
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let mut manifest = Sha256::new();
        for file in &files {
            manifest.update(format!("{}  {}\n", file.sha256, file.path));
        }
        Fixity {
            algorithm: "sha256".to_owned(),
            manifest_digest: hex::encode(manifest.finalize()),
            files: files.len() as u64,
            bytes: files.iter().map(|f| f.bytes).sum(),
        }
    }

    /// Reads every regular file under `dir` (not following symlinks) and returns its fixity:
    /// equal to the recorded one while the copy is intact.
    pub fn compute(dir: &Path) -> io::Result<Fixity> {
        let mut files = Vec::new();
        collect(dir, "", &mut files)?;
        Ok(Fixity::of_files(files))
    }
}

fn collect(dir: &Path, prefix: &str, files: &mut Vec<FileDigest>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = format!("{prefix}{}", entry.file_name().to_string_lossy());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect(&entry.path(), &format!("{path}/"), files)?;
        } else if kind.is_file() {
            let (sha256, bytes) = sha256_of(&mut std::fs::File::open(entry.path())?)?;
            files.push(FileDigest { path, sha256, bytes });
        }
    }
    Ok(())
}

/// The sha256 (hex) of everything `reader` gives, and how many bytes that was.
pub fn sha256_of(reader: &mut impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    let mut bytes = 0u64;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return Ok((hex::encode(hasher.finalize()), bytes)),
            Ok(n) => {
                hasher.update(&buffer[..n]);
                bytes += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_digest_is_what_sha256sum_gives() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("data/scans 2")).unwrap();
        std::fs::write(root.join("data/page-1.txt"), "one\n").unwrap();
        std::fs::write(root.join("data/scans 2/scan.txt"), "two\n").unwrap();
        std::fs::write(root.join("data-notes.txt"), "three\n").unwrap();
        std::os::unix::fs::symlink("data/page-1.txt", root.join("link")).unwrap();
        let fixity = Fixity::compute(root).unwrap();
        assert_eq!((fixity.algorithm.as_str(), fixity.files, fixity.bytes), ("sha256", 3, 14));

        let script = "find . -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum";
        let shell = std::process::Command::new("sh").arg("-c").arg(script).current_dir(root).output().unwrap();
        let shell = String::from_utf8(shell.stdout).unwrap();
        assert_eq!(shell.split_whitespace().next(), Some(fixity.manifest_digest.as_str()), "{shell}");

        std::fs::write(root.join("data/page-1.txt"), "One\n").unwrap();
        assert_ne!(Fixity::compute(root).unwrap().manifest_digest, fixity.manifest_digest);
    }
}
