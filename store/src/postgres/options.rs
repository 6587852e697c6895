//! A `postgres://` store URL: libpq's URL syntax (several hosts, `target_session_attrs`,
//! `sslmode`, `connect_timeout`, ...) plus autocomp's own options (`pool_size`, `retry_for`,
//! `migrate`). The password comes from the URL or `$PGPASSWORD` and never appears in an
//! error or a log: everything printed uses `target`, which has none.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};

use crate::port::{StoreError, StoreResult};
use autocomp_model::InvalidInput;

/// How TLS is used, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, without verifying its certificate (libpq's default).
    Prefer,
    /// TLS always, without verifying the certificate.
    Require,
    /// TLS always, the certificate verified against the CAs and the host name (verify-ca
    /// is treated as verify-full: rustls always checks the name).
    VerifyFull,
}

#[derive(Clone)]
pub struct PgOptions {
    pub config: tokio_postgres::Config,
    /// `user@host1:port,host2:port/database`: how errors and logs name the store.
    pub target: String,
    pub user: String,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    pub retry_for: Duration,
    /// Apply missing migrations on open (`migrate=false`: refuse an old schema instead).
    pub migrate: bool,
    pub tls: TlsMode,
    /// A PEM file of CA certificates for `verify-full` (default: the public web roots).
    pub root_certificates: Option<String>,
}

const OWN_OPTIONS: &str = "pool_size, retry_for, migrate, sslmode, sslrootcert, connect_timeout";
/// The libpq options tokio-postgres understands, passed on to it as they are.
const LIBPQ_OPTIONS: &[&str] = &[
    "user",
    "dbname",
    "host",
    "hostaddr",
    "port",
    "options",
    "application_name",
    "target_session_attrs",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "channel_binding",
    "load_balance_hosts",
];

