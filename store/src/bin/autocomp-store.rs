//! `autocomp-store serve`: the store service other hosts reach with `http://` store URLs;
//! `autocomp-store migrate`: brings a PostgreSQL store's schema up to this release.

use std::net::SocketAddr;
use std::process::ExitCode;

use autocomp_http::launch::{Launch, ServiceArgs, exit_code, fail};
use autocomp_http::service::init_logging;
use autocomp_store::http::StoreService;
use autocomp_store::http::store_error_is_permanent;
use autocomp_store::{PgStore, StoreError, open_store_to_serve};
use autocomp_toolkit::display_url;
use autocomp_toolkit::logging::LogFormat;
use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes: 0 stopped by SIGTERM/SIGINT, 2 usage or configuration error \
                          (bad --db, a SQLite file that cannot be opened, no token, address in use, \
                          credentials refused, a newer schema), 5 serving failed. A PostgreSQL server \
                          that does not answer yet is waited for (a log line per try; /health says so \
                          meanwhile), not an exit.";
const MIGRATE_EXIT_CODES: &str = "Exit codes: 0 the schema is current (migrated or already), 2 usage or \
                                  configuration error (bad --db, credentials refused, a right the role lacks, a \
                                  newer schema), 5 the database is unreachable or a migration failed or could \
                                  not lock its tables.";

#[derive(Parser)]
#[command(name = "autocomp-store", version, about = "The autocomp object store as an HTTP service.", after_help = EXIT_CODES)]
struct Cli {
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a store database over HTTP (JSON; see /openapi.json). Writes need the bearer
    /// token; reads are open from loopback and need the token from anywhere else.
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// The database: sqlite:///path/to/store.db[?synchronous=acknowledged|full|normal] or
        /// postgres://user@host[,host2]/database[?target_session_attrs=read-write&...]
        /// (the password from ?password_file=/path, $PGPASSWORD or the URL, which `ps` shows:
        /// prefer --db-file or password_file).
        #[arg(long, env = "AUTOCOMP_STORE_DB", hide_env_values = true)]
        db: Option<String>,
        /// A file holding the --db URL (one line), so a password in it is not on the command line.
        #[arg(long, value_name = "FILE", env = "AUTOCOMP_STORE_DB_FILE")]
        db_file: Option<std::path::PathBuf>,
        /// Address to listen on. Loopback by default: other hosts need an explicit address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// The most bytes of details and metadata one batch may store (bytes, or with KiB,
        /// MiB, GiB; at least 1MiB): an event or content change that would take a batch over
        /// is refused (400, naming the batch, the cap and the size), so a runaway log cannot
        /// grow without bound. The same as the database URL's max_batch_bytes= option (give
        /// one of the two) [default: 64MiB]
        #[arg(long, value_name = "SIZE", env = "AUTOCOMP_MAX_BATCH_BYTES", value_parser = max_batch_bytes)]
        max_batch_bytes: Option<u64>,
        #[command(flatten)]
        service: ServiceArgs,
    },
    /// Apply the schema migrations a PostgreSQL store lacks, then exit: for operators who
    /// deploy schema changes explicitly (components then open it with `?migrate=false`).
    /// Concurrent openers wait for it; running it twice changes nothing. Schema 20 waits for
    /// every transaction open when 19 committed (up to 60 s); past that it exits 5 naming the
    /// sessions, the store at 19 (which this release runs on): run it again once they end. A
    /// migration waits for a table's lock at most deadlock_timeout and half a second a try (a
    /// long transaction holding the table is not waited out, so writers go on), tries again for
    /// 60 s, then exits 5 naming the sessions holding the tables. The database's owner may
    /// migrate it; a role lacking a right exits 2 naming it.
    #[command(after_help = MIGRATE_EXIT_CODES)]
    Migrate {
        /// postgres://user@host[,host2]/database (the password from ?password_file=/path,
        /// $PGPASSWORD or the URL).
        #[arg(long, env = "AUTOCOMP_STORE_DB", hide_env_values = true)]
        db: Option<String>,
        /// A file holding the --db URL (one line), so a password in it is not on the command line.
        #[arg(long, value_name = "FILE", env = "AUTOCOMP_STORE_DB_FILE")]
        db_file: Option<std::path::PathBuf>,
        /// More logging (-v debug, -vv trace); RUST_LOG overrides.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    autocomp_http::launch::return_large_allocations();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { db, db_file, listen, max_batch_bytes, service } => {
            init_logging(service.verbose, cli.log_format);
            let db = match database_url(db, db_file).and_then(|db| with_max_batch_bytes(db, max_batch_bytes)) {
                Ok(db) => db,
                Err(code) => return code,
            };
            serve_store(db, listen, service).await
        }
        Command::Migrate { db, db_file, verbose } => {
            init_logging(verbose, cli.log_format);
            let db = match database_url(db, db_file) {
                Ok(db) => db,
                Err(code) => return code,
            };
            migrate(&db).await
        }
    }
}

