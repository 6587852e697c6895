//! `autocomp`: the operator's command line. Argument parsing and output only;
//! the logic is in `autocomp_ops::operator` (and `demo`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use autocomp_framework::LogFormat;
use autocomp_framework::config::{Backends, DEFAULT_CONFIG_DIR};
use autocomp_model::{BatchId, ComponentName, ComponentState, InvalidInput, Outcome, Seq};
use autocomp_ops::operator::{
    AlertDefaults, ExportScope, Format, LogSpan, LogsQuery, NewBatchRequest, Operator, OperatorError, SHOW_EVENTS,
    TableFormat,
};
use clap::{Parser, Subcommand};

#[path = "autocomp_cli/act.rs"]
mod act;

use act::{ActCommand, SteerCommand};

/// Operate an autocomp pipeline: look at batches, and rerun, restart, cancel, skip or
/// prioritize their steps. Every write is appended to the batch's log as an event naming
/// the operator (--as) and the reason (--reason); nothing is ever edited, and only `prune`
/// removes history, once it is exported and read back.
const CLI_EXIT_CODES: &str = "Exit codes: 0 ok, 1 an action the batch's state refuses (nothing written) or \
                              `alerts` printed alerts or a `doctor` check failed or another `prune` holds the export \
                              directory or `import` left lines, 2 usage, config or input error, 4 lock service lost, 5 \
                              store or index unreachable (or the store's disk full, or a service or schema of another \
                              release), 6 a lock node autocomp did not make (or a lock tree this identity may not fix).";

#[derive(Parser)]
#[command(name = "autocomp", version, after_help = CLI_EXIT_CODES)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log lines on stderr as text (coloured only on a terminal) or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Directory holding autocomp.toml (the backends; optional when they come from the
    /// environment or flags). The pipeline itself is read from the store's component
    /// registry [default: /etc/autocomp]
    #[arg(long, value_name = "DIR", env = "AUTOCOMP_CONFIG_DIR", global = true)]
    config_dir: Option<PathBuf>,
    /// Store URL: sqlite:///var/lib/autocomp/store.db, postgres://user@db1,db2/autocomp or
    /// http://host:7070 (overrides autocomp.toml).
    #[arg(long, env = "AUTOCOMP_STORE", hide_env_values = true, value_name = "URL", global = true)]
    store: Option<String>,
    /// Batch index URL, e.g. local:/var/lib/autocomp/index.
    #[arg(long, env = "AUTOCOMP_INDEX", hide_env_values = true, value_name = "URL", global = true)]
    index: Option<String>,
    /// Lock service URL, e.g. local:/var/lib/autocomp/locks or zk://zk1:2181/autocomp.
    #[arg(long, env = "AUTOCOMP_LOCKS", hide_env_values = true, value_name = "URL", global = true)]
    locks: Option<String>,
    /// Who is acting; every write records the agent `operator:<NAME>` [default: $USER, then
    /// $LOGNAME, then the login name of the user id]
    #[arg(long = "as", value_name = "NAME", global = true)]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// What `autocomp export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ExportFormat {
    /// PREMIS 3.0 XML.
    Premis,
}

