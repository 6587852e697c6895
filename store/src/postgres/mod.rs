//! The distributed object store: PostgreSQL, connected to directly by every component, service
//! and command. It owns the connection (libpq-style URL, pool, TLS, failover between hosts),
//! the retry rules that keep a restart or a failover from losing or doubling a write, and the
//! mapping of server errors onto `StoreError`. The operations themselves are in `ops.rs`;
//! each write is one call of a server-side function (`schema.rs`), one statement, one
//! transaction, so no transaction ever waits on a client.

mod announcement_key;
mod appends;
mod batches;
mod calls;
mod hand_on;
mod history;
mod horizon;
mod judged_claims;
mod listen;
mod options;
mod outbox;
mod reads;
mod registry;
mod retention;
mod rows;
mod run_outputs;
mod runs;
mod schema;
mod steering;
mod text;
mod writes;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;

use crate::checked::Checked;
use crate::port::{StoreError, StoreResult};
use autocomp_model::{IdempotencyKey, InvalidInput};

pub use options::{PgOptions, SILENT_CONNECTION_LIMIT};
pub use schema::{FEED_EPOCHS, FEED_LOCK, LATEST_VERSION, OLDEST_RUNNABLE};

/// A pool of connections to one PostgreSQL store (the primary among the URL's hosts).
/// Clones are cheap and share the pool.
#[derive(Clone)]
pub struct PgBackend {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    pool: Pool,
    options: PgOptions,
    /// Set once any connection succeeded: from then on failures are retried for `retry_for`
    /// (a restart, a failover); before, they fail at once (a wrong URL is not a restart).
    reached: AtomicBool,
    /// Makes the idempotency keys this handle invents unique: host, pid, start time, counter.
    key_prefix: String,
    keys_made: AtomicU64,
    /// Appends waiting to be sent together (group commit).
    appends: std::sync::Mutex<appends::AppendQueue>,
    /// Wakes `wait_for_change` when the server notifies a commit.
    listener: listen::Listener,
    /// One horizon read at a time, shared by the callers that asked before it began.
    horizon: horizon::SharedHorizon,
}

/// Whether an operation may be sent again after a failure that left unknown whether it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads, and writes whose repetition changes nothing (keyed appends and claims,
    /// idempotent releases, checkpoints, creates).
    Safe,
    /// Only when it surely did not run (no connection, or refused before running).
    OnlyUnsent,
}

/// A failed attempt, classified for the retry loop.
pub(crate) enum Failure {
    /// Final: the store's answer (bad input, not found, conflict, fenced, credentials).
    Final(StoreError),
    /// The operation surely did not run; another connection may succeed.
    Unsent(String),
    /// The connection broke while the operation was in flight: it may or may not have run.
    Ambiguous(String),
}

/// PostgreSQL as every caller holds it: the database behind the checks every backend shares
/// (`Checked`). Clones are cheap and share the pool.
pub type PgStore = Checked<PgBackend>;

impl PgStore {
    /// Opens the store a `postgres://` URL names, applying missing migrations (unless the URL
    /// says `migrate=false`). Fails at once when no host can be reached (`Unavailable`,
    /// naming hosts and user) or the server refuses the credentials (`Invalid`).
    pub async fn open(url: &str) -> StoreResult<Self> {
        PgBackend::open(url).await.map(Checked::new)
    }

    /// Applies the missing migrations (what `autocomp-store migrate` runs); returns the
    /// versions applied and the version the database is at now.
    pub async fn migrate(url: &str) -> StoreResult<(Vec<i32>, i32)> {
        PgBackend::migrate(url, schema::MIGRATION_PATIENCE).await
    }

    /// `migrate`, trying a migration held up by a table's lock for `patience` after the first
    /// lock-out rather than a minute, for tests of how it gives up.
    #[doc(hidden)]
    pub async fn migrate_trying_for(url: &str, patience: Duration) -> StoreResult<(Vec<i32>, i32)> {
        PgBackend::migrate(url, patience).await
    }

    /// Brings an empty database to schema `version` as an older release left it, for upgrade
    /// tests; opening it afterwards migrates the rest.
    #[doc(hidden)]
    pub async fn create_at_schema_version(url: &str, version: i32) -> StoreResult<()> {
        PgBackend::create_at_schema_version(url, version).await
    }
}

