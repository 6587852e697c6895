//! The command line every component binary shares: config, manual runs,
//! dry runs, `--schedule` for hosts without cron, `--watch` for passes as soon as work is
//! ready, logging, backend overrides, exit codes.
//! A component's `main` is one call: `autocomp_framework::main(MyComponent)`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use autocomp_model::{BatchId, ComponentName, Schedule};
use autocomp_sboi::open_index;
use autocomp_store::open_store;
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use tokio::sync::watch;
use tracing::{error, info};

use crate::component::Component;
use crate::config::{self, Backends, DEFAULT_CONFIG_DIR};
use crate::exit::{self, EXIT_CODES_HELP, RunError};
use crate::locks::open_locks;
use crate::runner::{DryRun, Pipeline, Runner, Selection, Setup, stop_requested};
use crate::verdict::{PassEnd, pass, pass_verdict};
use crate::watch::{Watched, run_watching};

pub use autocomp_toolkit::logging::LogFormat;

/// The flags every component accepts.
#[derive(Debug, Clone, Args)]
pub struct RunnerArgs {
    /// The component's config file (default: `<config-dir>/<component>.toml`)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory holding autocomp.toml (backends) and the component files.
    #[arg(long, value_name = "DIR", env = "AUTOCOMP_CONFIG_DIR", default_value = DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// Run exactly this batch (if its trigger holds, unless --force).
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    /// With --batch: ignore the trigger (the batch is still locked and the result recorded).
    #[arg(long, requires = "batch")]
    pub force: bool,
    /// List what would be claimed and why; take no lock, claim nothing, record nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: list at most N candidates, 0 for all [default: as many as a pass
    /// looks at, 4 x queue_size and at least 16]. How many were left out goes to stderr.
    #[arg(long, value_name = "N", requires = "dry_run")]
    pub dry_run_limit: Option<usize>,
    /// Stay up and start a pass on this 5-field crontab schedule (for hosts without cron).
    #[arg(long, value_name = "CRON")]
    pub schedule: Option<String>,
    /// Stay up and start a pass as soon as the index offers a batch (woken by the store's
    /// change feed), and at least every `watch_heartbeat` (config, default 60s) for the
    /// registry and for readiness that only time brings (retry backoff, settled_for). Same
    /// locks, claims and exit codes as a cron pass; SIGTERM ends it (0, or 1 if a batch
    /// failed). Cron may still start the component too: the locks keep the passes apart.
    #[arg(long, conflicts_with_all = ["schedule", "batch", "dry_run"])]
    pub watch: bool,
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects (then at
    /// info level by default: a line per processed batch with its batch, component, run
    /// generation, outcome and duration).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Store URL: sqlite:///var/lib/autocomp/store.db, postgres://user@db1,db2/autocomp or
    /// http://host:7070 (overrides autocomp.toml).
    #[arg(long, env = "AUTOCOMP_STORE", hide_env_values = true, value_name = "URL")]
    pub store: Option<String>,
    /// Batch index URL, e.g. local:/var/lib/autocomp/index.
    #[arg(long, env = "AUTOCOMP_INDEX", hide_env_values = true, value_name = "URL")]
    pub index: Option<String>,
    /// Lock service URL, e.g. local:/var/lib/autocomp/locks.
    #[arg(long, env = "AUTOCOMP_LOCKS", hide_env_values = true, value_name = "URL")]
    pub locks: Option<String>,
}

impl RunnerArgs {
    /// The backend URLs given as flags or environment variables (they override the file).
    pub fn backends(&self) -> Backends {
        Backends { store: self.store.clone(), index: self.index.clone(), locks: self.locks.clone() }
    }
}

/// A binary's command line: the flags every component and source accepts.
#[derive(Parser)]
struct BinaryCli {
    #[command(flatten)]
    runner: RunnerArgs,
}

/// The whole `main` of a component binary.
pub fn main<C: Component>(component: C) -> ExitCode {
    let about = format!(
        "Autonomous component `{}`: records `{}` events on the batches its trigger selects.",
        component.name(),
        component.event_type()
    );
    let args = command_line(component.name(), component.version(), about, EXIT_CODES_HELP.to_owned());
    run(component, args)
}

/// Parses the command line of a binary named `name` (exits on `--help`, `--version` or a
/// usage error, as clap does).
pub(crate) fn command_line(name: &str, version: &str, about: String, after_help: String) -> RunnerArgs {
    let command =
        BinaryCli::command().name(name.to_owned()).version(version.to_owned()).about(about).after_help(after_help);
    match BinaryCli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli.runner,
        Err(e) => e.exit(),
    }
}

