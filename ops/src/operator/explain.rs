//! `autocomp explain`: why a batch is or is not ready for a component, clause by clause, in
//! the store and in the index; its retry window, result, attempts, open run and locks, and
//! the chain of steps that holds it up. The `Explanation`, its JSON (`ExplanationJson`), its
//! text and the command (and `explain_all`, the monitor's batch page) together.

use std::sync::Arc;
use std::time::Duration;

use autocomp_framework::PoolRoom;
use autocomp_framework::locks::HeldLock;
use autocomp_model::{
    Agent, BatchFacts, BatchId, Clause, ComponentName, ComponentState, Event, EventType, NotReady, Outcome, Run, Seq,
    Steering, Timestamp, Trigger,
};
use autocomp_sboi::IndexedBatch;
use autocomp_store::{BatchHead, ObjectStore};
use serde::Serialize;

use super::locks::LockJson;
use super::show::report_summary;
use super::views::{Format, RunView, render_as};
use super::{Operator, OperatorError, Step};

mod text;
mod whole;

pub use whole::BatchExplanation;

/// What `explain` reads once per batch, whatever the component.
struct Seen {
    index_cursor: Seq,
    indexed: Option<IndexedBatch>,
    store_head: Seq,
    locks: Vec<HeldLock>,
    steering: Steering,
}

/// One trigger clause, evaluated in the store and in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClauseCheck {
    /// As written in a config: `requires Data_Received`.
    pub clause: String,
    pub store: bool,
    /// `None` when the index has no document for the batch.
    pub index: Option<bool>,
}

fn checks(trigger: &Trigger, batch: &impl BatchFacts, indexed: Option<&IndexedBatch>) -> Vec<ClauseCheck> {
    let now = batch.read_at();
    trigger
        .explain(batch, now)
        .into_iter()
        .map(|(clause, store)| ClauseCheck {
            clause: clause.to_string(),
            store,
            index: indexed.map(|doc| holds_in_index(&clause, doc, now)),
        })
        .collect()
}

fn all_hold(checks: &[ClauseCheck]) -> (bool, Option<bool>) {
    let index = checks.iter().map(|c| c.index).collect::<Option<Vec<bool>>>();
    (checks.iter().all(|c| c.store), index.map(|all| all.iter().all(|holds| *holds)))
}

/// A clause as the index answers it: over the terms `sboi`'s document precomputes from the
/// effective view (`present`, `succeeded`, `old`, `transient`, `last_activity`), the way
/// `sboi`'s query translates it. For diagnosis only: readiness is decided by the query.
fn holds_in_index(clause: &Clause<'_>, doc: &IndexedBatch, now: Timestamp) -> bool {
    let has = |terms: &[String], t: &EventType| terms.iter().any(|term| term == t.as_str());
    match clause {
        Clause::Types(types) => types.iter().any(|t| t.as_str() == doc.batch_type),
        Clause::Batches(ids) => ids.iter().any(|id| id.as_str() == doc.id),
        Clause::Requires(t) => has(&doc.succeeded, t),
        Clause::BlockedBy(t) => !has(&doc.present, t),
        // Not "current": absent, or older than the last content change.
        Clause::RepeatOnChange(t) => !has(&doc.present, t) || has(&doc.old, t),
        Clause::TransientlyFailed(t) => has(&doc.transient, t),
        Clause::SettledFor(quiet) => {
            let quiet_ms = i64::try_from(quiet.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
            quiet.is_zero() || doc.last_activity.millis() <= now.millis().saturating_sub(quiet_ms)
        }
    }
}

/// The retry path of a transient failure: the runner's retry trigger and its window.
#[derive(Debug, Clone)]
pub struct RetryWindow {
    pub failure: Event,
    pub backoff: Duration,
    /// When `settled_for` of the retry trigger is over (last activity + the backoff).
    pub opens_at: Timestamp,
    pub clauses: Vec<ClauseCheck>,
    pub ready_in_store: bool,
    pub ready_in_index: Option<bool>,
}

/// `autocomp explain`: why a batch is or is not ready for a component, clause by clause.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub batch: BatchId,
    pub component: ComponentName,
    pub event_type: EventType,
    pub state: ComponentState,
    /// The store's clock when the batch was read; every clause is evaluated at it.
    pub as_of: Timestamp,
    pub clauses: Vec<ClauseCheck>,
    pub ready_in_store: bool,
    /// `None` when the index holds no document for the batch.
    pub ready_in_index: Option<bool>,
    pub retry: Option<RetryWindow>,
    /// Why a pass would not work on it (`None` when it would): the clause, its type and
    /// what the batch holds, or the retry backoff still running.
    pub refusal: Option<NotReady>,
    /// The component's own effective event, if any.
    pub result: Option<Event>,
    pub open_run: Option<Run>,
    pub batch_lock: Option<HeldLock>,
    pub poll_lock: Option<HeldLock>,
    /// Abandoned or transient runs since the last Reset of the component's type.
    pub failed_attempts: u32,
    pub max_attempts: u32,
    pub index_cursor: Seq,
    pub store_head: Seq,
    /// When a required step has not succeeded: the chain of steps back to what holds the
    /// batch up ("checksum-verifier failed at seq 54: ..."), nearest first.
    pub held_up_by: Vec<String>,
    /// A human step: a person decides it (`approve` / `reject`), no pass works on it.
    pub manual: bool,
    /// Why no pass claims anything of the component now, when it is held: "paused by
    /// operator:ann since ...: reason" (its own hold, else the whole pipeline's).
    pub held: Option<String>,
    /// The hold is the whole pipeline's, not the component's own.
    pub held_pipeline_wide: bool,
    /// A pool the component's work needs a slot of, with every slot in use now: "waits for
    /// pool tape: 1 of its 1 slot(s) in use" (a ready batch is claimed once one frees).
    pub pool_wait: Option<String>,
    /// Why the component's passes refuse to start, whatever the batch: a result it reads
    /// is no longer published as it expects ("contract broken: ...").
    pub contract_broken: Option<String>,
}