impl PgBackend {
    /// Opens the store a `postgres://` URL names, applying missing migrations (unless the URL
    /// says `migrate=false`). Fails at once when no host can be reached (`Unavailable`,
    /// naming hosts and user) or the server refuses the credentials (`Invalid`).
    async fn open(url: &str) -> StoreResult<Self> {
        let options = PgOptions::parse(url)?;
        let pool = connection_pool(&options, options.pool_size)?;
        let store = Self {
            inner: std::sync::Arc::new(Inner {
                pool,
                key_prefix: crate::write_rules::client_key_prefix("pg"),
                keys_made: AtomicU64::new(0),
                appends: Default::default(),
                reached: AtomicBool::new(false),
                listener: listen::Listener::new(options.listen),
                horizon: Default::default(),
                options,
            }),
        };
        store.prepare_schema().await?;
        Ok(store)
    }

    /// Applies the missing migrations (what `autocomp-store migrate` runs); returns the
    /// versions applied and the version the database is at now.
    async fn migrate(url: &str, patience: Duration) -> StoreResult<(Vec<i32>, i32)> {
        let mut options = PgOptions::parse(url)?;
        options.migrate = false;
        let tls = options.tls()?;
        let (mut client, connection) = connect_once(&options, tls).await?;
        let applied = schema::migrate(&mut client, &options.target, schema::Patience::For(patience)).await?;
        let version = schema::schema_version(&client).await?;
        drop(client);
        let _ = connection.await;
        Ok((applied, version))
    }

    /// Brings an empty database to schema `version` as an older release left it, for upgrade
    /// tests; opening it afterwards migrates the rest.
    #[doc(hidden)]
    async fn create_at_schema_version(url: &str, version: i32) -> StoreResult<()> {
        let options = PgOptions::parse(url)?;
        let tls = options.tls()?;
        let (mut client, connection) = connect_once(&options, tls).await?;
        let patience = schema::Patience::For(schema::MIGRATION_PATIENCE);
        schema::migrate_up_to(&mut client, &options.target, version, patience).await?;
        drop(client);
        let _ = connection.await;
        Ok(())
    }

    /// The schema version the database is at.
    pub async fn schema_version(&self) -> StoreResult<i32> {
        let client = self.connection().await.map_err(Failure::into_error)?;
        schema::schema_version(&client).await
    }

    /// A description of where this store is, without the password: `user@hosts/database`.
    pub fn target(&self) -> &str {
        &self.inner.options.target
    }

    async fn prepare_schema(&self) -> StoreResult<()> {
        let mut client = self.connection().await.map_err(Failure::into_error)?;
        let current = schema::schema_version(&client).await?;
        schema::check_not_newer(current)?;
        if current == LATEST_VERSION {
            return Ok(());
        }
        let target = &self.inner.options.target;
        if !self.inner.options.migrate {
            if current >= schema::OLDEST_RUNNABLE {
                tracing::warn!(store = %target, current, wanted = LATEST_VERSION,
                    "the PostgreSQL store's schema is behind this release's; run `autocomp-store migrate --db URL`");
                return Ok(());
            }
            return Err(StoreError::SchemaOlder(format!(
                "the PostgreSQL store {target} has schema version {current}, this release needs {LATEST_VERSION}; \
                 run `autocomp-store migrate --db URL` (or drop migrate=false from the URL)"
            )));
        }
        // On a schema it runs on, a start is not held up by a long transaction beyond one try:
        // it runs on that schema (below), and `autocomp-store migrate` tries longer.
        let patience = match current >= schema::OLDEST_RUNNABLE {
            true => schema::Patience::Once,
            false => schema::Patience::For(schema::MIGRATION_PATIENCE),
        };
        match schema::migrate(&mut client, target, patience).await {
            Ok(applied) if !applied.is_empty() => {
                tracing::info!(store = %target, ?applied, "migrated the PostgreSQL store schema")
            }
            Ok(_) => {}
            // 19 applied and 20 waiting for a transaction left open: runs on 19, and the next
            // open migrates again.
            Err(error @ StoreError::SchemaNewer(_)) => return Err(error),
            Err(error) if schema::schema_version(&client).await? >= schema::OLDEST_RUNNABLE => {
                tracing::warn!(store = %target, %error, "running on an older schema until the migration completes")
            }
            Err(error) => return Err(error),
        }
        Ok(())
    }

    /// A pooled connection to the primary. Failing to get one is `Unsent`.
    async fn connection(&self) -> Result<deadpool_postgres::Object, Failure> {
        match self.inner.pool.get().await {
            Ok(client) => {
                self.inner.reached.store(true, Ordering::Relaxed);
                Ok(client)
            }
            Err(deadpool_postgres::PoolError::Backend(error)) => Err(classify(&self.inner.options, &error, true)),
            Err(other) => Err(Failure::Unsent(format!("PostgreSQL at {}: {other}", self.inner.options.target))),
        }
    }