/// Logging for command-line programs (components, `autocomp`): quiet text for cron by
/// default (warnings only: cron mails any output), `-v` info, `-vv` debug. JSON goes to a
/// log collector, not a mailbox, so it starts at info. Whatever the level, a work thread's
/// info lines and above are kept as its run's output.
pub fn init_logging(verbose: u8, format: LogFormat) {
    let level = match (verbose, format) {
        (0, LogFormat::Text) => "warn",
        (0, LogFormat::Json) | (1, _) => "info",
        _ => "debug",
    };
    autocomp_toolkit::logging::init_with(level, format, Some(crate::output::layer()));
}

/// Runs the component with parsed arguments; returns the documented exit code.
pub fn run<C: Component>(component: C, args: RunnerArgs) -> ExitCode {
    let name = component.name().to_owned();
    run_binary(&name, args, Binary::Component, |args| run_async(component, args))
}

/// What kind of binary runs, for how its runtime starts and ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binary {
    /// One runtime thread, each batch's work on an OS thread of its own; at the end the
    /// pass's spans go to the collector and a hung work thread is not waited for (every lock
    /// and claim is already released).
    Component,
    /// One thread, dropped as usual at the end.
    Source,
}

/// The start and end every component and source binary shares: logging as the flags say,
/// the async runtime, the exit code of what `body` returns (a busy poll lock quietly, any
/// other error on stderr), stdout flushed.
pub(crate) fn run_binary<F>(
    name: &str,
    args: RunnerArgs,
    binary: Binary,
    body: impl FnOnce(RunnerArgs) -> F,
) -> ExitCode
where
    F: Future<Output = Result<u8, RunError>>,
{
    init_logging(args.verbose, args.log_format);
    let mut builder = match binary {
        Binary::Component => tokio::runtime::Builder::new_current_thread(),
        Binary::Source => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    let code = match runtime.block_on(body(args)) {
        Ok(code) => code,
        Err(RunError::PollLockBusy(component)) => {
            // The previous pass is still running: normal under cron, so stay quiet.
            info!("poll lock of {component} busy; another pass is running");
            exit::POLL_LOCK_BUSY
        }
        Err(e) => {
            eprintln!("{name}: {}", crate::for_terminal(&e.to_string()));
            e.code()
        }
    };
    std::io::stdout().flush().ok();
    if binary == Binary::Component {
        // The pass's spans go to the collector before the process ends (a cron pass is over
        // in seconds, before the exporter's own schedule); bounded, and nothing when
        // telemetry is off.
        autocomp_toolkit::telemetry::shutdown();
        // Do not wait for a hung work thread: every lock and claim is already released.
        runtime.shutdown_background();
    }
    ExitCode::from(code)
}

async fn run_async<C: Component>(component: C, args: RunnerArgs) -> Result<u8, RunError> {
    let shutdown = shutdown_signal()?;
    let (loaded, settings, trigger) = match configure(&component, &args) {
        Ok(configured) => configured,
        Err(refused) => {
            // A dry run writes nothing, not even this.
            if !args.dry_run {
                crate::refusal::tell_registry(&component, &args.config_dir, args.backends(), &refused.to_string())
                    .await;
            }
            return Err(refused.into());
        }
    };
    let schedule = args
        .schedule
        .as_deref()
        .map(Schedule::parse)
        .transpose()
        .map_err(|e| RunError::Usage(format!("--schedule: {e} (write e.g. '*/5 * * * *')")))?;
    let heartbeat = loaded.component.watch_heartbeat;
    let mut component_config = loaded.component.clone();
    if let Some(schedule) = &schedule {
        component_config.schedule = Some(schedule.clone());
    }
    let backends = loaded.backends.clone().overridden_by(args.backends());
    let (store_url, index_url, locks_url) = backends.require(&loaded.shared_file)?;
    let selection = match &args.batch {
        Some(id) => Selection::Batch {
            id: BatchId::new(id.as_str()).map_err(|e| RunError::Usage(e.to_string()))?,
            force: args.force,
        },
        None => Selection::Ready,
    };
    let store = open_store(&store_url).await?;
    let index = open_index(&index_url, Arc::clone(&store))?;
    let watched = Watched { store: Arc::clone(&store), index: Arc::clone(&index) };
    let locks = open_locks(&locks_url).await?;
    let pipeline = Pipeline { store, index, locks: Arc::clone(&locks) };
    let ran = async {
        let setup = Setup { config: component_config, pipeline, shutdown: shutdown.clone() };
        let runner = Runner::new(component, settings, trigger, setup)?;
        if args.dry_run {
            let dry = runner.dry_run(&selection, args.dry_run_limit).await?;
            print_dry_run(runner.name(), &dry);
            // A pass would refuse to start: so says the dry run's exit code too.
            return Ok(if dry.refused.is_some() { exit::USAGE } else { exit::OK });
        }
        if args.watch {
            return run_watching(&runner, watched, heartbeat, shutdown).await;
        }
        match &schedule {
            None => pass(&runner, &selection).await.map(|outcome| outcome.code),
            Some(schedule) => run_on_schedule(&runner, &selection, schedule, shutdown).await,
        }
    }
    .await;
    // Delete whatever lock is still held and end the lock session before the process exits.
    locks.close().await;
    ran
}

/// The component's configuration: its file (and the shared one's backends), its settings
/// and its trigger; a configuration error refuses the pass (exit 2).
fn configure<C: Component>(
    component: &C,
    args: &RunnerArgs,
) -> Result<(config::LoadedConfig, C::Settings, autocomp_model::Trigger), config::ConfigError> {
    let loaded = config::load(component.name(), args.config.as_deref(), &args.config_dir)?;
    let settings: C::Settings = config::settings(&loaded.component.settings, &loaded.file)?;
    let trigger = loaded.component.trigger(&component.trigger(), &loaded.file)?;
    Ok((loaded, settings, trigger))
}

/// `--dry-run`'s answer: a line per candidate on stdout (a closed stdout ends the listing,
/// not the process with a panic); a hold and the candidates left out on stderr, so stdout
/// stays one line per batch for whatever reads it.
fn print_dry_run(name: &ComponentName, dry: &DryRun) {
    if let Some(refused) = &dry.refused {
        let refused = crate::for_terminal(refused);
        writeln!(std::io::stderr().lock(), "{name}: dry run: claiming nothing: a pass would not start: {refused}").ok();
    }
    if let Some(held) = &dry.held {
        // On stderr, first.
        writeln!(std::io::stderr().lock(), "{name}: dry run: claiming nothing now: {}", crate::for_terminal(held)).ok();
    }
    let mut stdout = std::io::stdout().lock();
    for line in &dry.lines {
        if writeln!(stdout, "{}", crate::for_terminal(line)).is_err() {
            break;
        }
    }
    stdout.flush().ok();
    if dry.not_shown > 0 {
        writeln!(
            std::io::stderr().lock(),
            "{name}: dry run: {} more candidate(s) not shown; --dry-run-limit 0 lists them all, as does \
             `autocomp ready --component {name}`",
            dry.not_shown
        )
        .ok();
    }
}

/// `--schedule`: a pass at every matching minute; passes never overlap (a pass that runs
/// past the next slot makes the loop wait for the slot after it).
async fn run_on_schedule<C: Component>(
    runner: &Arc<Runner<C>>,
    selection: &Selection,
    schedule: &Schedule,
    mut shutdown: watch::Receiver<bool>,
) -> Result<u8, RunError> {
    let mut worst = exit::OK;
    loop {
        let now = chrono::Local::now();
        let next =
            schedule.next_after(&now).ok_or_else(|| RunError::Usage(format!("--schedule {schedule} fires no more")))?;
        let wait = (next - now).to_std().unwrap_or_default();
        info!("next pass at {next}");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop_requested(&mut shutdown) => return Ok(worst),
        }
        match pass_verdict(pass(runner, selection).await, &mut worst) {
            PassEnd::Continue { .. } => {}
            // Stays up: the next scheduled pass starts once the contract is mended.
            PassEnd::Refused(reason) => error!("pass not started, tried again at the next slot: {reason}"),
            PassEnd::Stop(code) => return Ok(code),
            PassEnd::Error(e) => return Err(e),
        }
        if *shutdown.borrow() {
            return Ok(worst);
        }
    }
}

/// Becomes true on SIGTERM or SIGINT: stop claiming, let work finish within the grace.
/// A second signal exits at once (like a SIGKILL: open runs are abandoned, locks freed).
/// The handlers are installed before this returns, so no signal is missed at start-up.
fn shutdown_signal() -> Result<watch::Receiver<bool>, RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind| signal(kind).map_err(|e| RunError::Usage(format!("cannot install signal handlers: {e}")));
    let (mut term, mut int) = (install(SignalKind::terminate())?, install(SignalKind::interrupt())?);
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        for signals_seen in 1.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if signals_seen > 1 {
                eprintln!("second signal: exiting now");
                std::process::exit(130);
            }
            info!("stopping: no new claims; running work has shutdown_grace to finish");
            sender.send(true).ok();
        }
    });
    Ok(receiver)
}
