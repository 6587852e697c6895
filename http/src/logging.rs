//! How every autocomp binary logs: through `tracing` to stderr, as text or as JSON lines
//! (`--log-format json`). Text is coloured only when stderr is a terminal, so a log file or
//! a cron mail never holds escape codes. `RUST_LOG` overrides the level the flags chose.

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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| filter.into());
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
}
