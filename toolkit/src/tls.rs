//! TLS for the services and their clients, always rustls with ring: a service's certificate
//! and key (PEM), reloaded when the files change or on SIGHUP without touching connections
//! in flight, and optional client certificates (mTLS); the roots an `https://` client trusts
//! (webpki's, the system store's, `$AUTOCOMP_CA_FILE`) and its own certificate for mTLS.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use autocomp_model::InvalidInput;

use crate::reload::Reloaded;

/// ring, named explicitly: another crate of the process may bring rustls's other provider,
/// and then `builder()` without one panics.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file; the error is the reason alone (callers name the file).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates: {}", pem_error(e)))?;
    if certs.is_empty() {
        return Err("no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)".into());
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    crate::file_modes::warn_if_exposed(path, "the private key");
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("cannot read a private key: {}", pem_error(e)))
}

/// `reason` prefixed with the flag and the path it is about.
fn flagged(flag: &str, path: &Path) -> impl Fn(String) -> String {
    let prefix = format!("{flag} {}", path.display());
    move |reason| format!("{prefix}: {reason}")
}

fn pem_error(error: rustls::pki_types::pem::Error) -> String {
    match error {
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".into(),
        other => other.to_string(),
    }
}

/// A service's TLS files, as its flags name them.
#[derive(Debug, Clone)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Only clients with a certificate this CA signed may connect.
    pub client_ca: Option<PathBuf>,
}

impl ServerTlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }

    /// The configuration the files say now; an error names the flag and the path.
    pub fn config(&self) -> Result<Arc<ServerConfig>, String> {
        let certs = read_certs(&self.cert).map_err(flagged("--tls-cert", &self.cert))?;
        let key = read_key(&self.key).map_err(flagged("--tls-key", &self.key))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(path).map_err(flagged("--tls-client-ca", path))? {
                    roots.add(cert).map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("--tls-cert {} with --tls-key {}: {e}", self.cert.display(), self.key.display()))?;
        // The connection loop speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A service's TLS: the configuration new connections get, swapped when the files change
/// or on SIGHUP. A connection keeps the configuration it was accepted with, so a reload
/// drops none.
pub struct ServerTls {
    config: Arc<Reloaded<Arc<ServerConfig>>>,
}

impl ServerTls {
    /// Reads the files; an error (exit 2 at start) names the flag and the path.
    pub fn load(files: ServerTlsFiles) -> Result<Arc<Self>, String> {
        let paths = files.paths().map(Path::to_path_buf).collect();
        let config = Reloaded::new("the TLS certificate", paths, move || files.config())?;
        Ok(Arc::new(Self { config }))
    }

    /// The acceptor for a connection arriving now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&*self.config.current()))
    }

    /// Reads the files again if they changed since last read (or always, when `forced`).
    pub fn reload(&self, forced: bool) -> bool {
        self.config.reload(forced)
    }

    /// Reloads on a change of the files (looked at every 2 s) and on SIGHUP, for as long as
    /// the service runs. Call within a tokio runtime.
    pub fn watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        self.config.watch()
    }
}

/// What an `https://` client trusts and shows, from the environment: `$AUTOCOMP_CA_FILE`
/// (a PEM bundle, trusted besides webpki's roots and the system store), and for mTLS
/// `$AUTOCOMP_CLIENT_CERT` with `$AUTOCOMP_CLIENT_KEY`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl ClientTls {
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Self {
            ca_file: var("AUTOCOMP_CA_FILE"),
            client_cert: var("AUTOCOMP_CLIENT_CERT"),
            client_key: var("AUTOCOMP_CLIENT_KEY"),
        }
    }

    /// The rustls configuration; a file that cannot be used is bad input naming its
    /// variable and path.
    pub fn config(&self) -> Result<ClientConfig, InvalidInput> {
        let invalid =
            |field: &str, path: &Path, reason: String| InvalidInput::new(field, path.display().to_string(), reason);
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in system_roots() {
            // The system store may hold certificates rustls cannot use: skip those.
            let _ = roots.add(cert.clone());
        }
        if let Some(path) = &self.ca_file {
            let certs = read_certs(path).map_err(|e| invalid("AUTOCOMP_CA_FILE", path, e))?;
            for cert in certs {
                roots.add(cert).map_err(|e| invalid("AUTOCOMP_CA_FILE", path, format!("not a CA certificate: {e}")))?;
            }
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| InvalidInput::new("TLS", "", e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match (&self.client_cert, &self.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let certs = read_certs(cert).map_err(|e| invalid("AUTOCOMP_CLIENT_CERT", cert, e))?;
                let key_der = read_key(key).map_err(|e| invalid("AUTOCOMP_CLIENT_KEY", key, e))?;
                builder.with_client_auth_cert(certs, key_der).map_err(|e| {
                    invalid("AUTOCOMP_CLIENT_KEY", key, format!("does not go with AUTOCOMP_CLIENT_CERT: {e}"))
                })?
            }
            (Some(cert), None) => {
                let reason = format!("unset, while AUTOCOMP_CLIENT_CERT is {}: set both or neither", cert.display());
                return Err(InvalidInput::new("AUTOCOMP_CLIENT_KEY", "", reason));
            }
            (None, Some(key)) => {
                let reason = format!("unset, while AUTOCOMP_CLIENT_KEY is {}: set both or neither", key.display());
                return Err(InvalidInput::new("AUTOCOMP_CLIENT_CERT", "", reason));
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The system's trust store, read once per process (it is a directory of files). What
/// cannot be read is logged and left out: webpki's roots and `$AUTOCOMP_CA_FILE` remain.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if let Some(error) = found.errors.first() {
            tracing::debug!(errors = found.errors.len(), "reading the system's trust store: {error}");
        }
        found.certs
    })
}