#[derive(Subcommand)]
enum Command {
    /// Register a batch. Records no event (no Data_Received): the batch waits for whatever
    /// records its first one (a source component, or `autocomp event ID --type Data_Received`).
    Add {
        /// The batch id.
        id: BatchId,
        /// The batch type, e.g. RoundTrip.
        #[arg(long = "type", value_name = "TYPE")]
        batch_type: String,
        /// Higher runs first.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Where the batch's files are (kept as an absolute path).
        #[arg(long, value_name = "PATH")]
        location: Option<PathBuf>,
        /// Kept in the batch's metadata with the operator's name.
        #[arg(long)]
        reason: Option<String>,
        /// The answer as text or JSON (as the actions').
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Record an event by hand (e.g. a Data_Received for a batch delivered outside the
    /// pipeline). The type must be one the pipeline records or waits for.
    Event {
        /// The batch id.
        id: BatchId,
        #[arg(long = "type", value_name = "TYPE")]
        event_type: String,
        #[arg(long, value_parser = ["success", "failure"])]
        outcome: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        /// The answer as text or JSON (as the actions').
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// A batch's effective view, component states, open runs and the newest page of its
    /// log with every report (oldest first within the page); it says how to see older events.
    /// Never reads the whole log unless --all asks for it.
    Show {
        /// The batch id.
        id: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Only events older than this seq: the page before one shown (its "older events").
        #[arg(long, value_name = "SEQ", conflicts_with = "all", value_parser = clap::value_parser!(i64).range(1..))]
        before: Option<i64>,
        /// Events per page (1 to 1000) [default: 50]
        #[arg(long, value_name = "N", conflicts_with = "all", value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: Option<u16>,
        /// The whole log, oldest first, read and printed a page at a time.
        #[arg(long)]
        all: bool,
        /// One event whole, its details included (a page shows details over 16 KiB as their
        /// size and this command).
        #[arg(long, value_name = "SEQ", conflicts_with_all = ["all", "before", "limit"],
              value_parser = clap::value_parser!(i64).range(1..))]
        event: Option<i64>,
    },
    /// An online, consistent copy of the embedded store (sqlite://) into FILE while the
    /// components run, checked and described (what it holds, as of which seq). A PostgreSQL
    /// store is backed up with PostgreSQL's tools (README: Backup and restore).
    Backup {
        /// The new file (never overwritten).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Takes finished batches' histories out of the store under a retention policy (a TOML
    /// file: export_dir, and per batch type `after` and `require`): exports them to zstd
    /// JSON Lines files, one per month, reads each back and checks it, writes a manifest with
    /// counts and SHA-256 digests, and only then prunes each batch in short transactions while
    /// passes go on. A pruned batch keeps its final state per step and a History_Pruned event
    /// naming its export; it is ready for nothing until `autocomp import` restores it. Quiet
    /// when nothing is due.
    Prune {
        /// The retention policy file.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Only count the batches due; export and prune nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Puts pruned batches' histories back from export files `autocomp prune` wrote: each
    /// batch whose History_Pruned event names that file's line gets every event and run back
    /// at its seq, and is ready again as before. Every file is read and checked whole first.
    /// Exit 1 when lines were left (another line of the batch was pruned, or no such batch,
    /// or, over the store service, a line over the 4 MiB one request carries: the store's own
    /// URL imports it).
    Import {
        /// Export files (history-*.jsonl.zst).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// The provenance of batches for an archive's own systems, on stdout: PREMIS 3.0 XML (an
    /// object per batch, an event per recorded event, an agent per component version and
    /// per operator), as of the store's head when it began; a count on stderr.
    Export {
        /// The batches to export (each must exist).
        #[arg(required_unless_present_any = ["all", "from"], conflicts_with_all = ["all", "from"], value_name = "ID")]
        ids: Vec<String>,
        /// Every batch.
        #[arg(long, conflicts_with = "from")]
        all: bool,
        /// The pruned histories in these export files of `autocomp prune` (read without the
        /// store), instead of batches in the store.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        from: Vec<PathBuf>,
        /// premis: PREMIS 3.0 XML.
        #[arg(long, value_enum)]
        format: ExportFormat,
    },
    /// What each run of a batch printed, kept with its result (a command's stdout and
    /// stderr, a Rust component's log lines; head and tail within the component's
    /// max_output): per attempt, oldest first, the attempts that kept any output; then the
    /// runs without a result (cancelled, running, abandoned) with what they printed.
    Logs {
        /// The batch id.
        id: String,
        /// Only this component's runs.
        #[arg(long)]
        component: Option<String>,
        /// Only its Nth run on the batch (1 is the first), with or without output.
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
        /// Only this stream: stdout, stderr (autocomp-exec) or log (Rust components).
        #[arg(long, value_name = "NAME")]
        stream: Option<String>,
        /// Then follow the runs going on the batch: what they print as their runners save
        /// it (every 2 s while it grows), and how each ends (its result; a cancel, with its
        /// whole output; its worker gone); returns once none is going. Text only; not with
        /// --attempt.
        #[arg(long, conflicts_with = "attempt")]
        follow: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Each batch's state per component: success, failed, working (open run), ready
    /// (trigger holds) or waiting.
    Status {
        /// Only this component's column (and, with --state, its state).
        #[arg(long)]
        component: Option<String>,
        /// Only batches where the component (or any component) is in this state.
        #[arg(long, value_parser = component_state())]
        state: Option<ComponentState>,
        #[arg(long, value_enum, default_value_t = TableFormat::Table)]
        format: TableFormat,
    },
    #[command(flatten)]
    Act(ActCommand),
    #[command(flatten)]
    Steer(SteerCommand),
    /// Why a batch is or is not ready for a component: each trigger clause in the store and
    /// in the index, the retry window of a transient failure, attempts, open run, locks, and
    /// what to run next. Without --component: every step of the batch that is not a success.
    Explain {
        /// The batch id.
        id: String,
        /// Only this component (default: every step that is not a success).
        #[arg(long)]
        component: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Failed batches per component with their reasons grouped, the most frequent first (of
    /// the first --sample failed batches of each), their ids, and what to run next.
    Failures {
        /// Only this component.
        #[arg(long)]
        component: Option<String>,
        /// Failed batches whose reasons are read per component (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
        sample: u16,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// What a pass of the component would claim now (index query, store re-check, locks).
    Ready {
        #[arg(long)]
        component: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// The components of the pipeline, as their own passes registered them in the store:
    /// event type, trigger, hosts and their last pass, last seen, version.
    Pipeline {
        #[command(subcommand)]
        action: Option<PipelineAction>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Only what needs a person, one line each, and exit 1 when there is any (for a cron
    /// line that mails exactly the news): failed batches with their most frequent reasons,
    /// batches ready longer than their component's
    /// overdue_after (else --ready-after), runs past their max_runtime, components no host
    /// has run for their silent_after (else for --silent-periods passes of their schedule,
    /// else for --silent-after), an index behind the store, components paused longer than
    /// --paused-after or with their circuit open.
    Alerts {
        /// Default for components whose config sets no overdue_after.
        #[arg(long, value_name = "AGE", default_value = "1h", value_parser = humantime::parse_duration)]
        ready_after: Duration,
        /// Default for components whose config sets neither silent_after nor schedule.
        #[arg(long, value_name = "AGE", default_value = "1h", value_parser = humantime::parse_duration)]
        silent_after: Duration,
        /// Passes of its schedule a component may miss (components with a schedule and no
        /// silent_after).
        #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        silent_periods: u32,
        /// Store changes the index may be behind.
        #[arg(long, value_name = "CHANGES", default_value_t = 10_000)]
        index_lag: u64,
        /// A component (or the pipeline) paused or draining longer than this (an open
        /// circuit is reported at once).
        #[arg(long, value_name = "AGE", default_value = "4h", value_parser = humantime::parse_duration)]
        paused_after: Duration,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Check this host end to end, one line per check with its verdict and, for a failure,
    /// the fix: the config files parse; the store answers with these credentials at this
    /// release's schema; this host's clock against the store's; the index answers and how
    /// far it lags; the lock service answers, authenticated, with the ACLs the framework
    /// sets; free space for the store, index and locks; the token, password, identity and
    /// key files the configuration names are readable, private and strong enough; the
    /// certificates are valid and do not expire soon; the components run, and none is
    /// silent or held. Changes nothing. Run it as the pipeline's user (`sudo -u autocomp`).
    /// Exit 0 when every check passes, 1 otherwise, 2 for a bad flag.
    Doctor(DoctorArgs),
    /// The pipeline's metrics in the Prometheus text format (for node_exporter's textfile
    /// collector on hosts without a monitor; the monitor serves the same on /metrics).
    Metrics {
        /// Overdue threshold for components whose config sets no overdue_after.
        #[arg(long, value_name = "AGE", default_value = "1h", value_parser = humantime::parse_duration)]
        ready_after: Duration,
    },
    /// Send what is news by mail and/or webhook, as notify.toml in the config dir says:
    /// permanent failures, open circuits, long pauses, overdue work, batches waiting for a
    /// person, a daily digest. Each item goes out once per channel however many notifiers run
    /// (from cron on several hosts, or inside the monitor). Prints nothing when all went out;
    /// a delivery that failed (tried again by a later run) is printed and exits 1.
    Notify,
    /// Rebuild the batch index from the store, with a progress bar.
    Reindex,
    /// Every held lock with its holder and age.
    Locks {
        /// Only locks held longer than this (e.g. 2h); prints nothing when there are none.
        #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
        stale: Option<Duration>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Write a new component crate (main.rs with a settings struct, a unit test) and its
    /// config file; inside the autocomp workspace it is also added as a member.
    New(autocomp_ops::scaffold::NewArgs),
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

#[derive(Subcommand)]
enum PipelineAction {
    /// Retire a component that no longer runs (renamed, removed): it leaves `status`,
    /// `show` and the monitor. It comes back if it runs a pass again.
    Forget {
        /// The component's name.
        component: ComponentName,
        /// Why: recorded in the registry (required).
        #[arg(long, required = true)]
        reason: String,
    },
}

/// `--state`: one of the component states, by their own names (the list clap shows is theirs).
fn component_state() -> impl clap::builder::TypedValueParser<Value = ComponentState> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(ComponentState::ALL.map(ComponentState::as_str))
        .try_map(|state| ComponentState::parse(&state))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refused_argument(e),
    };
    autocomp_framework::init_logging(cli.verbose, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("autocomp: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Command::Doctor(args) = cli.command {
        let config_dir = cli.config_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR));
        let overrides = Backends { store: cli.store, index: cli.index, locks: cli.locks };
        let code = runtime.block_on(doctor(args, &config_dir, overrides));
        runtime.shutdown_background();
        return code;
    }
    // `alerts` exits 1 when it printed anything, so cron's mail is the alert.
    let alerting = matches!(cli.command, Command::Alerts { .. });
    let code = match runtime.block_on(operate(cli)) {
        Ok(output) => {
            // Batches carry text from outside (reasons, reports, file names): nothing in it
            // may act on the terminal.
            // Best effort: a closed stdout (`| head`) just ends the output; the exit code
            // stays what the command's result says.
            let mut stdout = std::io::stdout().lock();
            if let Err(e) = write!(stdout, "{}", autocomp_toolkit::for_terminal(&output)).and_then(|()| stdout.flush())
            {
                tracing::debug!("cannot print the output: {e}");
            }
            u8::from(alerting && !output.is_empty())
        }
        Err(e) => {
            eprintln!("autocomp: {}", autocomp_toolkit::for_terminal(&e.to_string()));
            e.code()
        }
    };
    std::io::stdout().flush().ok();
    // Everything is written and printed; do not wait on a backend's background threads.
    runtime.shutdown_background();
    ExitCode::from(code)
}

/// A bad batch id or component name is refused in the operator module's words, as when the
/// operator module checked it (`autocomp: batch id "../x": ...`, exit 2); any other bad
/// argument as clap says it.
fn refused_argument(error: clap::Error) -> ExitCode {
    match std::error::Error::source(&error).and_then(|source| source.downcast_ref::<InvalidInput>()) {
        Some(invalid) => {
            eprintln!("autocomp: {}", autocomp_toolkit::for_terminal(&invalid.to_string()));
            ExitCode::from(autocomp_framework::exit::USAGE)
        }
        None => error.exit(),
    }
}

/// `autocomp doctor`'s flags.
#[derive(clap::Args)]
struct DoctorArgs {
    /// Less free space than this (MiB) where the store, index or locks live fails.
    #[arg(long, value_name = "MiB", default_value_t = 1024)]
    min_free_mib: u64,
    /// Store changes the index may be behind.
    #[arg(long, value_name = "CHANGES", default_value_t = 10_000)]
    index_lag: u64,
    /// How far this host's clock may be from the store's.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    max_clock_skew: Duration,
    /// A certificate that expires sooner than this fails.
    #[arg(long, value_name = "DURATION", default_value = "30days", value_parser = humantime::parse_duration)]
    expires_within: Duration,
    /// Also check this certificate file (a service's --tls-cert or --tls-client-ca).
    #[arg(long = "cert", value_name = "FILE")]
    certs: Vec<PathBuf>,
    /// Also check this private key file (a service's --tls-key).
    #[arg(long = "key", value_name = "FILE")]
    keys: Vec<PathBuf>,
    /// Also check this token file (a service's --token-file).
    #[arg(long = "token-file", value_name = "FILE")]
    token_files: Vec<PathBuf>,
    /// Also check that this file is private (the monitor's users file).
    #[arg(long = "secret-file", value_name = "FILE")]
    secret_files: Vec<PathBuf>,
    /// How long the store, the index and the lock service each get to answer.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// A line per check (text), or one JSON document.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// `autocomp doctor`: prints every check; exit 0 when all pass, 1 otherwise.
async fn doctor(args: DoctorArgs, config_dir: &std::path::Path, overrides: Backends) -> ExitCode {
    let DoctorArgs {
        min_free_mib,
        index_lag,
        max_clock_skew,
        expires_within,
        certs,
        keys,
        token_files,
        secret_files,
        timeout,
        format,
    } = args;
    use autocomp_ops::doctor::{DoctorOptions, FileKind};
    let mut options = DoctorOptions::new(config_dir, overrides);
    options.min_free = min_free_mib.saturating_mul(1 << 20);
    options.index_lag = index_lag;
    options.max_clock_skew = max_clock_skew;
    options.expires_within = expires_within;
    options.timeout = timeout;
    let named = [
        (FileKind::Certificate, certs),
        (FileKind::PrivateKey, keys),
        (FileKind::Tokens, token_files),
        (FileKind::Secret, secret_files),
    ];
    options.extra_files =
        named.into_iter().flat_map(|(kind, paths)| paths.into_iter().map(move |p| (kind, p))).collect();
    let report = autocomp_ops::doctor::run(&options).await;
    let mut stdout = std::io::stdout().lock();
    let _ = write!(stdout, "{}", autocomp_toolkit::for_terminal(&report.render(format))).and_then(|()| stdout.flush());
    ExitCode::from(u8::from(!report.passed()))
}

async fn operate(cli: Cli) -> Result<String, OperatorError> {
    if let Command::Demo { dir, batches } = &cli.command {
        // The demo writes its own config dir; it must not read --config-dir.
        autocomp_ops::demo::run(dir, *batches as usize).await?;
        return Ok(String::new());
    }
    if let Command::New(args) = &cli.command {
        return autocomp_ops::scaffold::run(args);
    }
    let overrides = Backends { store: cli.store, index: cli.index, locks: cli.locks };
    let config_dir = cli.config_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR));
    let operator = Operator::new(&config_dir, overrides, cli.operator)?;
    match cli.command {
        Command::Act(command) => command.run(&operator).await,
        Command::Steer(command) => command.run(&operator).await,
        command => write_or_read(&operator, command).await,
    }
}

/// The writes that are no action on a batch (`add`, `event`, `pipeline forget`, `prune`,
/// `import`), and the reads.
async fn write_or_read(operator: &Operator, command: Command) -> Result<String, OperatorError> {
    Ok(match command {
        Command::Add { id, batch_type, priority, location, reason, format } => {
            let request = NewBatchRequest { priority, location: location.as_deref(), reason: reason.as_deref() };
            operator.add(&id, &batch_type, request).await?.render_as(format)
        }
        Command::Event { id, event_type, outcome, reason, format } => {
            operator.record_event(&id, &event_type, Outcome::parse(&outcome)?, &reason).await?.render_as(format)
        }
        Command::Pipeline { action: Some(PipelineAction::Forget { component, reason }), .. } => {
            operator.forget(&component, &reason).await?
        }
        Command::Prune { policy, dry_run, format } => operator.prune(&policy, dry_run).await?.render(format),
        Command::Import { files, format } => {
            let imported = operator.import(&files).await?;
            if imported.other.is_empty() {
                imported.render(format)
            } else {
                // What was restored is said as ever; the exit code says that lines were left.
                print!("{}", autocomp_toolkit::for_terminal(&imported.render(format)));
                let left = imported.other.len();
                return Err(OperatorError::Refused(format!("{left} lines of the export were left (above)")));
            }
        }
        command => read(operator, command).await?,
    })
}

/// The commands that only read (and `reindex`, `notify`, which write no batch).
async fn read(operator: &Operator, command: Command) -> Result<String, OperatorError> {
    Ok(match command {
        Command::Show { id, event: Some(seq), .. } => operator.show_event(&BatchId::new(&id)?, seq).await?,
        Command::Show { id, format, all: true, .. } => {
            let mut stdout = QuietOnClose::new(std::io::stdout().lock());
            match operator.show_all(&BatchId::new(&id)?, format, &mut stdout).await {
                Ok(()) => stdout.flush().or_else(|e| stdout.closed_or(e)).map(|()| String::new()),
                Err(_) if stdout.closed => Ok(String::new()),
                Err(e) => Err(e),
            }?
        }
        Command::Show { id, format, before, limit, all: false, event: None } => {
            let limit = limit.map_or(SHOW_EVENTS, usize::from);
            let span = LogSpan::Page { before: before.map(Seq), limit };
            operator.show_page(&BatchId::new(&id)?, span).await?.render(format)
        }
        Command::Backup { to, format } => operator.backup(&to).await?.render(format),
        Command::Export { ids, all, from, format: ExportFormat::Premis } => {
            let scope = match all {
                true => ExportScope::All,
                false => ExportScope::Batches(ids.iter().map(BatchId::new).collect::<Result<_, _>>()?),
            };
            let mut stdout = QuietOnClose::new(std::io::stdout().lock());
            let exported = match from.is_empty() {
                true => operator.export_premis(&scope, &mut stdout).await,
                false => operator.export_premis_from(&from, &mut stdout),
            };
            match exported {
                Ok(count) if count.objects == 0 => {
                    eprintln!("nothing to export: no batch (as of seq {}); no document written", count.as_of);
                    String::new()
                }
                Ok(count) => {
                    stdout.flush().or_else(|e| stdout.closed_or(e))?;
                    eprintln!(
                        "exported {} batches, {} events and {} agents as PREMIS 3.0, as of seq {}",
                        count.objects, count.events, count.agents, count.as_of
                    );
                    String::new()
                }
                Err(_) if stdout.closed => String::new(),
                Err(e) => return Err(e),
            }
        }
        Command::Logs { id, component, attempt, stream, follow, format } => {
            let component = component.as_deref().map(ComponentName::new).transpose()?;
            let query = LogsQuery { component, attempt, stream, follow };
            let mut stdout = QuietOnClose::new(std::io::stdout().lock());
            match operator.logs(&BatchId::new(&id)?, &query, format, &mut stdout).await {
                Ok(()) => stdout.flush().or_else(|e| stdout.closed_or(e)).map(|()| String::new()),
                Err(_) if stdout.closed => Ok(String::new()),
                Err(e) => Err(e),
            }?
        }
        Command::Status { component, state, format } => {
            let component = component.as_deref().map(ComponentName::new).transpose()?;
            operator.status(component.as_ref(), state).await?.render(format)
        }
        Command::Explain { id, component: Some(component), format } => {
            // The component first: a bad name is the error when both are bad, as before.
            let component = ComponentName::new(&component)?;
            operator.explain(&BatchId::new(&id)?, &component).await?.render(format)
        }
        Command::Explain { id, component: None, format } => {
            operator.explain_batch(&BatchId::new(&id)?).await?.render(format)
        }
        Command::Failures { component, sample, format } => {
            let component = component.as_deref().map(ComponentName::new).transpose()?;
            operator.failures(component.as_ref(), usize::from(sample)).await?.render(format)
        }
        Command::Ready { component, format } => operator.ready(&ComponentName::new(&component)?).await?.render(format),
        Command::Pipeline { action: None, format } => operator.pipeline_view().await?.render(format),
        Command::Alerts { ready_after, silent_after, silent_periods, index_lag, paused_after, format } => {
            let defaults = AlertDefaults { ready_after, silent_after, silent_periods, index_lag, paused_after };
            operator.alerts(&defaults).await?.render(format)
        }
        Command::Metrics { ready_after } => {
            operator.metrics(&AlertDefaults { ready_after, ..AlertDefaults::default() }).await?
        }
        Command::Notify => notify(operator).await?,
        Command::Reindex => operator.reindex().await?,
        Command::Locks { stale, format } => operator.locks_held(stale).await?.render(format),
        Command::Demo { .. } | Command::New(_) | Command::Doctor(_) => String::new(),
        // Written by `operate` and `write_or_read` before they ask for a read.
        Command::Act(_) | Command::Steer(_) | Command::Add { .. } | Command::Event { .. } => String::new(),
        Command::Prune { .. } | Command::Import { .. } => String::new(),
        Command::Pipeline { action: Some(_), .. } => String::new(),
    })
}

/// `autocomp notify`: one pass of the notifier; a delivery that failed is an error (exit 1).
async fn notify(operator: &Operator) -> Result<String, OperatorError> {
    let config = autocomp_ops::notify::NotifyConfig::load(operator.config_dir())?;
    let store = operator.store().await?;
    let index = operator.index(&store)?;
    let holder = format!("notify@{}#{}", autocomp_framework::hostname(), std::process::id());
    let report = autocomp_ops::notify::notify_once(store, index, &config, &holder).await?;
    tracing::info!(found = report.found, sent = report.sent, failed = report.failed, "notify pass");
    if report.failed > 0 {
        return Err(OperatorError::Refused(report.render().trim_end().to_owned()));
    }
    Ok(report.notes.iter().map(|note| format!("notify: {note}\n")).collect())
}

/// Stdout for output written as it is made (`show --all`): a reader that stops reading
/// (`| head`) ends the output quietly, as it does for the other commands.
struct QuietOnClose<W: Write> {
    inner: std::io::BufWriter<W>,
    closed: bool,
}

impl<W: Write> QuietOnClose<W> {
    fn new(inner: W) -> Self {
        Self { inner: std::io::BufWriter::new(inner), closed: false }
    }

    /// `Ok` when the reader went away, else the error as an operator error.
    fn closed_or(&mut self, error: std::io::Error) -> Result<(), OperatorError> {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            self.closed = true;
            return Ok(());
        }
        Err(OperatorError::Run(autocomp_framework::exit::RunError::Usage(format!("cannot write the output: {error}"))))
    }
}

impl<W: Write> Write for QuietOnClose<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| self.closed |= e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| self.closed |= e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}
