//! `autocomp`: the operator's command line. Argument parsing and output only;
//! the logic is in `autocomp_ops::operator` (and `demo`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use autocomp_framework::LogFormat;
use autocomp_framework::config::{Backends, DEFAULT_CONFIG_DIR};
use autocomp_model::{BatchId, ComponentName, ComponentState, IdempotencyKey, InvalidInput, Outcome, Seq};
use autocomp_ops::operator::{
    Action, AlertDefaults, Format, HumanStep, LogSpan, LogsQuery, Operator, OperatorError, RestartFrom, SHOW_EVENTS,
    Scope, SteerAction, TableFormat,
};
use clap::{ArgGroup, Parser, Subcommand};

/// Operate an autocomp pipeline: look at batches, and rerun, restart, cancel, skip or
/// prioritize their steps. Every write is appended to the batch's log as an event naming
/// the operator (--as) and the reason (--reason); nothing is ever edited or deleted.
const CLI_EXIT_CODES: &str = "Exit codes: 0 ok, 1 an action the batch's state refuses (nothing written) or \
                              `alerts` printed alerts or a `doctor` check failed, 2 usage, config or input error, 4 lock service lost, 5 store or \
                              index unreachable (or the store's disk full), 6 a lock node autocomp did not make \
                              (or a lock tree this identity may not fix).";

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

