//! `sboi serve`: the batch index as a service other hosts reach with `http://` index URLs.
//! It follows one store (embedded file or store service) into one index directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use autocomp_http::launch::{Launch, ServiceArgs, exit_code, fail};
use autocomp_http::service::init_logging;
use autocomp_sboi::http::IndexService;
use autocomp_sboi::{EngineOptions, IndexEngine, MAX_CORRECTIONS};
use autocomp_store::http::store_error_is_permanent;
use autocomp_store::{HttpStore, ObjectStore, StoreError, open_store};
use autocomp_toolkit::display_url;
use autocomp_toolkit::logging::LogFormat;
use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes: 0 stopped by SIGTERM/SIGINT, 2 usage or configuration error \
                          (bad --store, no token, the store refuses the token, address in use), 5 the \
                          index directory cannot be opened. A store that does not answer yet is waited \
                          for (with a log line per try; /health says so meanwhile), not an exit.";

/// How long a stopping service waits for a catch-up in progress to commit.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(name = "sboi", version, about = "The autocomp batch index as an HTTP service.", after_help = EXIT_CODES)]
struct Cli {
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Follow a store's change feed into an index directory and answer trigger queries over
    /// HTTP (JSON; see /openapi.json). Rebuilds need the bearer token; reads are open from
    /// loopback and need the token from anywhere else. Index lag is on /metrics.
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// The store to follow: postgres://user@host[,host2]/database, http://host:7070 (the
        /// store service) or sqlite:///path/store.db.
        #[arg(long, env = "AUTOCOMP_STORE", hide_env_values = true)]
        store: String,
        /// The index directory (created if missing). One service per directory.
        #[arg(long)]
        index_dir: PathBuf,
        /// Address to listen on. Loopback by default: other hosts need an explicit address.
        #[arg(long, default_value = "127.0.0.1:7071")]
        listen: SocketAddr,
        /// Compare the whole index with the store this often and repair what differs (30m,
        /// 6h, 1d; 0 never). Changes are indexed meanwhile: it takes the writer only to fix.
        #[arg(long, default_value = "1d", value_parser = parse_period)]
        reconcile_every: Duration,
        /// Most batches changed since the index's last commit that a fresh query evaluates
        /// from the store itself; past that it waits (at most 2s) for the index to catch up.
        #[arg(long, default_value_t = MAX_CORRECTIONS)]
        max_corrections: usize,
        #[command(flatten)]
        service: ServiceArgs,
    },
}

fn parse_period(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text).map_err(|e| format!("{e} (write e.g. 90s, 30m, 1h, or 0 for never)"))
}

#[tokio::main]
async fn main() -> ExitCode {
    autocomp_http::launch::return_large_allocations();
    let cli = Cli::parse();
    let Command::Serve { store: store_url, index_dir, listen, reconcile_every, max_corrections, service } = cli.command;
    init_logging(service.verbose, cli.log_format);
    let token = match service.token() {
        Ok(token) => token,
        Err(code) => return code,
    };
    // The service is the directory's only writer: one writer for the process's life. One
    // indexing thread: a catch-up commits a few documents at a time, and each thread's
    // segment costs its own fsyncs per commit (index lag), where indexing speed is bound by
    // the store's reads anyway.
    let options = EngineOptions { keep_writer: true, writer_threads: 1, max_corrections, ..EngineOptions::default() };
    let engine = match IndexEngine::open_with(&index_dir, options) {
        Ok(engine) => engine,
        Err(error) => return fail(5, format!("cannot open the index: {error}")),
    };
    // Up at once, whatever started first: until the store answers, /health says what we wait
    // for and operations answer `unavailable` (clients retry or use another instance).
    let upstream = format!("the store {}", display_url(&store_url));
    let mut launch = match Launch::bind(listen, upstream, &service.listen).await {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    // The service's token is also what it shows the store service: its reads may come from
    // another host, or the store may ask for the token on every read.
    let connect = || async {
        let store = if store_url.starts_with("http://") || store_url.starts_with("https://") {
            Arc::new(HttpStore::with_token(&store_url, Some(token.shown()))?) as Arc<dyn ObjectStore>
        } else {
            open_store(&store_url).await?
        };
        // An HTTP store is only dialled on first use: ask now.
        let head = store.head().await?;
        Ok::<_, StoreError>((store, head))
    };
    let (store, head) = match launch.connect(connect, |error| store_error_is_permanent(&store_url, error)).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(error)) => return fail(2, format!("--store {}: {error}", display_url(&store_url))),
        Err(stopped) => return stopped,
    };
    let reconcile = (!reconcile_every.is_zero()).then_some(reconcile_every);
    let service = match IndexService::start(engine, store, service.access(&token), reconcile) {
        Ok(service) => service,
        Err(error) => return fail(5, format!("cannot open the index: {error}")),
    };
    launch.ready(service.router());
    let indexed = service.follower().progress().indexed_seq;
    tracing::info!(listen = %launch.bound, store = %display_url(&store_url), index = %index_dir.display(), %indexed, store_head = %head,
        reconcile_every = ?reconcile, "sboi service up");
    let served = launch.served().await;
    let _no_more_writes = service.follower().quiesce(STOP_GRACE).await;
    exit_code(served)
}