/// `explain --format json`.
#[derive(Serialize)]
pub struct ExplanationJson<'a> {
    pub id: &'a BatchId,
    pub component: &'a ComponentName,
    pub event_type: &'a EventType,
    pub state: ComponentState,
    pub verdict: String,
    pub as_of: Timestamp,
    pub clauses: &'a [ClauseCheck],
    pub ready_in_store: bool,
    pub ready_in_index: Option<bool>,
    pub refusal: Option<RefusalJson<'a>>,
    pub retry: Option<RetryJson<'a>>,
    pub result: Option<ResultJson<'a>>,
    pub open_run: Option<RunView>,
    pub batch_lock: Option<LockJson<'a>>,
    pub poll_lock: Option<LockJson<'a>>,
    pub failed_attempts: u32,
    pub max_attempts: u32,
    pub index_cursor: Seq,
    pub store_head: Seq,
    pub held_up_by: &'a [String],
    pub manual: bool,
    pub held: Option<&'a str>,
    pub pool_wait: Option<&'a str>,
    pub contract_broken: Option<&'a str>,
    /// What a person runs next (`Explanation::next_command`), null when nothing.
    pub next: Option<String>,
}

/// Why a pass would not work on the batch.
#[derive(Serialize)]
pub struct RefusalJson<'a> {
    pub clause: &'a str,
    pub reason: &'a str,
    pub retrying: bool,
}

/// The retry window of a transient failure.
#[derive(Serialize)]
pub struct RetryJson<'a> {
    pub failure_seq: Seq,
    pub backoff_seconds: u64,
    pub opens_at: Timestamp,
    pub clauses: &'a [ClauseCheck],
    pub ready_in_store: bool,
    pub ready_in_index: Option<bool>,
}

/// The component's own effective event, in short.
#[derive(Serialize)]
pub struct ResultJson<'a> {
    pub seq: Seq,
    pub outcome: Outcome,
    pub agent: &'a Agent,
    pub at: Timestamp,
}

impl Explanation {
    /// Whether the component's own effective result is what blocks it (its event type is in
    /// its `blocked_by`, as every component's is by default).
    fn own_result_blocks(&self) -> bool {
        let own = format!("blocked_by {}", self.event_type);
        self.result.is_some() && self.clauses.iter().any(|c| c.clause == own && !c.store)
    }

