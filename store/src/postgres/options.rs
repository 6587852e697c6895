//! A `postgres://` store URL: libpq's URL syntax (several hosts, `target_session_attrs`,
//! `sslmode`, `sslrootcert`, `connect_timeout`, ...) plus autocomp's own options
//! (`pool_size`, `retry_for`, `migrate`, `password_file`, `max_batch_bytes`), and the TLS each
//! `sslmode` means.
//! The password comes from the URL, `password_file` or `$PGPASSWORD` and never appears in an
//! error or a log: everything printed uses `target`, which has none, or `display_url`.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::{Host, SslMode};

use crate::port::{StoreError, StoreResult};
use autocomp_model::InvalidInput;
use autocomp_toolkit::redact::percent_decode;

/// How TLS is used, with libpq's meanings (`sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, plain TCP if not, and the certificate NOT verified
    /// (libpq's default; a warning says so once per process when a certificate is accepted
    /// unverified).
    Prefer,
    /// TLS always, the certificate NOT verified: encryption against a passive listener, no
    /// protection from an impostor.
    Require,
    /// TLS always, the certificate chain verified against `sslrootcert`; any host name.
    VerifyCa,
    /// TLS always, the chain verified against `sslrootcert` and the certificate's names
    /// against the host connected to.
    VerifyFull,
}

impl TlsMode {
    /// The mode `sslmode=` names, libpq's word for it.
    fn from_sslmode(value: &str) -> Option<Self> {
        match value {
            "disable" => Some(TlsMode::Disable),
            "prefer" => Some(TlsMode::Prefer),
            "require" => Some(TlsMode::Require),
            "verify-ca" => Some(TlsMode::VerifyCa),
            "verify-full" => Some(TlsMode::VerifyFull),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Prefer => "prefer",
            TlsMode::Require => "require",
            TlsMode::VerifyCa => "verify-ca",
            TlsMode::VerifyFull => "verify-full",
        }
    }
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
    /// A PEM file of CA certificates for `verify-ca` and `verify-full` (default: the public
    /// web roots).
    pub root_certificates: Option<String>,
    /// `password_file`: read when the URL is parsed and again for every new connection, so
    /// a rotated password is picked up without a restart.
    pub password_file: Option<PathBuf>,
    /// The most bytes of details and metadata one batch may store (see `SqliteOptions`).
    pub max_batch_bytes: u64,
    /// `listen=on` (the default): waiters for a store change are woken by the server's
    /// notifications on a connection of their own; `listen=off` polls instead (for a
    /// PgBouncer in transaction mode, which cannot pass LISTEN on).
    pub listen: bool,
}

