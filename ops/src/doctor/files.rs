//! The doctor's checks of files on this host: secret and key files (readable by this user,
//! by no one else, strong enough), certificates (valid now and for longer than the warning
//! window) and free space where the pipeline writes.

use std::path::Path;
use std::time::{Duration, SystemTime};

use autocomp_http::service::{MIN_TOKEN_CHARS, Tokens};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use x509_cert::der::Decode;

use super::Check;

/// What a file is, which decides how it is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Bearer tokens, one a line (`$AUTOCOMP_TOKEN_FILE`, a service's `--token-file`).
    Tokens,
    /// One password or shared secret (`password_file=`, notify.toml's `password_file` and
    /// `secret_file`).
    Password,
    /// ZooKeeper `user:password` lines (`auth_file=`).
    ZooKeeperIdentities,
    /// A PEM private key (`key_file=`, `$AUTOCOMP_CLIENT_KEY`, a service's `--tls-key`).
    PrivateKey,
    /// PEM certificates (a CA bundle or a certificate chain).
    Certificate,
    /// Anything else that must stay private (the monitor's users file).
    Secret,
}

impl FileKind {
    fn noun(self) -> &'static str {
        match self {
            FileKind::Tokens => "token file",
            FileKind::Password => "password file",
            FileKind::ZooKeeperIdentities => "ZooKeeper identity file",
            FileKind::PrivateKey => "private key",
            FileKind::Certificate => "certificate",
            FileKind::Secret => "secret file",
        }
    }
}

/// Shortest password or shared secret accepted (as for tokens and monitor passwords).
const MIN_SECRET_CHARS: usize = 12;

/// Checks one named file as its kind says.
pub fn check_file(kind: FileKind, path: &Path, expires_within: Duration) -> Check {
    let check = format!("{} {}", kind.noun(), path.display());
    // A FIFO or a device would block the read, or never end it.
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return Check::fail(check, "not a regular file", "point the setting at the file itself");
    }
    let text = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => {
            return Check::fail(
                check,
                format!("cannot read it: {e}"),
                "make it readable by the pipeline's user (chown root:autocomp, chmod 640), or fix the path",
            );
        }
    };
    // The rule the pipeline warns by when it reads the file (one check for both).
    if kind != FileKind::Certificate
        && let Some(reason) = autocomp_toolkit::file_modes::exposed_secret(path)
    {
        return Check::fail(check, reason.problem(), reason.fix());
    }
    let text = String::from_utf8_lossy(&text);
    match kind {
        FileKind::Certificate => certificates(check, &text, expires_within),
        FileKind::PrivateKey => match PrivateKeyDer::from_pem_slice(text.as_bytes()) {
            Ok(_) => Check::ok(check, "a PEM private key, readable by this user only and its group"),
            Err(e) => Check::fail(check, format!("no PEM private key in it: {e:?}"), "point it at the key file"),
        },
        FileKind::Tokens => match Tokens::parse(&text, &path.display().to_string()) {
            Ok(_) => Check::ok(check, format!("tokens of at least {MIN_TOKEN_CHARS} characters, private")),
            Err(reason) => Check::fail(check, reason, "write long random tokens (`openssl rand -hex 32`)"),
        },
        FileKind::Password => {
            let secret = text.lines().next().unwrap_or("").trim_end_matches('\r');
            strength(check, secret.chars().count(), "one line")
        }
        FileKind::ZooKeeperIdentities => {
            let lines: Vec<&str> =
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
            let shortest = lines.iter().map(|l| l.split_once(':').map_or(0, |(_, pw)| pw.chars().count())).min();
            if lines.iter().any(|line| !line.contains(':')) {
                return Check::fail(check, "a line is not user:password", "one user:password a line");
            }
            strength(check, shortest.unwrap_or(0), &format!("{} identities", lines.len()))
        }
        FileKind::Secret if text.trim().is_empty() => Check::fail(check, "empty", "fill it, or fix the path"),
        FileKind::Secret => Check::ok(check, "readable by this user, private"),
    }
}

fn strength(check: String, chars: usize, what: &str) -> Check {
    if chars >= MIN_SECRET_CHARS {
        Check::ok(check, format!("{what}, at least {MIN_SECRET_CHARS} characters, private"))
    } else {
        Check::fail(
            check,
            format!("{what}: a secret of {chars} characters, fewer than {MIN_SECRET_CHARS}"),
            "use a long random one (`openssl rand -base64 24`) and change it where it is checked",
        )
    }
}