    fn fresh_key(&self) -> IdempotencyKey {
        let n = self.inner.keys_made.fetch_add(1, Ordering::Relaxed);
        IdempotencyKey::new(format!("{}.{n}", self.inner.key_prefix)).expect("printable ASCII, under 128 characters")
    }

    /// Runs `attempt` on a pooled connection, again on a fresh one after a failure the
    /// `retry` rule allows, until `retry_for` has passed since the first failure.
    pub(crate) async fn run<'a, T, F>(&'a self, operation: &str, retry: Retry, attempt: F) -> StoreResult<T>
    where
        F: for<'c> Fn(&'c deadpool_postgres::ClientWrapper, calls::Within<'c, 'a>) -> calls::Attempt<'c, T>,
    {
        let mut deadline = None;
        let mut pause = Duration::from_millis(50);
        loop {
            let failure = match self.connection().await {
                Ok(client) => match attempt(&client, std::marker::PhantomData).await {
                    Ok(value) => return Ok(value),
                    Err(failure) => {
                        if !matches!(failure, Failure::Final(_)) {
                            // Broken, or on a server that is no longer the primary: never reuse it.
                            drop(deadpool_postgres::Object::take(client));
                        }
                        failure
                    }
                },
                Err(failure) => failure,
            };
            let message = match failure {
                Failure::Final(error) => return Err(error),
                Failure::Unsent(message) => message,
                Failure::Ambiguous(message) if retry == Retry::Safe => message,
                Failure::Ambiguous(message) => {
                    return Err(StoreError::Unavailable(format!(
                        "{operation}: {message}; the connection broke while it was sent, so it may have \
                         happened: check before repeating it"
                    )));
                }
            };
            if !self.inner.reached.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable(message));
            }
            let deadline = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + self.inner.options.retry_for);
            if tokio::time::Instant::now() + pause > deadline {
                return Err(StoreError::Unavailable(format!(
                    "{message} (retried {operation} for {})",
                    humantime::format_duration(self.inner.options.retry_for)
                )));
            }
            tracing::warn!(store = %self.inner.options.target, operation, error = %message, "retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// A pool of up to `max_size` connections as the URL says (TLS per `sslmode`, each new one
/// within twice `connect_timeout`, the password read again from `password_file`): the
/// store's, and the PostgreSQL lock service's (autocomp-framework), which shares the URL syntax.
/// Connects lazily: the first `get` is the first connection.
pub fn connection_pool(options: &PgOptions, max_size: usize) -> StoreResult<Pool> {
    let tls = options.tls()?;
    let connect = Connector { tls, password_file: options.password_file.clone(), target: options.target.clone() };
    let manager = Manager::from_connect(
        options.config.clone(),
        connect,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager)
        .max_size(max_size)
        // The connection used last is used next (deadpool's default is the one idle longest):
        // a watcher's calls, one after another in a trickle, find a server process that ran
        // the call before instead of waking one that slept since the last burst.
        .queue_mode(deadpool_postgres::QueueMode::Lifo)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(options.connect_timeout * 2))
        .build()
        .map_err(|e| StoreError::Unavailable(format!("PostgreSQL pool for {}: {e}", options.target)))
}

/// How the pool opens a connection: as the URL says, with the password read again from
/// `password_file` (when the URL names one) for every new connection, so a password rotated
/// in the file is used from the next connection on, without a restart.
struct Connector {
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    password_file: Option<std::path::PathBuf>,
    target: String,
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        let config = with_current_password(config, self.password_file.as_deref(), &self.target);
        let tls = self.tls.clone();
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await?;
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok((client, task))
        })
    }
}

/// The connection settings with the password read again from `password_file`, if any.
fn with_current_password(
    config: &tokio_postgres::Config,
    password_file: Option<&std::path::Path>,
    target: &str,
) -> tokio_postgres::Config {
    let mut config = config.clone();
    if let Some(file) = password_file {
        match options::read_password_file(file) {
            Ok(password) => {
                config.password(password);
            }
            // The password read when the store was opened is tried instead.
            Err(error) => tracing::warn!(store = %target, "{error}"),
        }
    }
    config
}

/// What a connection outside the pool (the listener's) connects with.
fn config_for_new_connection(options: &PgOptions) -> tokio_postgres::Config {
    with_current_password(&options.config, options.password_file.as_deref(), &options.target)
}