const OWN_OPTIONS: &str =
    "pool_size, retry_for, migrate, listen, password_file, max_batch_bytes, sslmode, sslrootcert, connect_timeout";
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
    /// Parses a store URL. With a password, the userinfo ends at the URL's LAST `@`, so the
    /// password may hold `/ ? @ # :` raw or percent-encoded; an `@` in a query value must
    /// then be written `%40`. Without one, the user name ends at the first `@`.
    pub fn parse(url: &str) -> StoreResult<Self> {
        let shown = autocomp_toolkit::display_url(url);
        let invalid = |reason: String| -> StoreError { invalid_url(&shown, reason) };
        let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) else {
            return Err(invalid("expected postgres://user@host[:port][,host2...]/database".into()));
        };
        // The credentials are taken out here and never given to tokio-postgres's URL parser,
        // which would end them at the first `@` and name the rest of the password as a host.
        // Split as `display_url` splits: with a password at the last `@`, without one at the first.
        let (userinfo, location) = match autocomp_toolkit::redact::userinfo_end(rest) {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (url_user, url_password) = match userinfo {
            None => (None, None),
            Some(userinfo) => credentials(userinfo, &shown)?,
        };
        let (base, query) = location.split_once('?').unwrap_or((location, ""));
        let mut passed_on = Vec::new();
        let mut options = PgOptions::defaults();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            if !options.set(pair, &shown)? {
                passed_on.push(pair);
            }
        }
        if options.root_certificates.is_some() && !matches!(options.tls, TlsMode::VerifyCa | TlsMode::VerifyFull) {
            return Err(invalid(format!(
                "sslrootcert is used by sslmode=verify-ca or verify-full only, and sslmode is {} \
                 (which does not verify the server's certificate)",
                options.tls.as_str()
            )));
        }
        let mut config = libpq_config(base, &passed_on, &shown)?;
        let user = url_user
            .or_else(|| config.get_user().map(str::to_string))
            .or_else(|| std::env::var("PGUSER").ok())
            .ok_or_else(|| invalid("names no user; write postgres://USER@host/database".into()))?;
        config.user(&user);
        if config.get_dbname().is_none() {
            return Err(invalid("names no database; write postgres://user@host/DATABASE".into()));
        }
        if config.get_hosts().is_empty() {
            return Err(invalid("names no host; write postgres://user@HOST/database".into()));
        }
        options.set_password(&mut config, url_password, &shown)?;
        config.connect_timeout(options.connect_timeout);
        bound_silent_connections(&mut config, &passed_on, options.retry_for);
        config.ssl_mode(match options.tls {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
        });
        if config.get_application_name().is_none() {
            config.application_name("autocomp");
        }
        options.target = describe(&config, &user);
        options.user = user;
        options.config = config;
        Ok(options)
    }

    /// The options a URL that names none of autocomp's own gets.
    fn defaults() -> Self {
        PgOptions {
            config: tokio_postgres::Config::new(),
            target: String::new(),
            user: String::new(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            migrate: true,
            tls: TlsMode::Prefer,
            root_certificates: None,
            password_file: None,
            max_batch_bytes: crate::port::DEFAULT_MAX_BATCH_BYTES,
            listen: true,
        }
    }

    /// Sets one of autocomp's own options from a query's `key=value`; false for one of
    /// libpq's, which is passed on to tokio-postgres as it is.
    fn set(&mut self, pair: &str, shown: &str) -> StoreResult<bool> {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let invalid = |reason: String| -> StoreError { invalid_url(shown, reason) };
        match key {
            "pool_size" => {
                self.pool_size = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| invalid(format!("pool_size={value:?} is not a number from 1 to 1000")))?;
            }
            "retry_for" => self.retry_for = option_duration(key, value, shown)?,
            "max_batch_bytes" => {
                self.max_batch_bytes = crate::write_rules::parse_max_batch_bytes(value).map_err(invalid)?;
            }
            "connect_timeout" => {
                self.connect_timeout = option_duration(key, value, shown)?;
                if self.connect_timeout.is_zero() {
                    // libpq's 0 is "no limit"; here every attempt is bounded (a pool's wait
                    // for a connection is twice it), and a zero bound fails every one.
                    return Err(invalid(format!(
                        "connect_timeout={value:?}: must be more than 0 (each connection attempt is bounded; \
                         the default is 5s)"
                    )));
                }
            }
            "migrate" => {
                self.migrate = match value {
                    "true" => true,
                    "false" => false,
                    other => return Err(invalid(format!("migrate={other:?} is not true or false"))),
                }
            }
            "listen" => {
                self.listen = match value {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    other => return Err(invalid(format!("listen={other:?} is not on or off"))),
                }
            }
            "sslmode" => {
                self.tls = TlsMode::from_sslmode(value).ok_or_else(|| {
                    invalid(format!("sslmode={value:?} is not disable, prefer, require, verify-ca or verify-full"))
                })?;
            }
            "sslrootcert" => self.root_certificates = Some(option_path(key, value, shown)?),
            "password_file" => self.password_file = Some(PathBuf::from(option_path(key, value, shown)?)),
            "password" => {
                return Err(invalid(
                    "put the password in password_file=/path, $PGPASSWORD or the URL's user part".into(),
                ));
            }
            known if LIBPQ_OPTIONS.contains(&known) => return Ok(false),
            unknown => {
                return Err(invalid(format!(
                    "unknown option {unknown:?}; autocomp's own: {OWN_OPTIONS}; libpq's: {}",
                    LIBPQ_OPTIONS.join(", ")
                )));
            }
        }
        Ok(true)
    }

    /// Gives `config` the password: the URL's, `password_file`'s (never both), else
    /// `$PGPASSWORD`'s if set.
    fn set_password(
        &self,
        config: &mut tokio_postgres::Config,
        url_password: Option<Vec<u8>>,
        shown: &str,
    ) -> StoreResult<()> {
        match (url_password, &self.password_file) {
            (Some(_), Some(_)) => {
                let reason = "gives a password twice: in the URL and in password_file; keep one";
                return Err(invalid_url(shown, reason.into()));
            }
            (Some(password), None) => {
                config.password(password);
            }
            (None, Some(file)) => {
                config.password(read_password_file(file)?);
            }
            (None, None) => {
                if let Ok(password) = std::env::var("PGPASSWORD") {
                    config.password(password);
                }
            }
        }
        Ok(())
    }

    /// The TLS connector `sslmode` asks for (also built for `disable`: the pool needs one type).
    pub fn tls(&self) -> StoreResult<tokio_postgres_rustls::MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Unavailable(format!("TLS setup: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.tls {
            TlsMode::VerifyCa | TlsMode::VerifyFull => {
                let roots = Arc::new(self.root_store()?);
                let full = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .build()
                    .map_err(|e| self.bad_root_certificates(e.to_string()))?;
                if self.tls == TlsMode::VerifyFull { full } else { Arc::new(ChainOnly(full)) }
            }
            mode => Arc::new(EncryptOnly { provider, mode, target: self.target.clone() }),
        };
        let config = builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth();
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }

    /// The CAs `sslrootcert` names, or the public web roots.
    fn root_store(&self) -> StoreResult<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        let Some(path) = &self.root_certificates else {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            return Ok(roots);
        };
        use rustls::pki_types::pem::PemObject;
        let certificates = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.bad_root_certificates(e.to_string()))?;
        if certificates.is_empty() {
            return Err(self.bad_root_certificates("holds no PEM certificate".into()));
        }
        for certificate in certificates {
            roots.add(certificate).map_err(|e| self.bad_root_certificates(e.to_string()))?;
        }
        Ok(roots)
    }

    fn bad_root_certificates(&self, reason: String) -> StoreError {
        InvalidInput::new("sslrootcert", self.root_certificates.as_deref().unwrap_or("(the web roots)"), reason).into()
    }
}

