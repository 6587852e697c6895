//! `autocomp-monitor`: serves the web monitor. Argument parsing, logging and startup checks
//! only; the pages are `autocomp_monitor::web`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use autocomp_framework::config::{Backends, DEFAULT_CONFIG_DIR};
use autocomp_framework::exit::USAGE;
use autocomp_http::launch::{Launch, exit_code, fail};
use autocomp_http::logging::LogFormat;
use autocomp_http::service::load_token;
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use clap::Parser;

const EXIT_CODES: &str = "Exit codes: 0 stopped by SIGTERM/SIGINT (requests in flight finish), 2 usage or \
                          configuration error (bad flags or autocomp.toml, unreadable --token-file, address in \
                          use), 5 serving failed. A store or index that does not answer yet is waited \
                          for (a log line per try; /health says so meanwhile), not an exit.";

/// The autocomp web monitor: the pipeline at a glance (component x state counts), the
/// batch x component matrix with filters in the URL, each batch's log and explanations, CSV
/// and NDJSON export, and the operator's actions (rerun, restart, cancel, skip, prioritize)
/// previewed before they are written. Without a write token it is read only.
#[derive(Parser)]
#[command(name = "autocomp-monitor", version, after_help = EXIT_CODES)]
struct Cli {
    /// Address to listen on. Loopback by default: other hosts need an explicit address (or,
    /// better, a TLS reverse proxy in front).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7072")]
    listen: SocketAddr,
    /// Directory holding autocomp.toml (the backends; optional when they come from the
    /// environment or flags) [default: /etc/autocomp]
    #[arg(long, value_name = "DIR", env = "AUTOCOMP_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Store URL: sqlite:///var/lib/autocomp/store.db, postgres://user@db1,db2/autocomp or
    /// http://host:7070 (overrides autocomp.toml).
    #[arg(long, env = "AUTOCOMP_STORE", value_name = "URL")]
    store: Option<String>,
    /// Batch index URL, e.g. local:/var/lib/autocomp/index or http://host:7071.
    #[arg(long, env = "AUTOCOMP_INDEX", value_name = "URL")]
    index: Option<String>,
    /// Lock service URL, e.g. local:/var/lib/autocomp/locks or zk://zk1:2181/autocomp (the
    /// batch page shows lock holders).
    #[arg(long, env = "AUTOCOMP_LOCKS", value_name = "URL")]
    locks: Option<String>,
    /// File holding the write token: operators sign in with it to act on batches. Without
    /// one the monitor is read only.
    #[arg(long, value_name = "FILE", env = "AUTOCOMP_MONITOR_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// A request header a trusted reverse proxy sets to the authenticated user (e.g.
    /// X-Remote-User): a request carrying it acts as that operator without signing in. Only
    /// when every request comes through that proxy and it strips the header from clients.
    /// Writes still need --token-file (without it the monitor is read only).
    #[arg(long, value_name = "NAME")]
    trusted_user_header: Option<String>,
    /// A batch ready for a component longer than this is overdue (working longer than the
    /// component's max_runtime is overdue too).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    ready_overdue_after: Duration,
    /// More logging (-v debug for autocomp: a line per request; -vv debug for everything;
    /// -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

fn init_logging(verbose: u8, format: LogFormat) {
    // -v is about the monitor and the pipeline's crates, not tantivy's file-by-file chatter.
    let level = match verbose {
        0 => "info",
        1 => "info,autocomp_monitor=debug,autocomp_framework=debug,autocomp_store=debug,autocomp_sboi=debug",
        2 => "debug",
        _ => "trace",
    };
    autocomp_http::logging::init(level, format);
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.log_format);
    let token = match &cli.token_file {
        Some(path) => match load_token(Some(path)) {
            Ok(token) => Some(token),
            Err(message) => return fail(USAGE, message),
        },
        None => None,
    };
    let trusted_user_header = match cli.trusted_user_header.as_deref().map(web::auth::header_name).transpose() {
        Ok(header) => header,
        Err(message) => return fail(USAGE, message),
    };
    if token.is_none() && trusted_user_header.is_some() {
        tracing::warn!("--trusted-user-header has no effect without --token-file: the monitor is read only");
    }
    let overrides = Backends { store: cli.store, index: cli.index, locks: cli.locks };
    let config_dir = cli.config_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR));
    let operator = match Operator::new(&config_dir, overrides, None) {
        Ok(operator) => operator,
        Err(error) => return fail(error.code(), error),
    };
    // Up at once, whatever started first: until the store and the index answer, /health
    // says what we wait for and pages answer 503.
    let mut launch = match Launch::bind(cli.listen, "the store and the index").await {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    let open = || async {
        let store = operator.store().await?;
        operator.index(&store)?;
        store.head().await.map_err(autocomp_ops::operator::OperatorError::from)
    };
    let head = match launch.connect(open, |error| error.code() == USAGE).await {
        Ok(Ok(head)) => head,
        Ok(Err(error)) => return fail(USAGE, error),
        Err(stopped) => return stopped,
    };
    let settings = Settings { ready_overdue_after: cli.ready_overdue_after, ..Settings::default() };
    let monitor = Monitor::new(operator, settings);
    let mode = match (&token, &trusted_user_header) {
        (None, _) => "read only (no --token-file)".to_owned(),
        (Some(_), None) => "writes need sign-in with the token".to_owned(),
        (Some(_), Some(header)) => format!("writes need sign-in with the token, or the proxy's {header} header"),
    };
    let bound = &launch.bound;
    tracing::info!(listen = %bound, store_head = %head, "monitor up: http://{bound}/; {mode}");
    let options = WebOptions { token, trusted_user_header };
    launch.ready(web::router(monitor, options));
    exit_code(launch.served().await)
}
