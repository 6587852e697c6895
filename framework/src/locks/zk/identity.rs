//! The pipeline's ZooKeeper identities: `user:password` lines from `auth_file` or
//! `$AUTOCOMP_ZK_AUTH`, the digest ids ZooKeeper computes of them, and the ACL they make.
//! Apart so the secret stays in one small room (messages name the source, never a line).

use autocomp_model::InvalidInput;
use zookeeper_client as zk;

use super::AUTH_ENV;
use super::url::ZkUrl;
use crate::locks::LockError;

/// The pipeline's ZooKeeper identities, as read from the auth file or the environment: each
/// a `user:password` sent with the digest scheme.
pub(super) struct Identities {
    /// `auth_file=/path` or `$AUTOCOMP_ZK_AUTH`, for messages (never the secret).
    pub(super) source: String,
    pub(super) credentials: Vec<String>,
}

impl Identities {
    /// Reads the identities the URL or the environment names; `None` if neither does.
    pub(super) fn load(target: &ZkUrl) -> Result<Option<Self>, LockError> {
        let (source, text) = match &target.auth_file {
            Some(path) => {
                let source = format!("auth_file={}", path.display());
                let text = std::fs::read_to_string(path)
                    .map_err(|e| invalid_auth(&source, &format!("cannot be read: {e}")))?;
                autocomp_toolkit::file_modes::warn_if_exposed(path, "the ZooKeeper auth file");
                (source, text)
            }
            None => match std::env::var(AUTH_ENV) {
                Ok(text) if !text.trim().is_empty() => (format!("${AUTH_ENV}"), text),
                _ => return Ok(None),
            },
        };
        let credentials: Vec<String> =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect();
        if credentials.is_empty() {
            return Err(invalid_auth(&source, "holds no user:password line"));
        }
        for (n, line) in credentials.iter().enumerate() {
            let well_formed =
                line.split_once(':').is_some_and(|(user, password)| !user.is_empty() && !password.is_empty());
            if !well_formed {
                // Never the line itself: it is a secret, or most of one.
                return Err(invalid_auth(&source, &format!("line {} is not user:password", n + 1)));
            }
        }
        Ok(Some(Self { source, credentials }))
    }

    /// The users, for logs (the passwords never leave this struct except to the server).
    pub(super) fn users(&self) -> Vec<&str> {
        self.credentials.iter().filter_map(|c| c.split_once(':').map(|(user, _)| user)).collect()
    }
}

/// A refused identity source, named by where it came from (never the secret).
fn invalid_auth(source: &str, reason: &str) -> LockError {
    InvalidInput::new("ZooKeeper identity", source, reason.to_owned()).into()
}

/// The id ZooKeeper's digest provider gives `user:password`: `user:base64(sha1(user:password))`.
pub(super) fn digest_id(credential: &str) -> String {
    use sha1::Digest as _;
    let user = credential.split_once(':').map_or(credential, |(user, _)| user);
    format!("{user}:{}", base64(&sha1::Sha1::digest(credential.as_bytes())))
}

/// Standard base64 with padding (a digest is all it encodes; not worth a dependency).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// All rights for each of our digest ids, read for the world.
pub(super) fn pipeline_acl(digests: &[String]) -> Vec<zk::Acl> {
    let ours = digests.iter().map(|id| zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", id)));
    ours.chain([zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone())]).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn digest_ids_are_what_zookeepers_digest_provider_computes() {
        // As `printf %s super:secret | openssl dgst -sha1 -binary | openssl base64` says.
        assert_eq!(digest_id("super:secret"), "super:lK75jTNcA+U9vtVEw5vB51mj/w4=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abcd"), "YWJjZA==");
    }

    #[test]
    fn identities_are_user_password_lines_and_errors_never_show_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("zk-auth");
        let url = |file: &Path| ZkUrl::parse(&format!("zk://zk1:2181/a?auth_file={}", file.display())).unwrap();
        std::fs::write(&file, "# rotation: new first\nautocomp:new-secret\n\nautocomp:old-secret\n").unwrap();
        let ids = Identities::load(&url(&file)).unwrap().unwrap();
        assert_eq!(ids.credentials, ["autocomp:new-secret", "autocomp:old-secret"]);
        assert_eq!(ids.users(), ["autocomp", "autocomp"]);
        for (text, expected) in [
            ("", "holds no user:password line"),
            ("autocomp\n", "line 1 is not user:password"),
            ("a:b\n:secret-only\n", "line 2 is not user:password"),
            ("user-only:\n", "line 1"),
        ] {
            std::fs::write(&file, text).unwrap();
            let error = Identities::load(&url(&file)).err().unwrap().to_string();
            assert!(error.contains(expected) && error.contains("auth_file="), "{text:?}: {error}");
            assert!(!error.contains("secret-only") && !error.contains("user-only"), "{error}");
        }
        let error = Identities::load(&url(&dir.path().join("missing"))).err().unwrap().to_string();
        assert!(error.contains("missing") && error.contains("cannot be read"), "{error}");
    }
}
