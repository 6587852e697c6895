//! Sources: components that create batches instead of working on them (a scanner of an
//! incoming directory, a poller of an upstream system). The framework gives a source what it
//! gives a trigger-driven component: the command line, config, the poll lock, the registry
//! report and the exit codes; the source decides what to register.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use autocomp_model::{
    Agent, Batch, BatchId, ComponentDescriptor, ComponentName, Event, EventType, NewBatch, NewEvent, PassOutcome,
    PassPhase, Seq, Trigger,
};
use autocomp_store::{CreateOutcome, ObjectStore, StoreError, open_store};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tracing::{debug, warn};

use crate::cli::{Binary, RunnerArgs, command_line, run_binary};
use crate::component::SettingError;
use crate::config::{self, Backends, ConfigError, LoadedConfig};
use crate::exit::{self, EXIT_CODES_HELP, RunError};
use crate::locks::{Lock, LockPath, open_locks};
use crate::runner::{Identity, record_pass, registration_hand_ons};

/// A component that registers batches: each pass (under the component's poll lock, so one
/// host at a time) looks at the world outside the pipeline and writes what it finds through
/// its [`SourceContext`]. It has no trigger and takes no `--schedule` or `--watch`: cron
/// starts it. Its `main` is one call: `autocomp_framework::source_main(MySource)`.
#[allow(async_fn_in_trait)] // run on the source's own single-threaded runtime: no Send needed
pub trait Source: Sized + 'static {
    /// The component file's `[settings]` table.
    type Settings: DeserializeOwned;
    /// The settings checked and compiled (patterns parsed, paths made absolute), which every
    /// pass uses.
    type Plan;

    /// The component's name (`[a-z0-9-]`), as in its config file name and the registry.
    fn name(&self) -> &str;
    /// Its version, recorded in every event's agent.
    fn version(&self) -> &str;
    /// The event type it records on the batches it registers (e.g. `Data_Received`).
    fn event_type(&self) -> &str;
    /// One line for `--help`.
    fn about(&self) -> String {
        format!("Source `{}`: registers batches and records `{}` on them.", self.name(), self.event_type())
    }
    /// More of `--help`, printed before the exit codes: what the settings mean.
    fn help(&self) -> &str {
        ""
    }
    /// What the registry records of a pass that ended (`autocomp pipeline`, the monitor):
    /// by default `scanned`, or `N items with problems`.
    fn pass_summary(&self, problems: usize) -> String {
        match problems {
            0 => "scanned".into(),
            n => format!("{n} items with problems"),
        }
    }
    /// Checks the settings before any lock is taken or store opened; a refusal is a
    /// configuration error (exit 2) naming the key.
    fn plan(&self, settings: Self::Settings) -> Result<Self::Plan, SettingError>;
    /// One pass. `RunError`s end it (a store outage, a lost lock); a problem with one item
    /// is [`SourceContext::problem`] and the pass goes on.
    async fn pass(&self, plan: &Self::Plan, context: &mut SourceContext<'_>) -> Result<(), RunError>;
}

/// What a source's pass may do: read batches, register them, record their content changes
/// and events, in its own name. In a dry run ([`SourceContext::dry_run`]) nothing is locked
/// and every write is refused, so a source prints what it would do instead.
pub struct SourceContext<'a> {
    name: &'a str,
    store: &'a dyn ObjectStore,
    identity: &'a Identity,
    lock: Option<&'a dyn Lock>,
    only: Option<BatchId>,
    force: bool,
    failures_cap: usize,
    problems: usize,
    /// The takers' descriptors, read at the pass's first registration: whom its new batches
    /// are handed on to (`HandOnStore::register_handing_on`).
    takers: tokio::sync::OnceCell<Vec<ComponentDescriptor>>,
}