/// The store URL refused as input, named as `display_url` shows it.
fn invalid_url(shown: &str, reason: String) -> StoreError {
    InvalidInput::new("store url", shown, reason).into()
}

/// The user name (percent-decoded, `None` when empty) and the password (percent-decoded
/// bytes) of a URL's userinfo.
fn credentials(userinfo: &str, shown: &str) -> StoreResult<(Option<String>, Option<Vec<u8>>)> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let user = String::from_utf8(percent_decode(user))
        .map_err(|_| invalid_url(shown, "the user name is not UTF-8 once percent-decoded".into()))?;
    Ok((Some(user).filter(|u| !u.is_empty()), password.map(percent_decode)))
}

/// A duration option's value: whole seconds as libpq writes connect_timeout, or a duration
/// like 10s.
fn option_duration(key: &str, value: &str, shown: &str) -> StoreResult<Duration> {
    match value.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => humantime::parse_duration(value).map_err(|e| invalid_url(shown, format!("{key}={value:?}: {e}"))),
    }
}

/// A file option's value, percent-decoded.
fn option_path(key: &str, value: &str, shown: &str) -> StoreResult<String> {
    let decoded = String::from_utf8(percent_decode(value)).unwrap_or_default();
    if decoded.is_empty() {
        return Err(invalid_url(shown, format!("{key}= names no file")));
    }
    Ok(decoded)
}

