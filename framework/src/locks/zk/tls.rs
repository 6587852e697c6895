//! Why a `zks://` ensemble cannot be trusted, when that is why no session comes: the
//! ZooKeeper client retries a handshake its verifier refuses as it retries a server that is
//! down, and answers `Timeout` a session timeout later, the certificate error dropped. A
//! server whose certificate fails verification (unknown CA, wrong host name, expired) is a
//! configuration error: exit 2 at once, never an outage to wait out.
//!
//! So when no session has come within `PROBE_AFTER`, one TLS handshake per server is made
//! here, as the client makes it (the CA of `ca_file`, the host name checked, the client
//! certificate if the URL names one), and the error is judged by its type
//! (`rustls::Error::InvalidCertificate`), never by its text. Only when every server's
//! certificate fails does it say so: one impostor or stale certificate in an ensemble whose
//! other servers answer is not a reason to stop (the session comes from another server).

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use autocomp_model::InvalidInput;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client as zk;

use crate::locks::LockError;

/// The files of a `zks://` URL (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkTls {
    /// `ca_file=`: the CA certificates the servers' certificates must chain to.
    pub ca_file: PathBuf,
    /// `cert_file=` and `key_file=`: a client certificate, for servers that ask for one.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// How long a `zks://` connect waits for its session before the handshakes are tried on their
/// own: a healthy ensemble answers well within it, so a pass costs no extra handshake.
pub(super) const PROBE_AFTER: Duration = Duration::from_secs(1);
/// Each probe's bound on connecting and on the handshake.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The verification failure of every server of `hosts` (`host:port,...`), as the reason a
/// `zks://` URL is refused; `None` if any server verified, or could not be asked (down,
/// silent, refused us for another reason: that is the session's to report).
pub(super) async fn untrusted(hosts: &str, tls: &ZkTls) -> Option<String> {
    let config = match client_config(tls) {
        Ok(config) => Arc::new(config),
        // The ZooKeeper client read the same files: it says what is wrong with them.
        Err(_) => return None,
    };
    let probes: Vec<_> = hosts
        .split(',')
        .map(|host| {
            let (host, config) = (host.to_owned(), Arc::clone(&config));
            tokio::task::spawn_blocking(move || handshake(&host, config).map_err(|e| (host, e)))
        })
        .collect();
    let mut failures = Vec::new();
    for probe in probes {
        match probe.await {
            Ok(Err((host, error))) => match certificate_error(&error) {
                Some(reason) => failures.push(format!("{host}: {reason}")),
                None => return None,
            },
            _ => return None,
        }
    }
    Some(format!(
        "the server's certificate is not trusted: {} (ca_file={})",
        failures.join("; "),
        tls.ca_file.display()
    ))
}

/// What the ZooKeeper client builds from the same files (ring, as we install for it).
fn client_config(tls: &ZkTls) -> Result<rustls::ClientConfig, Box<dyn std::error::Error>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&tls.ca_file)? {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match &tls.client {
        Some((cert, key)) => builder.with_client_auth_cert(certificates(cert)?, PrivateKeyDer::from_pem_file(key)?)?,
        None => builder.with_no_client_auth(),
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, rustls::pki_types::pem::Error> {
    CertificateDer::pem_file_iter(path)?.collect()
}

/// One TLS handshake with `host` (`name:port`), closed once done.
fn handshake(host: &str, config: Arc<rustls::ClientConfig>) -> io::Result<()> {
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let address = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host name resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let mut connection = rustls::ClientConnection::new(config, server_name).map_err(io::Error::other)?;
    while connection.is_handshaking() {
        connection.complete_io(&mut stream)?;
    }
    connection.send_close_notify();
    connection.complete_io(&mut stream).ok();
    Ok(())
}

/// The reason, if the handshake failed because the server's certificate did not verify.
fn certificate_error(error: &io::Error) -> Option<String> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(reason) => Some(reason.to_string()),
        _ => None,
    }
}

/// `zks://`'s client options from its files; a file that cannot be read or parsed is named.
pub(super) fn tls_options(tls: &ZkTls) -> Result<zk::TlsOptions, LockError> {
    let read = |option: &str, path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::from(InvalidInput::new(
                "locks url",
                format!("{option}={}", path.display()),
                format!("cannot be read: {e}"),
            ))
        })
    };
    let bad = |option: &str, path: &Path, e: zk::Error| {
        LockError::from(InvalidInput::new(
            "locks url",
            format!("{option}={}", path.display()),
            format!("not usable PEM: {e}"),
        ))
    };
    let ca = read("ca_file", &tls.ca_file)?;
    let mut options = zk::TlsOptions::new().with_pem_ca(&ca).map_err(|e| bad("ca_file", &tls.ca_file, e))?;
    if let Some((cert_file, key_file)) = &tls.client {
        let (cert, key) = (read("cert_file", cert_file)?, read("key_file", key_file)?);
        options = options.with_pem_identity(&cert, &key).map_err(|e| bad("cert_file", cert_file, e))?;
    }
    Ok(options)
}
