//! `autocomp`: the operator's command line. Today it has `demo`; the operator actions of
//! DESIGN §6 (rerun, restart, cancel, show, status, explain...) arrive with issue #6.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Operate an autocomp pipeline.
///
#[derive(Parser)]
#[command(name = "autocomp", version, after_help = autocomp_framework::exit::EXIT_CODES_HELP)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the example pipeline over sample BagIt deliveries on the embedded default (no
    /// servers), the way cron would, and show where every batch ended.
    Demo {
        /// Where the demo keeps its store and sample batches.
        #[arg(long, default_value = "autocomp-demo")]
        dir: PathBuf,
        /// How many sample batches to create.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        batches: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("autocomp: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = match cli.command {
        Command::Demo { dir, batches } => runtime.block_on(autocomp_framework::demo::run(&dir, batches as usize)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("autocomp: {e}");
            e.exit_code()
        }
    }
}