#[derive(Subcommand)]
enum Command {
    /// Register a batch. Records no event (no Data_Received): the batch waits for whatever
    /// records its first one (a source component, or `autocomp event ID --type Data_Received`).
    Add {
        /// The batch id.
        id: String,
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
        id: String,
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
    /// What each run of a batch printed, kept with its result (a command's stdout and
    /// stderr, a Rust component's log lines; head and tail within the component's
    /// max_output): per attempt, oldest first, the attempts that kept any output.
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
    /// Append a Reset marker for the component's event type: it triggers again (if its
    /// requirements hold). Nothing else changes.
    Rerun {
        /// The batch id.
        id: String,
        #[arg(long)]
        component: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        #[command(flatten)]
        guard: Guard,
    },
    /// Append a Reset marker for a starting event type and every type whose effective event
    /// has a higher seq (was recorded after it): those steps trigger again.
    #[command(group(ArgGroup::new("start").required(true).args(["from_first_failure", "from"])))]
    Restart {
        /// The batch id.
        id: String,
        /// Start at the effective failure with the lowest seq.
        #[arg(long)]
        from_first_failure: bool,
        /// Start at this event type's effective event.
        #[arg(long, value_name = "TYPE")]
        from: Option<String>,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        #[command(flatten)]
        guard: Guard,
    },
    /// Fence the component's running worker on the batch (it stops within seconds and can
    /// record nothing) and record a failure flagged `cancelled`. With no running worker it
    /// is refused (exit 1, nothing written) unless --record-anyway.
    Cancel {
        /// The batch id.
        id: String,
        #[arg(long)]
        component: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        /// Record the cancelled failure even when the component has no open run on the batch.
        #[arg(long)]
        record_anyway: bool,
        #[command(flatten)]
        guard: Guard,
    },
    /// Record a success flagged `skipped` for the component, so the next ones may run. Over
    /// a success that counts (not skipped, not stale) it is refused (exit 1, nothing
    /// written) unless --force.
    Skip {
        /// The batch id.
        id: String,
        #[arg(long)]
        component: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        /// Skip even when the component's effective event is already a success.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        guard: Guard,
    },
    /// Set a batch's priority (higher runs first); recorded as a `Prioritized` event.
    Prioritize {
        /// The batch id.
        id: String,
        #[arg(allow_negative_numbers = true)]
        priority: i32,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        #[command(flatten)]
        guard: Guard,
    },
    /// A person's approval at a human step the batch waits at (`status --state person`):
    /// records the step's event as a success flagged `approved`, so the steps after it run.
    Approve {
        /// The batch id.
        id: String,
        /// The human step (declared with `autocomp step add`).
        #[arg(long)]
        step: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        #[command(flatten)]
        guard: Guard,
    },
    /// A person's rejection at a human step: records the step's event as a failure flagged
    /// `rejected`; with --restart-from, a Reset from that type instead (as `restart --from`),
    /// so the batch is redone from there and comes to the step again.
    Reject {
        /// The batch id.
        id: String,
        /// The human step (declared with `autocomp step add`).
        #[arg(long)]
        step: String,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        /// Send the batch back: supersede this type's result and every result after it.
        #[arg(long, value_name = "TYPE")]
        restart_from: Option<String>,
        #[command(flatten)]
        guard: Guard,
    },
    /// Stop a component (or the whole pipeline: --all) from claiming new work, on every host,
    /// from its next claim; running work goes on to its result. A paused cron pass prints
    /// nothing and exits 0; `status`, `pipeline` and `alerts` say who paused it and why.
    Pause {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        steer: SteerArgs,
    },
    /// Pause for maintenance: as `pause`, and with --wait return only once nothing in the
    /// scope runs any more (exit 1 if --timeout passes first).
    Drain {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        steer: SteerArgs,
        /// Return once nothing in the scope runs.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this long (exit 1).
        #[arg(long, value_name = "AGE", default_value = "1h", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Lift a pause, drain or open circuit of a component (or of the whole pipeline: --all).
    Resume {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        steer: SteerArgs,
        /// After an open circuit: also rerun the batches that failed while it was breaking.
        #[arg(long)]
        rerun_failed: bool,
    },
    /// Resource pools: a shared resource (a tape library, an API) that takes at most SIZE
    /// batches' work at once across all hosts; components name the pools their work holds
    /// (`pools = ["tape"]` in their config).
    Pool {
        #[command(subcommand)]
        action: PoolAction,
    },
    /// Human steps: a step of the pipeline that a person decides (approve / reject), with a
    /// trigger like any component and no binary.
    Step {
        #[command(subcommand)]
        action: StepAction,
    },
    /// Why a batch is or is not ready for a component: each trigger clause in the store and
    /// in the index, the retry window of a transient failure, attempts, open run, locks.
    Explain {
        /// The batch id.
        id: String,
        #[arg(long)]
        component: String,
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
    /// line that mails exactly the news): batches ready longer than their component's
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

/// What every action (rerun, restart, cancel, skip, prioritize) takes besides its own input.
#[derive(clap::Args)]
struct Guard {
    /// Write nothing: print what it would record, the state changes and the batch's version
    /// (for --expect-version).
    #[arg(long)]
    dry_run: bool,
    /// Act only if the batch's version (its changed_seq, which every event, claim and
    /// release moves; --dry-run prints it) is still N; else exit 2 naming the field and
    /// the version now, nothing written.
    #[arg(long, value_name = "N", conflicts_with = "dry_run")]
    expect_version: Option<i64>,
    /// An idempotency key for retries from scripts (1-128 printable ASCII characters,
    /// starting with a letter or digit): it is recorded with the event, and a repeated
    /// command with the same key on the same batch writes nothing and answers "already
    /// done" with the earlier seq (exit 0). Use a new key for each new request.
    #[arg(long, value_name = "K", conflicts_with = "dry_run")]
    key: Option<String>,
    /// The answer as text, or as JSON: batch, already_done, event (seq, type, outcome,
    /// agent, at, flags; resets and supersedes for a Reset), changes, message.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

impl Guard {
    async fn act(self, operator: &Operator, id: &str, action: Action, reason: &str) -> Result<String, OperatorError> {
        if self.dry_run {
            return Ok(operator.preview(id, &action, reason).await?.render_as(self.format));
        }
        let key = match &self.key {
            Some(text) => {
                Some(IdempotencyKey::new(text.as_str()).map_err(|e| InvalidInput::new("--key", text, e.reason))?)
            }
            None => None,
        };
        let version = self.expect_version.map(Seq);
        let report = operator.perform_expecting(id, &action, reason, version, key.as_ref()).await?;
        Ok(report.render_as(self.format))
    }
}

/// Which part of the pipeline a pause, drain or resume is about.
#[derive(clap::Args)]
#[command(group(ArgGroup::new("scope").required(true).args(["component", "all"])))]
struct ScopeArgs {
    /// The component.
    component: Option<String>,
    /// The whole pipeline: every component.
    #[arg(long)]
    all: bool,
}

impl ScopeArgs {
    fn scope(self) -> Scope {
        match self.component {
            Some(name) if !self.all => Scope::Component(name),
            _ => Scope::All,
        }
    }
}

/// What every steering action (pause, drain, resume, pool set) takes besides its own input.
#[derive(clap::Args)]
struct SteerArgs {
    /// Why: recorded in the steering log for whoever reads it later (required).
    #[arg(long, required = true)]
    reason: String,
    /// Write nothing: print what it would record and the steering version (for
    /// --expect-version).
    #[arg(long)]
    dry_run: bool,
    /// Act only if the steering state's version (every pause, resume, pool change and
    /// breaker count moves it; --dry-run prints it) is still N; else exit 1, nothing written.
    #[arg(long, value_name = "N", conflicts_with = "dry_run")]
    expect_version: Option<u64>,
    /// The answer as text or JSON.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

impl SteerArgs {
    async fn act(self, operator: &Operator, action: SteerAction) -> Result<String, OperatorError> {
        if self.dry_run {
            return Ok(operator.preview_steer(&action, &self.reason).await?.render(self.format));
        }
        Ok(operator.steer(&action, &self.reason, self.expect_version).await?.render(self.format))
    }
}

#[derive(Subcommand)]
enum PoolAction {
    /// Create a pool or change its size (0 closes it: work needing it waits).
    Set {
        /// The pool's name, e.g. tape.
        name: String,
        /// At most this many batches' work holds a slot at once, across all hosts (0 to 1000).
        #[arg(value_parser = clap::value_parser!(u32).range(0..=1000))]
        size: u32,
        #[command(flatten)]
        steer: SteerArgs,
    },
}

#[derive(Subcommand)]
enum StepAction {
    /// Declare (or change) a human step: batches for which what it requires succeeded wait
    /// for a person at it (`status --state person`, the monitor's "waiting for a person").
    Add {
        /// The step's name, as components are named (e.g. roundtrip-qa).
        name: String,
        /// The event type its decision records (e.g. Roundtrip_Approved).
        #[arg(long, value_name = "TYPE")]
        event_type: String,
        /// The types that must have succeeded first (repeat or separate with commas).
        #[arg(long, value_name = "TYPE", value_delimiter = ',', required = true)]
        requires: Vec<String>,
        /// Only batches of these types (repeat or separate with commas) [default: all].
        #[arg(long, value_name = "TYPE", value_delimiter = ',')]
        types: Vec<String>,
        /// Waiting for a person longer than this is overdue (alerts, notifications).
        #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
        overdue_after: Option<Duration>,
        /// Why: recorded in the registry (required).
        #[arg(long, required = true)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum PipelineAction {
    /// Retire a component that no longer runs (renamed, removed): it leaves `status`,
    /// `show` and the monitor. It comes back if it runs a pass again.
    Forget {
        /// The component's name.
        component: String,
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
    let cli = Cli::parse();
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
            if let Err(e) = write!(stdout, "{}", autocomp_toolkit::for_terminal(&output)).and_then(|()| stdout.flush()) {
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
    Ok(match cli.command {
        Command::Add { id, batch_type, priority, location, reason, format } => {
            operator.add(&id, &batch_type, priority, location.as_deref(), reason.as_deref()).await?.render_as(format)
        }
        Command::Event { id, event_type, outcome, reason, format } => {
            operator.record_event(&id, &event_type, Outcome::parse(&outcome)?, &reason).await?.render_as(format)
        }
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
        Command::Logs { id, component, attempt, stream, format } => {
            let query = LogsQuery { component, attempt, stream };
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
        Command::Rerun { id, component, reason, guard } => {
            guard.act(&operator, &id, Action::Rerun { component }, &reason).await?
        }
        Command::Restart { id, from_first_failure: _, from, reason, guard } => {
            let from = from.map_or(RestartFrom::FirstFailure, RestartFrom::Type);
            guard.act(&operator, &id, Action::Restart { from }, &reason).await?
        }
        Command::Cancel { id, component, reason, record_anyway, guard } => {
            guard.act(&operator, &id, Action::Cancel { component, record_anyway }, &reason).await?
        }
        Command::Skip { id, component, reason, force, guard } => {
            guard.act(&operator, &id, Action::Skip { component, force }, &reason).await?
        }
        Command::Prioritize { id, priority, reason, guard } => {
            guard.act(&operator, &id, Action::Prioritize { priority }, &reason).await?
        }
        Command::Approve { id, step, reason, guard } => {
            guard.act(&operator, &id, Action::Approve { step }, &reason).await?
        }
        Command::Reject { id, step, reason, restart_from, guard } => {
            guard.act(&operator, &id, Action::Reject { step, restart_from }, &reason).await?
        }
        Command::Pause { scope, steer } => steer.act(&operator, SteerAction::Pause { scope: scope.scope() }).await?,
        Command::Drain { scope, steer, wait, timeout } => {
            let scope = scope.scope();
            let format = steer.format;
            let recorded = match steer.act(&operator, SteerAction::Drain { scope: scope.clone() }).await {
                Ok(text) => text,
                // Draining already (or paused): --wait still waits.
                Err(OperatorError::AlreadyInState(message)) if wait => format!("{message}\n"),
                Err(e) => return Err(e),
            };
            if wait && format == Format::Text {
                recorded + &operator.wait_drained(&scope, timeout).await? + "\n"
            } else if wait {
                operator.wait_drained(&scope, timeout).await?;
                recorded
            } else {
                recorded
            }
        }
        Command::Resume { scope, steer, rerun_failed } => {
            steer.act(&operator, SteerAction::Resume { scope: scope.scope(), rerun_failed }).await?
        }
        Command::Pool { action: PoolAction::Set { name, size, steer } } => {
            steer.act(&operator, SteerAction::SetPool { pool: name, size }).await?
        }
        Command::Step { action: StepAction::Add { name, event_type, requires, types, overdue_after, reason } } => {
            let step = HumanStep { name, event_type, requires, types, overdue_after };
            operator.declare_step(&step, &reason).await?
        }
        Command::Explain { id, component, format } => {
            // The component first: a bad name is the error when both are bad, as before.
            let component = ComponentName::new(&component)?;
            operator.explain(&BatchId::new(&id)?, &component).await?.render(format)
        }
        Command::Ready { component, format } => operator.ready(&ComponentName::new(&component)?).await?.render(format),
        Command::Pipeline { action: None, format } => operator.pipeline_view().await?.render(format),
        Command::Pipeline { action: Some(PipelineAction::Forget { component, reason }), .. } => {
            operator.forget(&component, &reason).await?
        }
        Command::Alerts { ready_after, silent_after, silent_periods, index_lag, paused_after, format } => {
            let defaults = AlertDefaults { ready_after, silent_after, silent_periods, index_lag, paused_after };
            operator.alerts(&defaults).await?.render(format)
        }
        Command::Metrics { ready_after } => {
            operator.metrics(&AlertDefaults { ready_after, ..AlertDefaults::default() }).await?
        }
        Command::Notify => {
            let config = autocomp_ops::notify::NotifyConfig::load(operator.config_dir())?;
            let store = operator.store().await?;
            let index = operator.index(&store)?;
            let holder = format!("notify@{}#{}", autocomp_framework::hostname(), std::process::id());
            let report = autocomp_ops::notify::notify_once(store, index, &config, &holder).await?;
            tracing::info!(found = report.found, sent = report.sent, failed = report.failed, "notify pass");
            if report.failed > 0 {
                return Err(OperatorError::Refused(report.render().trim_end().to_owned()));
            }
            report.notes.iter().map(|note| format!("notify: {note}\n")).collect()
        }
        Command::Reindex => operator.reindex().await?,
        Command::Locks { stale, format } => operator.locks_held(stale).await?.render(format),
        Command::Demo { .. } | Command::New(_) | Command::Doctor(_) => String::new(),
    })
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
