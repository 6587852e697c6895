//! The syntax of a locks URL, `zk[s]://host:port[,host:port...]/chroot[?option=value&...]`:
//! apart from the session so `autocomp doctor` can read one without connecting.

use std::path::PathBuf;
use std::time::Duration;

use autocomp_model::InvalidInput;
use autocomp_toolkit::redact::display_url;

use super::tls::ZkTls;
use super::{AUTH_ENV, DEFAULT_SESSION_TIMEOUT};

/// A parsed `zk://` or `zks://` locks URL. It never holds a secret: the identity is read
/// from `auth_file` (or `$AUTOCOMP_ZK_AUTH`) at connect, so the URL can be shown as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `host:port[,host:port...]`, as the client connects.
    pub hosts: String,
    /// The chroot every lock node lives under, e.g. `/autocomp` (no trailing slash).
    pub root: String,
    /// The session timeout asked for (the server clamps it to its own min/max).
    pub session_timeout: Duration,
    /// `zks://`: every server over TLS, with these files.
    pub tls: Option<ZkTls>,
    /// `auth_file=`: a file of `user:password` lines, the pipeline's digest identities.
    pub auth_file: Option<PathBuf>,
}

impl ZkUrl {
    /// `zk[s]://host:port[,host:port...]/chroot[?option=value&...]`; options: `session_timeout`
    /// (e.g. `10s`), `auth_file`, and with `zks://` `ca_file` (required), `cert_file` and
    /// `key_file` (together).
    pub fn parse(url: &str) -> Result<Self, InvalidInput> {
        let invalid = |reason: String| InvalidInput::new("locks url", display_url(url), reason);
        let (secure, rest) = match (url.strip_prefix("zk://"), url.strip_prefix("zks://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(invalid(format!("not a zk:// or zks:// URL; {SHAPE}"))),
        };
        let (rest, query) = rest.split_once('?').map_or((rest, None), |(rest, query)| (rest, Some(query)));
        let Some((hosts, chroot)) = rest.split_once('/') else {
            return Err(invalid(format!("names no chroot; {SHAPE}")));
        };
        check_hosts(hosts).map_err(&invalid)?;
        let chroot = check_chroot(chroot).map_err(&invalid)?;
        let options = Options::parse(query.unwrap_or_default(), secure).map_err(&invalid)?;
        let tls = options.tls(secure).map_err(&invalid)?;
        let Options { session_timeout, auth_file, .. } = options;
        Ok(Self { hosts: hosts.to_owned(), root: format!("/{chroot}"), session_timeout, tls, auth_file })
    }
}

/// How a locks URL is written, for the messages about one that is not.
const SHAPE: &str = "write zk[s]://host:port[,host:port...]/chroot, e.g. zk://127.0.0.1:2181/autocomp";

/// `host:port[,host:port...]`, without credentials; why not, if not.
fn check_hosts(hosts: &str) -> Result<(), String> {
    if hosts.contains('@') {
        return Err(format!(
            "carries credentials; a locks URL must not hold a secret: put `user:password` in a file \
             named by ?auth_file=/path, or in ${AUTH_ENV}"
        ));
    }
    if hosts.is_empty() {
        return Err(format!("names no host; {SHAPE}"));
    }
    for host in hosts.split(',') {
        let port_ok = match host.rsplit_once(':') {
            Some((name, port)) => !name.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
            None => !host.is_empty(),
        };
        if !port_ok {
            return Err(format!("{host:?} is not a host:port; {SHAPE}"));
        }
    }
    Ok(())
}

/// The chroot without its trailing slashes; why it is not one, if not.
fn check_chroot(chroot: &str) -> Result<&str, String> {
    let chroot = chroot.trim_end_matches('/');
    if chroot.is_empty() {
        return Err(format!("names no chroot; {SHAPE}"));
    }
    if chroot.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(format!("the chroot /{chroot} has an empty, `.` or `..` part"));
    }
    if chroot.split('/').next() == Some("zookeeper") {
        return Err("/zookeeper belongs to ZooKeeper itself; choose another chroot".into());
    }
    Ok(chroot)
}

