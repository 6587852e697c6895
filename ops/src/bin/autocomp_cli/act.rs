//! The `autocomp` subcommands that write: the actions on one batch (`rerun` ... `reject`,
//! with their `--dry-run`, `--expect-version` and `--key`) and the steering of the whole
//! pipeline (`pause`, `drain`, `resume`, `pool set`, `step add`), each with the arguments it
//! takes and the one call it makes. Apart from `autocomp.rs` so the binary's root holds the
//! command list, the setup and the reads; batch ids and component names are parsed here by
//! clap (`BatchId`, `ComponentName`), and refused in the operator module's words.

use std::time::Duration;

use autocomp_model::{BatchId, ComponentName, IdempotencyKey, InvalidInput, Seq};
use autocomp_ops::operator::{Action, Format, HumanStep, Operator, OperatorError, RestartFrom, Scope, SteerAction};
use clap::{ArgGroup, Subcommand};

// The actions on one batch. (A plain comment: a doc comment here would become the
// `autocomp --help` about text, through `#[command(flatten)]`.)
#[derive(Subcommand)]
pub(super) enum ActCommand {
    /// Append a Reset marker for the component's event type: it triggers again (if its
    /// requirements hold). Nothing else changes.
    Rerun {
        /// The batch id.
        id: BatchId,
        #[arg(long)]
        component: ComponentName,
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
        id: BatchId,
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
        id: BatchId,
        #[arg(long)]
        component: ComponentName,
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
        id: BatchId,
        #[arg(long)]
        component: ComponentName,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        /// Skip even when the component's effective event is already a success.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        guard: Guard,
    },
    /// Close out the component's failure on the batch (a failed run, a cancel, a give-up, a
    /// person's rejection): it is recorded again flagged `acknowledged`, with who and why. It
    /// stays a failure (what requires it still waits) but leaves the failed counts, `alerts`
    /// and the monitor's "Needs a person" for the state `acknowledged`; `rerun` opens it
    /// again. Several ids close out each (refusals listed, exit 1 if any).
    Acknowledge {
        /// The batch ids (one or more).
        #[arg(required = true, num_args = 1..)]
        ids: Vec<BatchId>,
        /// The component whose failure it closes out (a human step's name for a rejection).
        #[arg(long)]
        component: ComponentName,
        /// Why: recorded with the event for whoever reads the log later (required).
        #[arg(long, required = true)]
        reason: String,
        #[command(flatten)]
        guard: Guard,
    },
    /// Set a batch's priority (higher runs first); recorded as a `Prioritized` event.
    Prioritize {
        /// The batch id.
        id: BatchId,
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
    /// Several batch ids decide each of them (a batch it is refused on is listed and the
    /// others go on; exit 1 if any was refused).
    Approve {
        /// The batch ids (one or more).
        #[arg(required = true, num_args = 1..)]
        ids: Vec<BatchId>,
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
    /// so the batch is redone from there and comes to the step again. Several batch ids
    /// decide each of them, as `approve` does.
    Reject {
        /// The batch ids (one or more).
        #[arg(required = true, num_args = 1..)]
        ids: Vec<BatchId>,
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
}

// The steering of the whole pipeline (a plain comment, as above).
#[derive(Subcommand)]
pub(super) enum SteerCommand {
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
        /// After a component's open circuit: also rerun the batches that failed while it was
        /// breaking (a component only, not --all).
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
}

impl ActCommand {
    /// Performs the action (or, with `--dry-run`, previews it) and answers as `--format` asks.
    pub(super) async fn run(self, operator: &Operator) -> Result<String, OperatorError> {
        let named = |component: ComponentName| String::from(component);
        match self {
            ActCommand::Rerun { id, component, reason, guard } => {
                guard.act(operator, &id, Action::Rerun { component: named(component) }, &reason).await
            }
            ActCommand::Restart { id, from_first_failure: _, from, reason, guard } => {
                let from = from.map_or(RestartFrom::FirstFailure, RestartFrom::Type);
                guard.act(operator, &id, Action::Restart { from }, &reason).await
            }
            ActCommand::Cancel { id, component, reason, record_anyway, guard } => {
                let action = Action::Cancel { component: named(component), record_anyway };
                guard.act(operator, &id, action, &reason).await
            }
            ActCommand::Skip { id, component, reason, force, guard } => {
                guard.act(operator, &id, Action::Skip { component: named(component), force }, &reason).await
            }
            ActCommand::Acknowledge { ids, component, reason, guard } => {
                guard.act_on_each(operator, &ids, Action::Acknowledge { component: named(component) }, &reason).await
            }
            ActCommand::Prioritize { id, priority, reason, guard } => {
                guard.act(operator, &id, Action::Prioritize { priority }, &reason).await
            }
            ActCommand::Approve { ids, step, reason, guard } => {
                guard.act_on_each(operator, &ids, Action::Approve { step }, &reason).await
            }
            ActCommand::Reject { ids, step, reason, restart_from, guard } => {
                guard.act_on_each(operator, &ids, Action::Reject { step, restart_from }, &reason).await
            }
        }
    }
}

impl SteerCommand {
    /// Makes the steering change (or, with `--dry-run`, previews it) and answers as
    /// `--format` asks.
    pub(super) async fn run(self, operator: &Operator) -> Result<String, OperatorError> {
        match self {
            SteerCommand::Pause { scope, steer } => {
                steer.act(operator, SteerAction::Pause { scope: scope.scope() }).await
            }
            SteerCommand::Drain { scope, steer, wait, timeout } => {
                drain(operator, scope.scope(), steer, wait.then_some(timeout)).await
            }
            SteerCommand::Resume { scope, steer, rerun_failed } => {
                steer.act(operator, SteerAction::Resume { scope: scope.scope(), rerun_failed }).await
            }
            SteerCommand::Pool { action: PoolAction::Set { name, size, steer } } => {
                steer.act(operator, SteerAction::SetPool { pool: name, size }).await
            }
            SteerCommand::Step {
                action: StepAction::Add { name, event_type, requires, types, overdue_after, reason },
            } => {
                let step = HumanStep { name, event_type, requires, types, overdue_after };
                operator.declare_step(&step, &reason).await
            }
        }
    }
}

/// `drain`, and with `--wait` (its timeout) the wait until nothing in the scope runs.
async fn drain(
    operator: &Operator,
    scope: Scope,
    steer: SteerArgs,
    wait: Option<Duration>,
) -> Result<String, OperatorError> {
    let format = steer.format;
    let recorded = match steer.act(operator, SteerAction::Drain { scope: scope.clone() }).await {
        Ok(text) => text,
        // Draining already (or paused): --wait still waits.
        Err(OperatorError::AlreadyInState(message)) if wait.is_some() => format!("{message}\n"),
        Err(e) => return Err(e),
    };
    let Some(timeout) = wait else { return Ok(recorded) };
    let waited = operator.wait_drained(&scope, timeout).await?;
    Ok(if format == Format::Text { recorded + &waited + "\n" } else { recorded })
}

/// What every action (rerun, restart, cancel, skip, prioritize) takes besides its own input.
#[derive(clap::Args)]
pub(super) struct Guard {
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
    /// `act` on one batch; on several, each of them (`perform_many`): `--expect-version`
    /// and `--key` name one batch's and are refused. What was done is printed whatever
    /// happened; a refusal on any batch is exit 1, a store error the error's code.
    async fn act_on_each(
        self,
        operator: &Operator,
        ids: &[BatchId],
        action: Action,
        reason: &str,
    ) -> Result<String, OperatorError> {
        if let [id] = ids {
            return self.act(operator, id, action, reason).await;
        }
        let one_batch_only = |field: &str, value: String| -> OperatorError {
            InvalidInput::new(field, value, format!("names one batch's; {} batch ids were given", ids.len())).into()
        };
        if let Some(version) = self.expect_version {
            return Err(one_batch_only("--expect-version", version.to_string()));
        }
        if let Some(key) = self.key {
            return Err(one_batch_only("--key", key));
        }
        let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len();
        // As for one id: an unknown batch is bad input (exit 2), nothing written.
        operator.require_batches(ids).await?;
        if self.dry_run {
            let preview = operator.preview_many(ids, &action, reason).await?;
            let text = preview.render_as(self.format);
            if preview.applicable == preview.total {
                return Ok(text);
            }
            // As a dry run of one id that would be refused: exit 1, what it would do printed.
            print_now(&text);
            let refused = preview.total - preview.applicable;
            return Err(OperatorError::Refused(format!(
                "{} would be refused on {refused} of {distinct} batch(es) (listed above)",
                action.name()
            )));
        }
        let mut outcome = operator.perform_many(ids, &action, reason).await?;
        let text = outcome.render_as(action.name(), self.format);
        let failed = match outcome.stopped.take() {
            Some((_, error)) => error,
            None if outcome.refused.is_empty() => return Ok(text),
            None => OperatorError::Refused(format!(
                "{} refused on {} of {distinct} batch(es) (listed above); nothing written on those",
                action.name(),
                outcome.refused.len()
            )),
        };
        print_now(&text);
        Err(failed)
    }

    async fn act(
        self,
        operator: &Operator,
        id: &BatchId,
        action: Action,
        reason: &str,
    ) -> Result<String, OperatorError> {
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

/// Prints what was done before the error that follows it, as `main` prints a command's
/// output: neutralized for the terminal, best effort (a closed stdout just ends it).
fn print_now(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = write!(stdout, "{}", autocomp_toolkit::for_terminal(text)).and_then(|()| stdout.flush());
}

/// Which part of the pipeline a pause, drain or resume is about.
#[derive(clap::Args)]
#[command(group(ArgGroup::new("scope").required(true).args(["component", "all"])))]
pub(super) struct ScopeArgs {
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
pub(super) struct SteerArgs {
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
pub(super) enum PoolAction {
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
pub(super) enum StepAction {
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