impl SourceContext<'_> {
    /// `--batch ID`: consider only this item, whatever the source's own selection says.
    pub fn only(&self) -> Option<&BatchId> {
        self.only.as_ref()
    }
    /// `--force` (with `--batch`): register it even if it does not look complete.
    pub fn force(&self) -> bool {
        self.force
    }
    /// `--dry-run`: write nothing, print what would be done.
    pub fn dry_run(&self) -> bool {
        self.lock.is_none()
    }
    /// `max_reported_failures` of the component's config, for the reports it records.
    pub fn failures_cap(&self) -> usize {
        self.failures_cap
    }
    /// The agent its events are recorded by (`name/version@host#pid`).
    pub fn agent(&self) -> &Agent {
        &self.identity.agent
    }

    /// The named batches that exist, by id; unknown ids are left out.
    pub async fn known(&self, ids: &[BatchId]) -> Result<HashMap<BatchId, Batch>, StoreError> {
        Ok(self.store.get_batches(ids).await?.into_iter().map(|b| (b.id.clone(), b)).collect())
    }

    /// Registers a batch (idempotent when an identical one exists) and returns it.
    pub async fn create_batch(&self, batch: NewBatch) -> Result<Batch, StoreError> {
        self.writable()?;
        Ok(self.store.create_batch(batch).await?.batch().clone())
    }

    /// Registers a batch with its first event (its delivery) in one commit and returns it
    /// (`ObjectStore::register_batch`). When an identical batch exists nothing is written and
    /// that batch is returned: if it was registered without the event, append it. A new
    /// batch is handed on in the same commit to the watchers that offered to take the steps
    /// it is then ready for (`HandOnStore::register_handing_on`), which work it at once.
    pub async fn register_batch(&self, batch: NewBatch, first: NewEvent) -> Result<CreateOutcome, StoreError> {
        self.writable()?;
        let takers = self
            .takers
            .get_or_init(|| async {
                self.store.takers().await.unwrap_or_else(|e| {
                    debug!("cannot read the takers of hand-ons (registering without): {e}");
                    Vec::new()
                })
            })
            .await;
        let hand_on = registration_hand_ons(takers, &batch, &first);
        let registered = self.store.register_handing_on(batch, first, &hand_on).await?;
        for run in &registered.runs {
            debug!(batch = %run.batch_id, to = %run.component, holder = %run.holder.agent, "handed on");
        }
        Ok(registered.outcome)
    }

    /// Records that a registered batch's content changed (a re-delivery): `patch` is merged
    /// into its metadata. Returns the change's seq.
    /// A batch whose history was pruned is refused (`Conflict`, naming the import that brings
    /// it back): its new content would wait unworked, since a pruned batch is ready for nothing.
    pub async fn record_content_change(&self, id: &BatchId, patch: Map<String, Value>) -> Result<Seq, StoreError> {
        self.writable()?;
        let head = self.store.batch_head(id).await?;
        if let Some(marker) = head.effective_event(&autocomp_model::EventType::history_pruned()) {
            let restore = marker.details.get("restore").and_then(Value::as_str).unwrap_or("autocomp import");
            return Err(StoreError::Conflict(format!(
                "{id} was delivered again, but its history was pruned (seq {}): `{restore}` first; nothing recorded",
                marker.seq
            )));
        }
        self.store.record_content_change(id, patch).await
    }

    /// Appends an event to a batch.
    pub async fn append_event(&self, id: &BatchId, event: NewEvent) -> Result<Event, StoreError> {
        self.writable()?;
        self.store.append_event(id, event).await
    }

    /// Before writes that depend on what the pass saw: whether this host still holds the
    /// source's poll lock (a lock service that lost the session gives it to another host).
    pub async fn ensure_lock_held(&self) -> Result<(), RunError> {
        match self.lock {
            Some(lock) if !lock.still_held().await? => {
                Err(RunError::LocksLost(format!("the poll lock of {} was lost", self.name)))
            }
            _ => Ok(()),
        }
    }

    /// Reports a problem with one item on stderr and goes on; the pass then exits 1.
    pub fn problem(&mut self, message: impl std::fmt::Display) {
        eprintln!("{}: {}", self.name, crate::for_terminal(&message.to_string()));
        self.problems += 1;
    }

    fn writable(&self) -> Result<(), StoreError> {
        match self.lock {
            Some(_) => Ok(()),
            None => Err(StoreError::Conflict("a dry run writes nothing".into())),
        }
    }
}

/// The whole `main` of a source binary.
pub fn source_main<S: Source>(source: S) -> ExitCode {
    let after_help = format!("{}{EXIT_CODES_HELP}", source.help());
    let args = command_line(source.name(), source.version(), source.about(), after_help);
    run_binary(source.name(), args, Binary::Source, |args| run_source(&source, args))
}

/// What a source's run knows before it takes a lock: its names and identity, its config
/// and settings checked, the batch a manual run names, and where the store and locks are.
struct SourceRun<'a, S: Source> {
    source: &'a S,
    args: RunnerArgs,
    component: ComponentName,
    event_type: EventType,
    loaded: LoadedConfig,
    plan: S::Plan,
    only: Option<BatchId>,
    backends: Backends,
    store_url: String,
    identity: Identity,
}

async fn run_source<S: Source>(source: &S, args: RunnerArgs) -> Result<u8, RunError> {
    let run = SourceRun::prepare(source, args)?;
    if run.args.dry_run {
        // Touches nothing: no lock, no write.
        let store = open_store(&run.store_url).await?;
        let mut context = run.context(store.as_ref(), None);
        source.pass(&run.plan, &mut context).await?;
        return Ok(verdict(context.problems));
    }
    let locks = open_locks(&run.backends.require_locks(&run.loaded.shared_file)?).await?;
    let poll_path = LockPath::Poll(run.component.clone());
    let holder = run.identity.lock_holder();
    let lock = match locks.try_lock(&poll_path, &holder, run.loaded.component.poll_lock_timeout).await {
        Ok(Some(lock)) => lock,
        not_taken => {
            locks.close().await;
            not_taken?;
            return Err(RunError::PollLockBusy(source.name().into()));
        }
    };
    let started = Instant::now();
    let outcome = match open_store(&run.store_url).await {
        Ok(store) => run.locked_pass(store.as_ref(), lock.as_ref(), started).await,
        Err(e) => Err(e.into()),
    };
    if let Err(e) = lock.release().await {
        warn!("cannot release the poll lock: {e}");
    }
    locks.close().await;
    Ok(verdict(outcome?))
}