    /// One line: the verdict.
    pub fn verdict(&self) -> String {
        if let Some(run) = &self.open_run {
            return format!("working: run {} held by {}", run.generation, run.holder.agent);
        }
        if let Some(held) = &self.held {
            let otherwise = if self.refusal.is_none() { " (ready otherwise)" } else { "" };
            return format!("held: {held}{otherwise}");
        }
        // Whatever the batch's readiness, no pass of the component starts: said first when
        // the batch would otherwise be worked on.
        if let Some(broken) = self.contract_broken.as_ref().filter(|_| self.refusal.is_none() && !self.manual) {
            return format!("refused: every pass of {} stops before any work, {broken}", self.component);
        }
        // The refusal is the readiness rule's own answer; the clauses only say why.
        match &self.refusal {
            None if self.manual => {
                "waiting for a person: every clause holds in the store (`autocomp approve` or `reject` decides it)"
                    .into()
            }
            None if self.ready_in_store => match &self.pool_wait {
                Some(wait) => format!("ready, and {wait}"),
                None => "ready: every clause holds in the store".into(),
            },
            None => match self.retry.as_ref().filter(|r| r.ready_in_store) {
                Some(retry) => format!("ready to retry its transient failure (seq {})", retry.failure.seq),
                None => "ready".into(),
            },
            Some(refusal) if refusal.clause == "source" => format!("source: {refusal}"),
            Some(refusal) if refusal.retrying => format!("retrying: {refusal}"),
            // Blocked by its own result: the step is done (or failed), not waiting for anything.
            Some(refusal) if refusal.clause == "blocked_by" && self.own_result_blocks() => {
                let result = self.result.as_ref().expect("own_result_blocks checked it");
                result_verdict(result)
            }
            Some(refusal) => format!("not ready: {refusal}"),
        }
    }

    /// What a person runs next, when it is theirs to act: resume a held step, decide a
    /// human step, rerun a failed one. `None` when the step goes on by itself (working,
    /// ready, retrying, waiting for another step, done).
    pub fn next_command(&self) -> Option<String> {
        let (id, name) = (&self.batch, &self.component);
        if self.open_run.is_some() {
            return None;
        }
        if self.held.is_some() {
            let scope = if self.held_pipeline_wide { "--all".to_owned() } else { name.to_string() };
            return Some(format!("autocomp resume {scope} --reason ..."));
        }
        if self.contract_broken.is_some() {
            return Some("autocomp pipeline   (shows what the reader expects and what the producer records)".into());
        }
        match &self.refusal {
            None if self.manual => Some(format!(
                "autocomp approve {id} --step {name} --reason ...   (or `autocomp reject {id} --step {name} --reason ...`)"
            )),
            Some(refusal) if refusal.clause == "blocked_by" && self.own_result_blocks() => {
                let result = self.result.as_ref()?;
                (result.outcome == Outcome::Failure && !result.is_transient_failure() && !result.is_acknowledged())
                    .then(|| match result.failure_next() {
                        Some(next) => autocomp_toolkit::terminal::one_line(next).into_owned(),
                        None => format!("autocomp rerun {id} --component {name} --reason ..."),
                    })
            }
            _ => None,
        }
    }

    pub fn render(&self, format: Format) -> String {
        render_as(format, || self.json(), || self.to_text())
    }

    /// The JSON document, as a type.
    pub fn json(&self) -> ExplanationJson<'_> {
        let now = Timestamp::now();
        ExplanationJson {
            id: &self.batch,
            component: &self.component,
            event_type: &self.event_type,
            state: self.state,
            verdict: self.verdict(),
            as_of: self.as_of,
            clauses: &self.clauses,
            ready_in_store: self.ready_in_store,
            ready_in_index: self.ready_in_index,
            refusal: self.refusal.as_ref().map(|r| RefusalJson {
                clause: r.clause,
                reason: &r.reason,
                retrying: r.retrying,
            }),
            retry: self.retry.as_ref().map(|r| RetryJson {
                failure_seq: r.failure.seq,
                backoff_seconds: r.backoff.as_secs(),
                opens_at: r.opens_at,
                clauses: &r.clauses,
                ready_in_store: r.ready_in_store,
                ready_in_index: r.ready_in_index,
            }),
            result: self.result.as_ref().map(|e| ResultJson {
                seq: e.seq,
                outcome: e.outcome,
                agent: &e.agent,
                at: e.at,
            }),
            open_run: self.open_run.as_ref().map(RunView::from),
            batch_lock: self.batch_lock.as_ref().map(|l| LockJson::of(l, now)),
            poll_lock: self.poll_lock.as_ref().map(|l| LockJson::of(l, now)),
            failed_attempts: self.failed_attempts,
            max_attempts: self.max_attempts,
            index_cursor: self.index_cursor,
            store_head: self.store_head,
            held_up_by: &self.held_up_by,
            manual: self.manual,
            held: self.held.as_deref(),
            pool_wait: self.pool_wait.as_deref(),
            contract_broken: self.contract_broken.as_deref(),
            next: self.next_command(),
        }
    }

    /// The JSON document as a value (tests index into it).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.json()).unwrap_or_default()
    }
}