/// The database URL from `--db` or `--db-file` (exactly one of them).
fn database_url(db: Option<String>, db_file: Option<std::path::PathBuf>) -> Result<String, ExitCode> {
    match (db, db_file) {
        (Some(_), Some(file)) => Err(fail(
            2,
            format!("--db-file {}: --db (or $AUTOCOMP_STORE_DB) is given too; give the database once", file.display()),
        )),
        (Some(db), None) => Ok(db),
        // The file holds the database URL, password and all.
        (None, Some(file)) => match std::fs::read_to_string(&file)
            .inspect(|_| autocomp_toolkit::file_modes::warn_if_exposed(&file, "the database URL file --db-file"))
        {
            Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
            Ok(_) => {
                Err(fail(2, format!("--db-file {}: the file is empty; write the database URL in it", file.display())))
            }
            Err(e) => Err(fail(2, format!("--db-file {}: cannot read it: {e}", file.display()))),
        },
        (None, None) => Err(fail(2, "--db URL or --db-file FILE (or $AUTOCOMP_STORE_DB) is required".to_string())),
    }
}

fn max_batch_bytes(text: &str) -> Result<u64, String> {
    autocomp_store::parse_max_batch_bytes(text)
}

/// The database URL with `--max-batch-bytes` as its `max_batch_bytes=` option, which every
/// adapter reads; both at once is a usage error naming them.
fn with_max_batch_bytes(db: String, max_batch_bytes: Option<u64>) -> Result<String, ExitCode> {
    let Some(bytes) = max_batch_bytes else { return Ok(db) };
    let query = autocomp_toolkit::redact::query_start(&db).map(|start| &db[start + 1..]);
    if query.is_some_and(|query| query.split('&').any(|pair| pair.starts_with("max_batch_bytes="))) {
        return Err(fail(
            2,
            format!(
                "--max-batch-bytes {bytes}: the --db URL {} sets max_batch_bytes= too; give it once",
                display_url(&db)
            ),
        ));
    }
    Ok(autocomp_toolkit::redact::with_option(&db, &format!("max_batch_bytes={bytes}")))
}

async fn migrate(db: &str) -> ExitCode {
    if !(db.starts_with("postgres://") || db.starts_with("postgresql://")) {
        return fail(
            2,
            format!(
                "--db {:?}: migrate is for PostgreSQL stores (postgres://...); a SQLite file migrates when opened",
                display_url(db)
            ),
        );
    }
    match PgStore::migrate(db).await {
        Ok((applied, version)) if applied.is_empty() => {
            println!("schema version {version}: already current");
            ExitCode::SUCCESS
        }
        Ok((applied, version)) => {
            let applied: Vec<String> = applied.iter().map(i32::to_string).collect();
            println!("schema version {version}: applied {}", applied.join(", "));
            ExitCode::SUCCESS
        }
        Err(error @ StoreError::Invalid(_)) => fail(2, format!("--db: {error}")),
        Err(error @ StoreError::SchemaNewer(_)) => fail(2, error.to_string()),
        Err(error) => fail(5, format!("cannot migrate {}: {error}", display_url(db))),
    }
}

async fn serve_store(db: String, listen: SocketAddr, service: ServiceArgs) -> ExitCode {
    let token = match service.token() {
        Ok(token) => token,
        Err(code) => return code,
    };
    let shown = display_url(&db);
    if !["sqlite://", "postgres://", "postgresql://"].iter().any(|scheme| db.starts_with(scheme)) {
        return fail(
            2,
            format!(
                "--db {shown:?}: the service serves a database; expected sqlite:///path/to/store.db or \
                 postgres://user@host/database"
            ),
        );
    }
    // Up at once; a PostgreSQL server may come up after us (a boot starts both): wait for
    // it, answering /health with what we wait for meanwhile.
    let mut launch = match Launch::bind(listen, format!("the database {shown}"), &service.listen).await {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    let store = match launch.connect(|| open_store_to_serve(&db), |error| store_error_is_permanent(&db, error)).await {
        Ok(Ok(store)) => store,
        Ok(Err(error)) => return fail(2, format!("--db: {error}")),
        Err(stopped) => return stopped,
    };
    tracing::info!(listen = %launch.bound, db = %shown, "store service up");
    launch.ready(StoreService::new(store, service.access(&token)).router());
    exit_code(launch.served().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_cap_lands_in_the_query_the_stores_parser_reads() {
        // No password: the user name ends at the first `@`, and a query value may hold one.
        let db = "postgres://autocomp@db/autocomp?application_name=store@h1".to_string();
        let capped = with_max_batch_bytes(db.clone(), Some(1 << 20)).unwrap();
        assert_eq!(capped, format!("{db}&max_batch_bytes=1048576"));
        assert_eq!(autocomp_store::PgOptions::parse(&capped).unwrap().max_batch_bytes, 1 << 20);
        let twice = format!("{db}&max_batch_bytes=2MiB");
        assert!(with_max_batch_bytes(twice, Some(1 << 20)).is_err(), "given twice is a usage error");
        // A raw `?` in the password is not a query.
        let capped = with_max_batch_bytes("postgres://u:pa?ss@h/db".into(), Some(1 << 20)).unwrap();
        assert_eq!(capped, "postgres://u:pa?ss@h/db?max_batch_bytes=1048576");
    }
}
