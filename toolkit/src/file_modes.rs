//! A careless setup named before it leaks: a configuration file others can change (it says
//! where the pipeline sends its token) is refused, and a secret file others can read is
//! warned about, by the same rules wherever such a file is read (the services, the
//! components, `autocomp`, the ZooKeeper identity file) and by `autocomp doctor`.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Others may write it.
const OTHERS_WRITE: u32 = 0o002;
/// Others may read, write or run it.
const OTHERS_ANY: u32 = 0o007;
/// The sticky bit: in a world-writable directory, only a file's owner may replace it.
const STICKY: u32 = 0o1000;

/// Whether `uid` may be trusted with what this process reads: root or this process's user.
fn trusted_owner(uid: u32) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

/// Why a configuration file must not be trusted, if it must not: others may write it (mode
/// o+w, the link's target for a symlink), another user owns it or something on its way (a
/// directory, a symlink: that user can change or replace it, sticky bit or not), or a
/// directory on its way (the file's, each link's and their ancestors) lets everyone replace
/// what it holds (world-writable without the sticky bit). The reason names the mode or owner
/// and the fix. A file that does not exist is no one's to judge here (reading it says so).
pub fn untrusted_config(file: &Path) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    let mode = meta.permissions().mode();
    let real = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let through = if real != file && std::fs::symlink_metadata(file).is_ok_and(|m| m.is_symlink()) {
        format!(" (a symlink to {})", real.display())
    } else {
        String::new()
    };
    if mode & OTHERS_WRITE != 0 {
        return Some(format!(
            "mode {:03o}{through}: others can change it, and with it where the pipeline sends its token; refused \
             until `chmod o-w {}`",
            mode & 0o777,
            real.display()
        ));
    }
    if !trusted_owner(meta.uid()) {
        return Some(format!(
            "it is owned by uid {}{through}, neither this user nor root: that user can change where the pipeline \
             sends its token; refused until `chown root {}` (or this user)",
            meta.uid(),
            real.display()
        ));
    }
    if let Some((path, uid)) = owned_by_another_on_the_way(file) {
        return Some(format!(
            "it is reached through {} (owned by uid {}, neither this user nor root){through}, whose owner can \
             replace what it holds; refused until that is owned by root or this user",
            path.display(),
            uid
        ));
    }
    let (dir, dir_mode) = replaceable_by_anyone(file)?;
    Some(format!(
        "it is reached through {} (mode {:03o}){through}, where anyone can replace what it holds; refused until \
         that directory is not world-writable (`chmod o-w {}`) or has the sticky bit",
        dir.display(),
        dir_mode & 0o777,
        dir.display()
    ))
}

/// The first directory on the way to `file` (its own, each symlink's on the chain, and
/// their ancestors) that anyone may write without the sticky bit, with its mode.
fn replaceable_by_anyone(file: &Path) -> Option<(PathBuf, u32)> {
    let mut hop = file.to_path_buf();
    // As many links as the kernel follows (ELOOP beyond).
    for _ in 0..40 {
        let parent = hop.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(parent).ok()?;
        for ancestor in dir.ancestors() {
            let mode = std::fs::metadata(ancestor).ok()?.permissions().mode();
            if mode & OTHERS_WRITE != 0 && mode & STICKY == 0 {
                return Some((ancestor.to_path_buf(), mode));
            }
        }
        hop = dir.join(std::fs::read_link(&hop).ok()?);
    }
    None
}

/// The first directory (the file's, each symlink's on the chain, and their ancestors) or
/// symlink on the way to `file` that a user other than root and this one owns, with its uid.
fn owned_by_another_on_the_way(file: &Path) -> Option<(PathBuf, u32)> {
    let mut hop = file.to_path_buf();
    for _ in 0..40 {
        let parent = hop.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(parent).ok()?;
        for ancestor in dir.ancestors() {
            let uid = std::fs::metadata(ancestor).ok()?.uid();
            if !trusted_owner(uid) {
                return Some((ancestor.to_path_buf(), uid));
            }
        }
        let link = std::fs::symlink_metadata(&hop).ok()?;
        if !link.is_symlink() {
            return None;
        }
        if !trusted_owner(link.uid()) {
            return Some((hop, link.uid()));
        }
        hop = dir.join(std::fs::read_link(&hop).ok()?);
    }
    None
}

/// A secret file others may read or write: its mode, what that means and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposed {
    /// The file's permission bits.
    pub mode: u32,
    /// Its owner, when that is neither root nor this process's user.
    pub foreign_owner: Option<u32>,
    file: PathBuf,
}

impl Exposed {
    /// What is wrong: the mode and what it lets others do.
    pub fn problem(&self) -> String {
        match self.foreign_owner {
            Some(uid) => format!("owned by uid {uid}, neither this user nor root: that user can read or change it"),
            None => format!("mode {:03o}: others can read or change it", self.mode),
        }
    }

    /// The command that mends it.
    pub fn fix(&self) -> String {
        match self.foreign_owner {
            Some(_) => format!("chown root {} (or this user), then 0600 or 0640", self.file.display()),
            None => format!("chmod o-rwx {} (0600, or 0640 with the pipeline's group)", self.file.display()),
        }
    }
}

impl std::fmt::Display for Exposed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.problem(), self.fix())
    }
}