async fn connect_once(
    options: &PgOptions,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
) -> StoreResult<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
    let (client, connection) =
        options.config.connect(tls).await.map_err(|e| classify(options, &e, true).into_error())?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

impl Failure {
    pub(crate) fn into_error(self) -> StoreError {
        match self {
            Failure::Final(error) => error,
            Failure::Unsent(message) | Failure::Ambiguous(message) => StoreError::Unavailable(message),
        }
    }
}

/// The server's message (and detail) without the client library's prefixes (public for the
/// PostgreSQL lock service's messages).
pub fn describe_error(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{} ({detail})", db.message()),
            None => db.message().to_string(),
        };
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Sorts a client error into final, unsent or ambiguous. `connecting`: it came from opening
/// a connection, so nothing was sent.
fn classify(options: &PgOptions, error: &tokio_postgres::Error, connecting: bool) -> Failure {
    let target = &options.target;
    if let Some(code) = error.code() {
        let message = describe_error(error);
        // Data exceptions (class 22: untranslatable characters, bad escapes, values out of
        // range): this write's values are at fault, on every server and every retry.
        // (While connecting, it is a connection parameter of the URL that is refused.)
        if code.code().starts_with("22") {
            let refused = if connecting {
                InvalidInput::new("store url", target.as_str(), format!("{message} (SQLSTATE {})", code.code()))
            } else {
                InvalidInput::new(
                    "data",
                    message,
                    format!("PostgreSQL refused to store it (SQLSTATE {}); nothing was written", code.code()),
                )
            };
            return Failure::Final(refused.into());
        }
        if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            return Failure::Final(
                InvalidInput::new(
                    "store url",
                    target.as_str(),
                    format!("PostgreSQL refused user {}: {message}", options.user),
                )
                .into(),
            );
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            return Failure::Final(
                InvalidInput::new("store url", target.as_str(), format!("no such database: {message}")).into(),
            );
        }
        // Refused before running: the server is starting, this is a standby (read-only)
        // after a failover, or the transaction was rolled back. (A shutdown's termination
        // may arrive after a commit was flushed, so it is ambiguous, like a broken socket.)
        let refused = [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::TOO_MANY_CONNECTIONS,
        ];
        if refused.contains(code) || connecting {
            return Failure::Unsent(format!("PostgreSQL at {target}: {message}"));
        }
        let message = format!("PostgreSQL at {target}: {message}");
        if *code == SqlState::ADMIN_SHUTDOWN || *code == SqlState::CRASH_SHUTDOWN || code.code().starts_with("08") {
            return Failure::Ambiguous(message);
        }
        return Failure::Final(StoreError::Unavailable(message));
    }
    let described = describe_error(error);
    // The server's certificate did not pass sslmode=verify-ca / verify-full: the CA file,
    // the host name or the server's certificate is misconfigured; waiting will not fix it.
    if let Some(certificate) = certificate_error(error) {
        return Failure::Final(
            InvalidInput::new(
                "sslrootcert",
                options.root_certificates.as_deref().unwrap_or("(the public web roots)"),
                format!(
                    "the certificate of PostgreSQL at {target} is refused under sslmode={}: {certificate}",
                    options.tls.as_str()
                ),
            )
            .into(),
        );
    }
    // tokio-postgres says only in its text that the configuration is at fault (the server
    // asked for a password the URL and $PGPASSWORD do not give): not something a retry fixes.
    if described.starts_with("invalid configuration") {
        return Failure::Final(
            InvalidInput::new("store url", target.as_str(), format!("user {}: {described}", options.user)).into(),
        );
    }
    let message = format!("PostgreSQL at {target} unreachable: {described}");
    if connecting { Failure::Unsent(message) } else { Failure::Ambiguous(message) }
}

/// The rustls certificate error somewhere in `error`'s sources, described.
fn certificate_error(error: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(inner) = source {
        let tls = inner.downcast_ref::<rustls::Error>().or_else(|| {
            inner.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).and_then(|e| e.downcast_ref())
        });
        if let Some(tls @ rustls::Error::InvalidCertificate(certificate)) = tls {
            let hint = match certificate {
                rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature => {
                    " (it is not signed by a CA in sslrootcert)"
                }
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. } => {
                    " (the host name in the URL is not one the certificate names)"
                }
                _ => "",
            };
            return Some(format!("{tls}{hint}"));
        }
        source = inner.source();
    }
    None
}