/// A step done or failed by its own result: what it came to.
fn result_verdict(result: &Event) -> String {
    if result.is_acknowledged() {
        let said = result.failure_text().map(|text| autocomp_toolkit::terminal::one_line(&text).into_owned());
        return format!("closed out at seq {}: {}", result.seq, said.unwrap_or_else(|| "acknowledged".into()));
    }
    match result.failure_text().filter(|_| result.outcome == Outcome::Failure) {
        Some(reason) => {
            let reason = autocomp_toolkit::terminal::one_line(&reason);
            let again =
                if result.failure_next().is_some() { "its next says what fixes it" } else { "a rerun tries again" };
            format!("failed at seq {}: {reason} ({again})", result.seq)
        }
        None if result.outcome == Outcome::Failure => format!("failed at seq {} (a rerun tries again)", result.seq),
        None if result.is_skipped() => format!("done: skipped at seq {} by {}", result.seq, result.agent),
        None => format!("done: its result is a success, seq {}", result.seq),
    }
}

/// Why `step` waits on `batch`, followed back along the `requires` chain to its root: for
/// the first required type without an effective success, the step that records it and what
/// that step's state is; a step that is itself waiting is followed further. Bounded by the
/// pipeline's length, so a cycle in the configuration cannot loop.
fn held_up_by(pipeline: &[Step], step: &Step, batch: &BatchHead) -> Vec<String> {
    let mut causes = Vec::new();
    let mut current = step;
    for _ in 0..pipeline.len() {
        // A stale success counts as none: the requirement does not hold.
        let missing = current.trigger().requires.iter().find(|required| {
            !batch.summary.current_of(required).is_some_and(|event| event.outcome == Outcome::Success)
        });
        let Some(missing) = missing else { break };
        let Some(producer) = pipeline.iter().find(|other| other.event_type() == missing) else {
            causes.push(format!("{} waits for {missing}, which no component of the pipeline records", current.name()));
            break;
        };
        let state = producer.state_of(batch);
        causes.push(format!(
            "{} waits for {missing}: {}",
            current.name(),
            producer_state(producer, state, batch, missing)
        ));
        if state != ComponentState::Waiting || std::ptr::eq(producer, current) {
            break;
        }
        current = producer;
    }
    causes
}

/// What the step that records `missing` is doing about it.
fn producer_state(producer: &Step, state: ComponentState, batch: &BatchHead, missing: &EventType) -> String {
    match (state, batch.effective_event(missing)) {
        (ComponentState::Failed | ComponentState::Retrying, Some(event)) => {
            let said = event.failure_text().or_else(|| report_summary(event).into_iter().next());
            let said =
                said.map(|line| format!(": {}", autocomp_toolkit::terminal::one_line(&line))).unwrap_or_default();
            let kind = if state == ComponentState::Retrying { "failed transiently (retrying)" } else { "failed" };
            format!("{} {kind} at seq {}{said}", producer.name(), event.seq)
        }
        (ComponentState::Working, _) => format!("{} is working on it", producer.name()),
        (ComponentState::Ready, _) => format!("{} is ready and waits for its next pass", producer.name()),
        (state, _) => format!("{} is {}", producer.name(), state.as_str()),
    }
}

/// What every component's explanation of one batch shares: the index's side, the heads and
/// the locks held. Catches the index up first, as a component's pass would.
async fn seen(operator: &Operator, store: &Arc<dyn ObjectStore>, batch: &BatchId) -> Result<Seen, OperatorError> {
    let index = operator.index(store)?;
    let index_cursor = index.catch_up().await?.cursor();
    let indexed = index.document(batch).await?;
    let store_head = store.head().await?;
    let locks = operator.held_locks().await?;
    let steering = store.steering().await?;
    Ok(Seen { index_cursor, indexed, store_head, locks, steering })
}

/// The retry window of `step` when its effective result is a transient failure.
fn retry_window(step: &Step, head: &BatchHead, seen: &Seen, result: Option<&Event>) -> Option<RetryWindow> {
    let (retry, failure) = match (step.retry_trigger(), result) {
        (Some(retry), Some(failure)) if failure.is_transient_failure() => (retry, failure),
        _ => return None,
    };
    let clauses = checks(&retry, head, seen.indexed.as_ref());
    let (ready_in_store, ready_in_index) = all_hold(&clauses);
    let backoff = retry.settled_for.unwrap_or_default();
    let opens_at = Timestamp(head.last_activity_at().millis().saturating_add(backoff.as_millis() as i64));
    Some(RetryWindow { failure: failure.clone(), backoff, opens_at, clauses, ready_in_store, ready_in_index })
}