/// The least time data sent on a connection may stay unacknowledged (`tcp_user_timeout`,
/// unless the URL says): the store's `retry_for`, at least this. With the keepalive probes
/// below (a connection waiting for an answer is probed after 10 s), a statement sent to a
/// server the network has cut off fails then; without them it waited for the kernel's
/// retransmissions (about 15 minutes), and a worker cut from its store held its locks that
/// long instead of giving its batches up. No shorter than `retry_for`: a blip the store rides
/// out does not abort a statement already sent.
pub const SILENT_CONNECTION_LIMIT: Duration = Duration::from_secs(10);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVES_RETRIES: u32 = 3;

/// Sets the limits of [`SILENT_CONNECTION_LIMIT`] the URL (`passed_on`: libpq's own options)
/// leaves unset.
fn bound_silent_connections(config: &mut tokio_postgres::Config, passed_on: &[&str], retry_for: Duration) {
    let named = |key: &str| passed_on.iter().any(|pair| pair.split('=').next() == Some(key));
    if !named("tcp_user_timeout") {
        config.tcp_user_timeout(retry_for.max(SILENT_CONNECTION_LIMIT));
    }
    if !named("keepalives_idle") {
        config.keepalives_idle(KEEPALIVES_IDLE);
    }
    if !named("keepalives_interval") {
        config.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    if !named("keepalives_retries") {
        config.keepalives_retries(KEEPALIVES_RETRIES);
    }
}

/// tokio-postgres's configuration from the URL's credential-free part and the libpq options
/// passed on. tokio-postgres ends credentials at the first `@` anywhere, even in the query:
/// an `@` in the database name or a value is passed on encoded (it decodes those).
fn libpq_config(base: &str, passed_on: &[&str], shown: &str) -> StoreResult<tokio_postgres::Config> {
    let base = base.replace('@', "%40");
    let rebuilt = if passed_on.is_empty() {
        format!("postgres://{base}")
    } else {
        format!("postgres://{base}?{}", passed_on.join("&").replace('@', "%40"))
    };
    tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
        // The URL given to tokio-postgres holds no credentials.
        invalid_url(shown, format!("{e} (autocomp's own options: {OWN_OPTIONS})"))
    })
}

/// A password file's content without its final line break. Errors name the file, never
/// what it holds.
pub(crate) fn read_password_file(file: &std::path::Path) -> StoreResult<Vec<u8>> {
    let invalid = |reason: String| -> StoreError {
        InvalidInput::new("password_file", file.display().to_string(), reason).into()
    };
    autocomp_toolkit::file_modes::warn_if_exposed(file, "the PostgreSQL password_file");
    let mut password = std::fs::read(file).map_err(|e| invalid(format!("cannot read it: {e}")))?;
    if password.ends_with(b"\n") {
        password.pop();
        if password.ends_with(b"\r") {
            password.pop();
        }
    }
    if password.is_empty() {
        return Err(invalid("is empty".into()));
    }
    Ok(password)
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
    // The URL is the operator's text: a line feed in it must not make a forged line of
    // every message that names the server.
    let target = format!("{user}@{}/{}", hosts.join(","), config.get_dbname().unwrap_or(""));
    autocomp_toolkit::terminal::one_line(&target).into_owned()
}

/// libpq's `prefer` and `require`: encrypt, but accept any certificate (a warning says so
/// once per process, the first time a certificate is accepted unverified).
#[derive(Debug)]
struct EncryptOnly {
    provider: Arc<rustls::crypto::CryptoProvider>,
    mode: TlsMode,
    target: String,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                store = %self.target,
                sslmode = self.mode.as_str(),
                "the PostgreSQL server's certificate is not verified: anyone between here and the server can \
                 pose as it; use sslmode=verify-full&sslrootcert=/path/to/ca.pem"
            );
        });
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// libpq's `verify-ca`: the chain must lead to one of the CAs, whatever names the
/// certificate carries. webpki checks the chain before the name, so a name error means the
/// chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