/// A pass's exit code: 1 when an item had a problem.
fn verdict(problems: usize) -> u8 {
    if problems > 0 { exit::FAILED } else { exit::OK }
}

impl<'a, S: Source> SourceRun<'a, S> {
    /// Checks the flags, the config and the settings, before any lock or store is touched.
    fn prepare(source: &'a S, args: RunnerArgs) -> Result<Self, RunError> {
        let name = source.name();
        for (given, flag) in [(args.schedule.is_some(), "--schedule"), (args.watch, "--watch")] {
            if given {
                return Err(RunError::Usage(format!(
                    "{name} does not take {flag}: it is a source, not a trigger-driven component; run it from cron"
                )));
            }
        }
        let component = ComponentName::new(name).map_err(|e| RunError::Usage(e.to_string()))?;
        let event_type = EventType::new(source.event_type()).map_err(|e| RunError::Usage(e.to_string()))?;
        let loaded = config::load(name, args.config.as_deref(), &args.config_dir)?;
        if let Some(configured) = loaded.component.event_type.as_deref().filter(|t| *t != event_type.as_str()) {
            let message = format!("event_type = {configured:?}, but {name} records {event_type}");
            return Err(ConfigError::new(&loaded.file, message).into());
        }
        if !loaded.component.trigger.is_empty() {
            let message = format!("[trigger]: {name} is a source and has no trigger; remove the table");
            return Err(ConfigError::new(&loaded.file, message).into());
        }
        let settings: S::Settings = config::settings(&loaded.component.settings, &loaded.file)?;
        let plan = source.plan(settings).map_err(|refused| {
            ConfigError::new(&loaded.file, format!("[settings] {}: {}", refused.key, refused.message))
        })?;
        let only = match &args.batch {
            Some(id) => Some(BatchId::new(id.as_str()).map_err(|e| RunError::Usage(e.to_string()))?),
            None => None,
        };
        let backends = loaded.backends.clone().overridden_by(args.backends());
        let store_url = backends.require_store(&loaded.shared_file)?;
        let identity = Identity::of(name, source.version())?;
        Ok(Self { source, args, component, event_type, loaded, plan, only, backends, store_url, identity })
    }

    /// What the source's pass is given: the store, and the poll lock (none in a dry run).
    fn context<'c>(&'c self, store: &'c dyn ObjectStore, lock: Option<&'c dyn Lock>) -> SourceContext<'c> {
        SourceContext {
            name: self.source.name(),
            store,
            identity: &self.identity,
            lock,
            only: self.only.clone(),
            force: self.args.force,
            failures_cap: self.loaded.component.max_reported_failures,
            problems: 0,
            takers: tokio::sync::OnceCell::new(),
        }
    }

    /// The pass under the poll lock, reported to the registry; how many items had problems.
    /// A source honours a pause of itself or of the whole pipeline as a component does: no
    /// deliveries registered while held (a manual run says so; --force runs anyway).
    async fn locked_pass(&self, store: &dyn ObjectStore, lock: &dyn Lock, started: Instant) -> Result<usize, RunError> {
        let steering = store.steering().await?;
        let held = crate::runner::held_reason(&self.component, &steering).filter(|_| !self.args.force);
        let passed = match &held {
            Some(why) => {
                debug!("{why}; nothing registered");
                if self.only.is_some() {
                    eprintln!("{}", crate::for_terminal(&format!("{why} (use --force to run it anyway)")));
                }
                Ok(usize::from(self.only.is_some()))
            }
            None => {
                let mut context = self.context(store, Some(lock));
                self.source.pass(&self.plan, &mut context).await.map(|()| context.problems)
            }
        };
        let (outcome, summary) = match (&passed, &held) {
            (Ok(_), Some(why)) => (PassOutcome::Idle, format!("nothing registered: {why}")),
            (Ok(0), None) => (PassOutcome::Ok, self.source.pass_summary(0)),
            (Ok(problems), None) => (PassOutcome::Failed, self.source.pass_summary(*problems)),
            (Err(e), _) => (PassOutcome::Error, e.to_string()),
        };
        let phase =
            PassPhase::Ended { outcome, summary, duration_ms: started.elapsed().as_millis() as u64, work: vec![] };
        let (name, version, event_type) = (self.component.clone(), self.source.version(), self.event_type.clone());
        let descriptor = self.loaded.component.descriptor(name, version, event_type, Trigger::default(), true);
        report(store, &descriptor, &self.identity, phase).await?;
        passed
    }
}

/// Reports the pass to the component registry as the source of its event type, so the
/// pipeline's readers know where that type comes from. Only a registry conflict (another
/// component records the type) fails the pass; an outage here is a warning.
async fn report(
    store: &dyn ObjectStore,
    descriptor: &autocomp_model::ComponentDescriptor,
    identity: &Identity,
    phase: PassPhase,
) -> Result<(), RunError> {
    match record_pass(store, descriptor, identity, phase).await {
        Err(usage @ RunError::Usage(_)) => Err(usage),
        Err(e) => {
            warn!("cannot report the pass to the component registry: {e}");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}