impl PgOptions {
    pub fn parse(url: &str) -> StoreResult<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let shown = autocomp_http::display_url(base);
        let invalid = |reason: String| -> StoreError { InvalidInput::new("store url", shown.as_str(), reason).into() };
        let mut passed_on = Vec::new();
        let mut options = PgOptions {
            config: tokio_postgres::Config::new(),
            target: String::new(),
            user: String::new(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            migrate: true,
            tls: TlsMode::Prefer,
            root_certificates: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let duration = |value: &str| -> StoreResult<Duration> {
                // libpq writes connect_timeout in whole seconds; durations like 10s read too.
                match value.parse::<u64>() {
                    Ok(seconds) => Ok(Duration::from_secs(seconds)),
                    Err(_) => humantime::parse_duration(value).map_err(|e| invalid(format!("{key}={value:?}: {e}"))),
                }
            };
            match key {
                "pool_size" => {
                    options.pool_size = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| invalid(format!("pool_size={value:?} is not a number from 1 to 1000")))?;
                }
                "retry_for" => options.retry_for = duration(value)?,
                "connect_timeout" => options.connect_timeout = duration(value)?,
                "migrate" => {
                    options.migrate = match value {
                        "true" => true,
                        "false" => false,
                        other => return Err(invalid(format!("migrate={other:?} is not true or false"))),
                    }
                }
                "sslmode" => {
                    options.tls = match value {
                        "disable" => TlsMode::Disable,
                        "prefer" => TlsMode::Prefer,
                        "require" => TlsMode::Require,
                        "verify-ca" | "verify-full" => TlsMode::VerifyFull,
                        other => {
                            return Err(invalid(format!(
                                "sslmode={other:?} is not disable, prefer, require, verify-ca or verify-full"
                            )));
                        }
                    }
                }
                "sslrootcert" => options.root_certificates = Some(value.to_string()),
                "password" => return Err(invalid("put the password in the URL's user part or in $PGPASSWORD".into())),
                known if LIBPQ_OPTIONS.contains(&known) => passed_on.push(pair),
                unknown => {
                    return Err(invalid(format!(
                        "unknown option {unknown:?}; autocomp's own: {OWN_OPTIONS}; libpq's: {}",
                        LIBPQ_OPTIONS.join(", ")
                    )));
                }
            }
        }
        let rebuilt = if passed_on.is_empty() { base.to_string() } else { format!("{base}?{}", passed_on.join("&")) };
        let mut config = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
            // tokio-postgres names the offending option, never the password.
            invalid(format!("{e} (autocomp's own options: {OWN_OPTIONS})"))
        })?;
        if !(base.starts_with("postgres://") || base.starts_with("postgresql://")) {
            return Err(invalid("expected postgres://user@host[:port][,host2...]/database".into()));
        }
        let user = config
            .get_user()
            .map(str::to_string)
            .or_else(|| std::env::var("PGUSER").ok())
            .ok_or_else(|| invalid("names no user; write postgres://USER@host/database".into()))?;
        config.user(&user);
        if config.get_dbname().is_none() {
            return Err(invalid("names no database; write postgres://user@host/DATABASE".into()));
        }
        if config.get_hosts().is_empty() {
            return Err(invalid("names no host; write postgres://user@HOST/database".into()));
        }
        if config.get_password().is_none()
            && let Ok(password) = std::env::var("PGPASSWORD")
        {
            config.password(password);
        }
        config.connect_timeout(options.connect_timeout);
        config.ssl_mode(match options.tls {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            TlsMode::Require | TlsMode::VerifyFull => SslMode::Require,
        });
        if config.get_application_name().is_none() {
            config.application_name("autocomp");
        }
        options.target = describe(&config, &user);
        options.user = user;
        options.config = config;
        Ok(options)
    }

    /// The TLS connector `sslmode` asks for (also built for `disable`: the pool needs one type).
    pub fn tls(&self) -> StoreResult<tokio_postgres_rustls::MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Unavailable(format!("TLS setup: {e}")))?;
        let config = match self.tls {
            TlsMode::VerifyFull => {
                let mut roots = rustls::RootCertStore::empty();
                match &self.root_certificates {
                    Some(path) => {
                        use rustls::pki_types::pem::PemObject;
                        let certificates = CertificateDer::pem_file_iter(path)
                            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                            .map_err(|e| InvalidInput::new("sslrootcert", path.as_str(), e.to_string()))?;
                        for certificate in certificates {
                            roots
                                .add(certificate)
                                .map_err(|e| InvalidInput::new("sslrootcert", path.as_str(), e.to_string()))?;
                        }
                    }
                    None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            _ => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
                .with_no_client_auth(),
        };
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// `user@host:port,host:port/database`.
fn describe(config: &tokio_postgres::Config, user: &str) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{name}:{port}")
        })
        .collect();
    format!("{user}@{}/{}", hosts.join(","), config.get_dbname().unwrap_or(""))
}

/// libpq's `prefer` and `require`: encrypt, but accept any certificate.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_and_own_options() {
        let options = PgOptions::parse(
            "postgres://autocomp@db1,db2:5433/autocomp?target_session_attrs=read-write&pool_size=4&retry_for=10s&sslmode=disable",
        )
        .unwrap();
        assert_eq!(options.target, "autocomp@db1:5432,db2:5433/autocomp");
        assert_eq!(options.pool_size, 4);
        assert_eq!(options.retry_for, Duration::from_secs(10));
        assert_eq!(options.tls, TlsMode::Disable);
    }

    #[test]
    fn errors_name_the_option_and_never_the_password() {
        for (url, expected) in [
            ("postgres://u:hunter2@h/db?pool_size=0", "pool_size"),
            ("postgres://u:hunter2@h/db?sslmode=sometimes", "sslmode"),
            ("postgres://u:hunter2@h/db?colour=blue", "colour"),
            ("postgres://u:hunter2@h/db?migrate=maybe", "migrate"),
            ("postgres://u:hunter2@h", "database"),
        ] {
            let error = PgOptions::parse(url).err().unwrap().to_string();
            assert!(error.contains(expected), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{url}: {error}");
        }
    }
}
