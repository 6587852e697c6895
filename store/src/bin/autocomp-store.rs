//! `autocomp-store serve`: the store service other hosts reach with `http://` store URLs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use autocomp_store::http::StoreService;
use autocomp_store::http::service::{Access, init_logging, load_token, serve};
use autocomp_store::{StoreError, open_store};
use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes: 0 stopped by SIGTERM/SIGINT, 2 usage or configuration error \
                          (bad --db, no token, address in use), 5 the database cannot be opened.";

#[derive(Parser)]
#[command(name = "autocomp-store", version, about = "The autocomp object store as an HTTP service.", after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a store database over HTTP (JSON; see /openapi.json). Writes need the bearer
    /// token; reads are open from loopback and need the token from anywhere else.
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// The database: sqlite:///path/to/store.db[?synchronous=full|normal].
        #[arg(long, env = "AUTOCOMP_STORE_DB")]
        db: String,
        /// Address to listen on. Loopback by default: other hosts need an explicit address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// File holding the bearer token for writes (else $AUTOCOMP_TOKEN).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Ask for the token on reads from loopback too (on a host other users share).
        #[arg(long)]
        reads_need_token: bool,
        /// More logging (-v debug, -vv trace); RUST_LOG overrides.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let Command::Serve { db, listen, token_file, reads_need_token, verbose } = Cli::parse().command;
    init_logging(verbose);
    let fail = |code: u8, message: String| {
        tracing::error!("{message}");
        ExitCode::from(code)
    };
    let token = match load_token(token_file.as_deref()) {
        Ok(token) => token,
        Err(message) => return fail(2, message),
    };
    if !db.starts_with("sqlite://") {
        return fail(2, format!("--db {db:?}: the service serves a database; expected sqlite:///path/to/store.db"));
    }
    let store = match open_store(&db).await {
        Ok(store) => store,
        Err(error @ StoreError::Invalid(_)) => return fail(2, format!("--db: {error}")),
        Err(error) => return fail(5, format!("cannot open {db}: {error}")),
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => return fail(2, format!("cannot listen on {listen}: {error}")),
    };
    let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| listen.to_string());
    tracing::info!(listen = %bound, %db, "store service up");
    let access = if reads_need_token { Access::new(token).reads_need_token() } else { Access::new(token) };
    let service = StoreService::new(store, access);
    match serve(listener, service.router()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(5, format!("serving: {error}")),
    }
}