/// Whether a secret file (tokens, a password, a private key, identities) is exposed: others
/// may read or write it.
pub fn exposed_secret(file: &Path) -> Option<Exposed> {
    let meta = std::fs::metadata(file).ok()?;
    let mode = meta.permissions().mode() & 0o777;
    let foreign_owner = (!trusted_owner(meta.uid())).then_some(meta.uid());
    (mode & OTHERS_ANY != 0 || foreign_owner.is_some()).then(|| Exposed {
        mode,
        foreign_owner,
        file: file.to_path_buf(),
    })
}

/// Warns (once per file per process) when others may read or write the secret file `file`;
/// `what` says what it is (`the token file`, `the ZooKeeper auth file`). The file is still
/// used: refusing it would stop a pipeline over a mode, where a warning lets the operator fix it.
pub fn warn_if_exposed(file: &Path, what: &str) {
    static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let Some(reason) = exposed_secret(file) else { return };
    let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.get_or_insert_with(HashSet::new).insert(file.to_path_buf()) {
        tracing::warn!("{what} {} is not private: {reason}", file.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_config_file_others_can_change_is_untrusted_naming_mode_and_fix() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("autocomp.toml");
        std::fs::write(&file, "").unwrap();
        chmod(&file, 0o644);
        assert_eq!(untrusted_config(&file), None);
        chmod(&file, 0o666);
        let reason = untrusted_config(&file).unwrap();
        assert!(reason.contains("mode 666") && reason.contains("chmod o-w"), "{reason}");
        assert_eq!(untrusted_config(&dir.path().join("absent.toml")), None);
    }

    #[test]
    fn a_symlink_into_a_world_writable_directory_is_untrusted_unless_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::write(open.join("real.toml"), "").unwrap();
        chmod(&open.join("real.toml"), 0o644);
        chmod(&open, 0o777);
        let link = dir.path().join("autocomp.toml");
        std::os::unix::fs::symlink(open.join("real.toml"), &link).unwrap();
        let reason = untrusted_config(&link).unwrap();
        assert!(reason.contains("mode 777") && reason.contains("a symlink to"), "{reason}");
        chmod(&open, 0o1777);
        assert_eq!(untrusted_config(&link), None);
        chmod(&open.join("real.toml"), 0o646);
        assert!(untrusted_config(&link).unwrap().contains("mode 646"));
    }

    #[test]
    fn a_link_on_the_way_or_an_ancestor_anyone_can_write_is_untrusted() {
        let dir = tempfile::tempdir().unwrap();
        let (open, safe) = (dir.path().join("open"), dir.path().join("safe"));
        std::fs::create_dir(&open).unwrap();
        std::fs::create_dir(&safe).unwrap();
        std::fs::write(safe.join("real.toml"), "").unwrap();
        chmod(&safe.join("real.toml"), 0o644);
        // autocomp.toml -> open/hop -> safe/real.toml: anyone may replace the hop.
        std::os::unix::fs::symlink(safe.join("real.toml"), open.join("hop")).unwrap();
        let link = dir.path().join("autocomp.toml");
        std::os::unix::fs::symlink(open.join("hop"), &link).unwrap();
        chmod(&open, 0o777);
        assert!(untrusted_config(&link).unwrap().contains(&open.display().to_string()));
        chmod(&open, 0o755);
        assert_eq!(untrusted_config(&link), None);
        // A file below a directory anyone may rename things in.
        std::fs::create_dir(open.join("etc")).unwrap();
        std::fs::write(open.join("etc/autocomp.toml"), "").unwrap();
        chmod(&open.join("etc/autocomp.toml"), 0o644);
        chmod(&open, 0o777);
        assert!(untrusted_config(&open.join("etc/autocomp.toml")).unwrap().contains("mode 777"));
        chmod(&open, 0o755);
    }

    /// Run as root (as CI runs the suite): a file, a directory or a symlink on the way that
    /// another user owns makes a config file untrusted and a secret file exposed.
    #[test]
    fn a_file_or_a_way_another_user_owns_is_untrusted() {
        use std::os::unix::fs::lchown;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test runs as root, as CI runs the suite (it gives files to uid 65534)");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("autocomp.toml");
        std::fs::write(&file, "").unwrap();
        chmod(&file, 0o644);
        assert_eq!(untrusted_config(&file), None);
        lchown(&file, Some(65534), None).unwrap();
        assert!(untrusted_config(&file).unwrap().contains("owned by uid 65534"));
        assert!(exposed_secret(&file).unwrap().problem().contains("uid 65534"));
        lchown(&file, Some(0), None).unwrap();
        // A symlink another user owns (in a sticky directory it could still replace it).
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(untrusted_config(&link), None);
        lchown(&link, Some(65534), None).unwrap();
        assert!(untrusted_config(&link).unwrap().contains("owned by uid 65534"));
        // A directory on the way another user owns.
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join("autocomp.toml"), "").unwrap();
        chmod(&theirs.join("autocomp.toml"), 0o644);
        lchown(&theirs, Some(65534), None).unwrap();
        assert!(untrusted_config(&theirs.join("autocomp.toml")).unwrap().contains("owned by uid 65534"));
    }

    #[test]
    fn a_secret_file_others_can_read_is_exposed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t").unwrap();
        for (mode, exposed) in [(0o600, false), (0o640, false), (0o644, true), (0o602, true)] {
            chmod(&file, mode);
            assert_eq!(exposed_secret(&file).is_some(), exposed, "{mode:o}");
        }
    }
}