/// "paused by operator:ann since ...: reason", when the step (or the whole pipeline) is held.
fn held_text(step: &Step, steering: &Steering) -> Option<String> {
    steering.hold_of(step.name()).map(|hold| {
        let whose = if steering.components.contains_key(step.name()) { "" } else { "the whole pipeline is " };
        let reason = autocomp_toolkit::terminal::one_line(&hold.reason);
        format!("{whose}{} by {} since {}: {reason}", hold.kind.as_str(), hold.by, hold.since)
    })
}

/// One component's explanation of the batch `head` heads.
async fn explain_step(
    store: &dyn ObjectStore,
    pipeline: &[Step],
    step: &Step,
    (head, seen): (&BatchHead, &Seen),
) -> Result<Explanation, OperatorError> {
    let find_lock = |path: String| seen.locks.iter().find(|l| l.path == path).cloned();
    let id = head.id();
    let clauses = checks(step.trigger(), head, seen.indexed.as_ref());
    let (mut ready_in_store, mut ready_in_index) = all_hold(&clauses);
    if head.summary.pruned().is_some() {
        // Whatever its clauses say: a pruned batch is ready for nothing, here and in the index.
        (ready_in_store, ready_in_index) = (false, ready_in_index.map(|_| false));
    }
    let result = head.effective_event(step.event_type()).cloned();
    let failed_attempts = store.failed_attempts(id, step.name(), head.last_reset_of(step.event_type())).await?;
    Ok(Explanation {
        component: step.name().clone(),
        event_type: step.event_type().clone(),
        state: step.state_of(head),
        as_of: head.as_of,
        clauses,
        ready_in_store,
        ready_in_index,
        retry: retry_window(step, head, seen, result.as_ref()),
        refusal: step.ready_in_store(head).err(),
        result,
        open_run: head.open_run(step.name()).cloned(),
        batch_lock: find_lock(format!("batch/{}/{}", step.name(), id)),
        poll_lock: find_lock(format!("poll/{}", step.name())),
        failed_attempts,
        max_attempts: step.descriptor().max_attempts,
        index_cursor: seen.index_cursor,
        store_head: seen.store_head,
        held_up_by: held_up_by(pipeline, step, head),
        batch: id.clone(),
        manual: step.descriptor().manual,
        held: held_text(step, &seen.steering),
        held_pipeline_wide: seen.steering.hold_of(step.name()).is_some()
            && !seen.steering.components.contains_key(step.name()),
        pool_wait: pool_wait(step, seen),
        contract_broken: step.broken_contract(pipeline),
    })
}

/// The first pool (in the component's order) of those its work needs a slot of whose every
/// slot is in use now, as the lock service lists them (a pool with no size has none free).
fn pool_wait(step: &Step, seen: &Seen) -> Option<String> {
    let room = PoolRoom::of(&step.descriptor().pools, &seen.steering, &seen.locks)?;
    (room.free() == 0).then(|| room.wait())
}

impl Explanation {
    /// `autocomp explain`. Reads the batch's head, never its log.
    pub async fn read(
        operator: &Operator,
        id: &BatchId,
        component: &ComponentName,
    ) -> Result<Explanation, OperatorError> {
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let step = operator.step_named(&pipeline, component)?;
        let head = store.batch_head(id).await?;
        let seen = seen(operator, &store, head.id()).await?;
        explain_step(store.as_ref(), &pipeline, step, (&head, &seen)).await
    }

    /// `explain` for every component of the pipeline at once (the monitor's batch page): one
    /// index catch-up and one read of the lock service for all of them, and the batch's head
    /// (never its log) they are all explained from.
    pub async fn read_all(operator: &Operator, id: &BatchId) -> Result<(BatchHead, Vec<Explanation>), OperatorError> {
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let head = store.batch_head(id).await?;
        let seen = seen(operator, &store, head.id()).await?;
        let mut explanations = Vec::with_capacity(pipeline.len());
        for step in &pipeline {
            explanations.push(explain_step(store.as_ref(), &pipeline, step, (&head, &seen)).await?);
        }
        Ok((head, explanations))
    }
}

impl Operator {
    /// `autocomp explain`: see `Explanation::read`.
    pub async fn explain(&self, id: &BatchId, component: &ComponentName) -> Result<Explanation, OperatorError> {
        Explanation::read(self, id, component).await
    }

    /// `explain` for every component at once: see `Explanation::read_all`.
    pub async fn explain_all(&self, id: &BatchId) -> Result<(BatchHead, Vec<Explanation>), OperatorError> {
        Explanation::read_all(self, id).await
    }
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
