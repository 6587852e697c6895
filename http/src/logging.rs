//! How every autocomp binary logs: through `tracing` to stderr, as text or as JSON lines
//! (`--log-format json`). Text is coloured only when stderr is a terminal, so a log file or
//! a cron mail never holds escape codes. `RUST_LOG` overrides the level the flags chose,
//! except that the database clients' statement logs stay off at every level.

use std::io::IsTerminal;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and
    /// every field of the event: `batch`, `component`, `generation`, ...).
    Json,
}

/// Installs the process's log subscriber on stderr. `filter` is the default
/// `tracing_subscriber::EnvFilter` directive (e.g. `warn`, `info,autocomp_store=debug`).
pub fn init(filter: &str, format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| filter.into());
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    // A filter of its own, after the EnvFilter, so no `-vv` or `RUST_LOG` can turn it off.
    let no_statements = tracing_subscriber::filter::filter_fn(|metadata| !logs_statement_parameters(metadata));
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).finish().with(no_statements).init(),
        LogFormat::Json => builder.json().finish().with(no_statements).init(),
    }
}

/// Log targets that print SQL parameters (batch metadata, reports, checkpoints: user data
/// that may hold secrets): tokio-postgres logs every statement's parameter values at debug
/// (`tokio_postgres::query`) and its protocol traffic at trace; the synchronous `postgres`
/// crate the same. Their info and above (server notices, connection errors) still show.
fn logs_statement_parameters(metadata: &tracing::Metadata<'_>) -> bool {
    let target = metadata.target();
    let of = |krate: &str| target == krate || target.strip_prefix(krate).is_some_and(|rest| rest.starts_with("::"));
    (of("tokio_postgres") || of("postgres")) && *metadata.level() > tracing::Level::INFO
}
