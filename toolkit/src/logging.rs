//! How every autocomp binary logs: through `tracing` to stderr, as text or as JSON lines
//! (`--log-format json`). Text is coloured only when stderr is a terminal, so a log file or
//! a cron mail never holds escape codes. `RUST_LOG` overrides the level the flags chose,
//! except that the database clients' statement logs stay off at every level. When the OTLP
//! variables ask for it, spans also go to an OpenTelemetry collector (`telemetry`).

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

/// A layer a program adds beside the stderr log (the framework's capture of a run's log
/// lines): it sees every event at INFO and above, whatever level stderr logs at.
pub type ExtraLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static>;

/// Installs the process's log subscriber on stderr. `filter` is the default
/// `tracing_subscriber::EnvFilter` directive (e.g. `warn`, `info,autocomp_store=debug`).
pub fn init(filter: &str, format: LogFormat) {
    init_with(filter, format, None);
}

/// [`init`], plus `extra` under a filter of its own (INFO and above): the stderr log keeps
/// its level (`warn` under cron) while `extra` still sees the info lines. When
/// `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` is set, the OpenTelemetry layer too (see
/// `telemetry`; the binary runs `telemetry::shutdown` on its way out); else nothing of it is
/// built.
pub fn init_with(filter: &str, format: LogFormat, extra: Option<ExtraLayer>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| filter.into());
    // A filter of its own, after the EnvFilter, so no `-vv` or `RUST_LOG` can turn it off.
    // The telemetry spans are the collector's, not the log's: lines read the same either way.
    let no_statements = tracing_subscriber::filter::filter_fn(|metadata| {
        !logs_statement_parameters(metadata) && metadata.target() != crate::telemetry::TARGET
    });
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let stderr = match format {
        LogFormat::Text => stderr.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => stderr.json().boxed(),
    };
    // Per-layer filters: the stderr filters must not hide info events from `extra`.
    let stderr = stderr.with_filter(filter).with_filter(no_statements);
    let extra = extra.map(|layer| layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO).boxed());
    let (telemetry, refused) = match crate::telemetry::layer() {
        Ok(layer) => (layer, None),
        Err(refused) => (None, Some(refused)),
    };
    // Not an empty Vec: that layer says no callsite interests it, and nothing would log.
    let layers: Vec<ExtraLayer> = extra.into_iter().chain(telemetry).collect();
    let layers = Some(layers).filter(|layers| !layers.is_empty());
    tracing_subscriber::registry().with(layers).with(stderr).init();
    if let Some(refused) = refused {
        tracing::warn!("{refused}");
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