/// The options of a locks URL's query, as written.
struct Options {
    session_timeout: Duration,
    auth_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl Options {
    /// `option=value&...`; the TLS options only with `zks://` (`secure`).
    fn parse(query: &str, secure: bool) -> Result<Self, String> {
        let mut options = Options {
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            auth_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        };
        let file = |option: &str, value: &str| {
            if value.is_empty() { Err(format!("{option}= names no file")) } else { Ok(Some(PathBuf::from(value))) }
        };
        for option in query.split('&').filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("session_timeout", value)) => {
                    options.session_timeout = humantime::parse_duration(value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| format!("session_timeout={value} is not a duration like 10s"))?;
                }
                Some(("auth_file", value)) => options.auth_file = file("auth_file", value)?,
                Some((name @ ("ca_file" | "cert_file" | "key_file"), _)) if !secure => {
                    return Err(format!("{name} is a TLS option: write zks:// to connect over TLS"));
                }
                Some(("ca_file", value)) => options.ca_file = file("ca_file", value)?,
                Some(("cert_file", value)) => options.cert_file = file("cert_file", value)?,
                Some(("key_file", value)) => options.key_file = file("key_file", value)?,
                _ => {
                    return Err(format!(
                        "unknown option {option:?}; the options are session_timeout (e.g. ?session_timeout=10s), \
                         auth_file, and with zks:// ca_file, cert_file and key_file"
                    ));
                }
            }
        }
        Ok(options)
    }

    /// The TLS files of a `zks://` URL (`secure`): a CA required, a client certificate and
    /// its key together or not at all.
    fn tls(&self, secure: bool) -> Result<Option<ZkTls>, String> {
        let (ca_file, cert_file, key_file) = (self.ca_file.clone(), self.cert_file.clone(), self.key_file.clone());
        match (secure, ca_file, cert_file, key_file) {
            (false, ..) => Ok(None),
            (true, None, ..) => Err("zks:// needs ca_file=/path/to/ca.pem, the CA of the servers' certificates".into()),
            (true, Some(ca_file), Some(cert), Some(key)) => Ok(Some(ZkTls { ca_file, client: Some((cert, key)) })),
            (true, Some(ca_file), None, None) => Ok(Some(ZkTls { ca_file, client: None })),
            (true, Some(_), ..) => Err("cert_file and key_file go together: name both or neither".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn urls_name_hosts_chroot_and_session_timeout() {
        let url = ZkUrl::parse("zk://10.0.0.1:2181,10.0.0.2:2182/apps/autocomp/?session_timeout=4s").unwrap();
        assert_eq!(url.hosts, "10.0.0.1:2181,10.0.0.2:2182");
        assert_eq!(url.root, "/apps/autocomp");
        assert_eq!(url.session_timeout, Duration::from_secs(4));
        let url = ZkUrl::parse("zk://zk.example:2181/autocomp").unwrap();
        assert_eq!((url.root.as_str(), url.session_timeout), ("/autocomp", DEFAULT_SESSION_TIMEOUT));
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, expected) in [
            ("zk://127.0.0.1:2181", "names no chroot"),
            ("zk://127.0.0.1:2181/", "names no chroot"),
            ("zk:///autocomp", "names no host"),
            ("zk://127.0.0.1:port/autocomp", "not a host:port"),
            ("zk://127.0.0.1:2181,/autocomp", "not a host:port"),
            ("zk://127.0.0.1:2181/a//b", "empty, `.` or `..`"),
            ("zk://127.0.0.1:2181/a/../b", "empty, `.` or `..`"),
            ("zk://127.0.0.1:2181/zookeeper", "belongs to ZooKeeper"),
            ("zk://127.0.0.1:2181/a?session_timeout=soon", "session_timeout=soon"),
            ("zk://127.0.0.1:2181/a?session_timeout=0s", "session_timeout=0s"),
            ("zk://127.0.0.1:2181/a?timeout=4s", "unknown option \"timeout=4s\""),
            ("http://127.0.0.1:2181/a", "not a zk:// or zks:// URL"),
            ("zk://127.0.0.1:2181/a?auth_file=", "auth_file= names no file"),
            ("zk://127.0.0.1:2181/a?ca_file=/ca.pem", "ca_file is a TLS option: write zks://"),
            ("zks://127.0.0.1:2281/a", "zks:// needs ca_file="),
            ("zks://127.0.0.1:2281/a?ca_file=/ca.pem&cert_file=/c.pem", "cert_file and key_file go together"),
            ("zks://127.0.0.1:2281/a?ca_file=/ca.pem&key_file=/c.key", "cert_file and key_file go together"),
        ] {
            let error = ZkUrl::parse(url).unwrap_err().to_string();
            assert!(error.contains(expected) && error.contains("locks url"), "{url}: {error}");
        }
    }

    #[test]
    fn tls_and_identity_options_name_files_never_secrets() {
        let url = ZkUrl::parse(concat!(
            "zks://zk1:2281,zk2:2281/autocomp?auth_file=/etc/autocomp/zk-auth",
            "&ca_file=/ca.pem&cert_file=/c.pem&key_file=/c.key"
        ))
        .unwrap();
        assert_eq!(url.hosts, "zk1:2281,zk2:2281");
        assert_eq!(url.auth_file.as_deref(), Some(Path::new("/etc/autocomp/zk-auth")));
        let tls = url.tls.unwrap();
        assert_eq!(tls.ca_file, Path::new("/ca.pem"));
        assert_eq!(tls.client, Some((PathBuf::from("/c.pem"), PathBuf::from("/c.key"))));
        assert_eq!(ZkUrl::parse("zks://zk1:2281/a?ca_file=/ca.pem").unwrap().tls.unwrap().client, None);
        assert_eq!(ZkUrl::parse("zk://zk1:2181/a").unwrap().tls, None);

        // A password in the URL is refused, and the error does not repeat it.
        let error = ZkUrl::parse("zk://autocomp:hunter2@zk1:2181/autocomp").unwrap_err().to_string();
        assert!(error.contains("auth_file") && error.contains("AUTOCOMP_ZK_AUTH"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }
}