/// Every certificate in a PEM file is valid now and for longer than `expires_within`.
fn certificates(check: String, text: &str, expires_within: Duration) -> Check {
    let now = SystemTime::now();
    let mut soonest: Option<(SystemTime, String)> = None;
    let mut count = 0;
    for der in CertificateDer::pem_slice_iter(text.as_bytes()) {
        let der = match der {
            Ok(der) => der,
            Err(e) => return Check::fail(check, format!("not PEM certificates: {e:?}"), "point it at a PEM file"),
        };
        let certificate = match x509_cert::Certificate::from_der(der.as_ref()) {
            Ok(certificate) => certificate,
            Err(e) => return Check::fail(check, format!("a certificate does not parse: {e}"), "replace it"),
        };
        count += 1;
        let subject = certificate.tbs_certificate.subject.to_string();
        let validity = certificate.tbs_certificate.validity;
        if validity.not_before.to_system_time() > now {
            return Check::fail(
                check,
                format!("{subject} is not valid before {}", date(validity.not_before.to_system_time())),
                "check this host's clock, or use a certificate valid now",
            );
        }
        let not_after = validity.not_after.to_system_time();
        if soonest.as_ref().is_none_or(|(at, _)| not_after < *at) {
            soonest = Some((not_after, subject));
        }
    }
    let Some((not_after, subject)) = soonest else {
        return Check::fail(check, "no PEM certificate in it", "point it at the PEM certificate file");
    };
    let left = not_after.duration_since(now).unwrap_or_default();
    let days = left.as_secs() / 86_400;
    let detail = format!("{count} certificate(s); {subject} expires on {} (in {days} days)", date(not_after));
    if not_after <= now {
        Check::fail(check, format!("{subject} expired on {}", date(not_after)), "renew it")
    } else if left < expires_within {
        Check::fail(
            check,
            format!("{detail}, within {}", days_or_less(expires_within)),
            "renew it now: the services pick a renewed file up without a restart",
        )
    } else {
        Check::ok(check, detail)
    }
}

/// `30 days` (whole days), else as humantime writes it (`12h`).
fn days_or_less(window: Duration) -> String {
    let days = window.as_secs() / 86_400;
    if days >= 1 && window.as_secs().is_multiple_of(86_400) {
        format!("{days} days")
    } else {
        humantime::format_duration(window).to_string()
    }
}

fn date(at: SystemTime) -> String {
    let secs = at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    chrono::DateTime::from_timestamp(i64::try_from(secs).unwrap_or(i64::MAX), 0)
        .map_or_else(|| "?".to_owned(), |at| at.format("%Y-%m-%d %H:%M UTC").to_string())
}

/// Free space for this user on each filesystem holding one of `dirs` (a directory not made
/// yet counts where its nearest existing parent is): one check per filesystem.
pub fn free_space(dirs: &[std::path::PathBuf], min_free: u64) -> Vec<Check> {
    use std::os::unix::fs::MetadataExt;
    let mut filesystems: Vec<(u64, Vec<&Path>)> = Vec::new();
    for dir in dirs {
        let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
        let device = std::fs::metadata(existing).map_or(0, |meta| meta.dev());
        match filesystems.iter_mut().find(|(dev, _)| *dev == device) {
            Some((_, paths)) => paths.push(dir),
            None => filesystems.push((device, vec![dir])),
        }
    }
    filesystems.into_iter().map(|(_, paths)| free_space_of(&paths, min_free)).collect()
}

fn free_space_of(dirs: &[&Path], min_free: u64) -> Check {
    let shown: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
    let check = format!("disk {}", shown.join(", "));
    let existing = dirs[0].ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let Ok(c_path) = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()) else {
        return Check::fail(check, "the path holds a NUL byte", "fix the URL");
    };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills in.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        let e = std::io::Error::last_os_error();
        return Check::fail(check, format!("cannot read its filesystem: {e}"), "check the path");
    }
    // The fields' types differ between platforms (u32 on some 32-bit ones).
    #[allow(clippy::useless_conversion)]
    let (free, total) = (
        u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)),
        u64::from(stat.f_blocks).saturating_mul(u64::from(stat.f_frsize)),
    );
    let detail = format!("{} free of {}", bytes(free), bytes(total));
    if free >= min_free {
        Check::ok(check, detail)
    } else {
        Check::fail(
            check,
            format!("{detail}, less than {}", bytes(min_free)),
            "free space or grow the filesystem: a full disk stops the store's writes",
        )
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Whether this user may write `file` and make files beside it (SQLite's `-wal` and `-shm`).
pub fn writable(file: &Path) -> Result<(), String> {
    for (path, what) in [(file, "the store file"), (file.parent().unwrap_or(Path::new("/")), "its directory")] {
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
            return Err(format!("{} holds a NUL byte", path.display()));
        };
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("this user cannot write {what} {}: {e}", path.display()));
        }
    }
    Ok(())
}

/// The owner of the first of `paths` that exists, if it is not this process's user: what a
/// doctor run as root must not make files under (they would be root's).
pub fn owned_by_another(paths: &[&Path]) -> Option<(u32, std::path::PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let (path, meta) = paths.iter().find_map(|path| std::fs::metadata(path).ok().map(|meta| (path, meta)))?;
    (meta.uid() != me).then(|| (meta.uid(), path.to_path_buf()))
}
