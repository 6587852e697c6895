//! `BatchStore::claim_ready`: a pass's claim round as one store transaction. What it takes
//! (the batches, the component's descriptor whose `readiness` re-checks each of them, the
//! holder, the steering version the caller knows), what it answers (each batch as the claim's
//! transaction read it, with its claim, its failed attempts and its checkpoint; the steering
//! when it moved) and the decisions every backend shares, so none decides them its own way,
//! among them the rule every claim keeps (`may_abandon`): an open run whose holder names a
//! liveness is its batch's lock, abandoned only by an exclusive round's takeover naming it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use autocomp_model::{Batch, BatchId, ComponentDescriptor, ComponentName, InvalidInput, Run, RunHolder, Seq, Steering};

use crate::port::{Claim, StoreError, StoreResult};
use crate::write_rules::{self, MAX_BATCH_PAGE};

/// A claim round as the runner asks it (`claim_ready`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadyClaimRequest {
    /// The batches to claim if they are ready, in the order the answers come (at most
    /// `MAX_BATCH_PAGE`, each once).
    pub batches: Vec<BatchId>,
    /// The component claiming: its name is the runs', its `readiness` the re-check, its event
    /// type's newest `Reset` where its failed attempts count from.
    pub descriptor: ComponentDescriptor,
    pub holder: RunHolder,
    /// Claim every batch the store has, ready or not, even while the component or the
    /// pipeline is held: an operator's forced run.
    #[serde(default)]
    pub force: bool,
    /// The steering version the caller holds: the answer carries the steering only when the
    /// store's is another.
    #[serde(default)]
    pub known_steering: Option<u64>,
    /// The claim is the lock (the holder names its `liveness`): a batch whose open run of
    /// the component is another claim's is not claimed but answered with that run (`held`),
    /// and nothing is written for it, unless `takeovers` names it. Such a claim commits
    /// durably: nothing else keeps a second claimer off the batch. Sent only when set, so a
    /// service of the release before still takes a request that is not exclusive.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// Open runs the caller proved dead (their holder's liveness record gone): each is taken
    /// over (abandoned, as `claim` does) only while it is still the batch's open run of the
    /// component with that generation and liveness; otherwise the batch is answered `held`.
    /// Only an exclusive request takes runs over: another's are not looked at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub takeovers: Vec<Takeover>,
}

/// An open run a claimer proved dead, named so the claim takes over that run and no other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Takeover {
    pub batch: BatchId,
    /// The open run's generation, as the claimer found it.
    pub generation: i64,
    /// The open run's holder's liveness record, as the claimer judged it.
    pub liveness: Option<String>,
}

impl ReadyClaimRequest {
    pub fn component(&self) -> &ComponentName {
        &self.descriptor.name
    }
}

/// What `claim_ready` did, decided in one transaction.
#[derive(Debug)]
pub struct ReadyClaims {
    /// The steering as the claim's transaction read it, when its version is not the
    /// `known_steering` asked with (`None`: the caller's is current).
    pub steering: Option<Steering>,
    /// The component or the whole pipeline is held (and the request not forced): nothing was
    /// read or claimed, `answers` is empty.
    pub held: bool,
    /// One per batch asked, in the order asked: `NotFound` for a batch the store does not
    /// have, else what the transaction read and did.
    pub answers: Vec<StoreResult<ReadyAnswer>>,
}

/// One batch's answer to `claim_ready`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadyAnswer {
    /// The batch as the claim's transaction read it, before its claim: what its readiness was
    /// judged on (`as_of` is that read's clock).
    pub batch: Batch,
    /// Its claim; `None` when it was not ready, and then nothing was written for it.
    pub claim: Option<Claim>,
    /// For a claimed batch, what `failed_attempts` answers from its event type's newest
    /// `Reset` on, counted before the claim.
    pub failed_attempts: u32,
    /// For a claimed batch, what `load_checkpoint` answers.
    pub checkpoint: Option<Value>,
    /// A refusal: the open run that keeps the batch (exclusive: another claim's, not named in
    /// `takeovers`, or named with another generation or liveness; not exclusive: one that is
    /// the batch's lock, its holder naming a liveness). `claim` is `None` and nothing was
    /// written for the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Run>,
}

/// Refuses a request naming a batch twice: its second claim would abandon its first.
pub(crate) fn check_distinct(batches: &[BatchId]) -> Result<(), InvalidInput> {
    let mut seen = std::collections::HashSet::with_capacity(batches.len());
    match batches.iter().find(|id| !seen.insert(*id)) {
        Some(twice) => Err(InvalidInput::new("batches", twice.as_str(), "names a batch more than once")),
        None => Ok(()),
    }
}

/// What every claim round is refused before anything is read (`claim_ready`,
/// `claim_ready_judged`): a holder, a page of batches or takeovers, or a descriptor that
/// is not valid, a batch named twice, a takeover no holder may name.
pub(crate) fn check_request(request: &ReadyClaimRequest) -> StoreResult<()> {
    request.holder.validate()?;
    write_rules::check_page("batches", request.batches.len(), MAX_BATCH_PAGE)?;
    check_distinct(&request.batches)?;
    write_rules::check_page("takeovers", request.takeovers.len(), MAX_BATCH_PAGE)?;
    check_takeovers(&request.takeovers)?;
    request.descriptor.validate()?;
    Ok(())
}

/// Refuses stamps that are not one per batch asked (`claim_ready_judged`).
pub(crate) fn check_judged(batches: &[BatchId], judged: &[Seq]) -> Result<(), InvalidInput> {
    match judged.len() == batches.len() {
        true => Ok(()),
        false => Err(InvalidInput::new("judged", judged.len().to_string(), "must hold one stamp per batch asked")),
    }
}

/// Whether `component` claims nothing now: its own hold or the whole pipeline's.
pub(crate) fn holds(steering: &Steering, component: &ComponentName) -> bool {
    steering.components.contains_key(component) || steering.pipeline.is_some()
}

/// The steering to answer: `None` when the caller already holds this version.
pub(crate) fn moved(steering: Steering, known: Option<u64>) -> Option<Steering> {
    (known != Some(steering.version)).then_some(steering)
}

/// How a round goes under the steering it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Steered {
    /// Not held (or forced): each batch is claimed if `wanted`.
    Claims,
    /// Held, but a first attempt of this very request (its claim key) claimed before the hold
    /// landed and its answer was lost: the runs it opened are answered again (work already
    /// claimed goes on to its result, as under any hold), nothing else is claimed.
    RetryOnly,
    /// Held: nothing claimed (`refused`).
    Refused,
}

/// How `request` goes under `steering`, given the batches it read.
pub(crate) fn steered<'a>(
    request: &ReadyClaimRequest,
    steering: &Steering,
    batches: impl IntoIterator<Item = &'a Batch>,
) -> Steered {
    if request.force || !holds(steering, request.component()) {
        return Steered::Claims;
    }
    match batches.into_iter().any(|batch| retried_run(request, batch).is_some()) {
        true => Steered::RetryOnly,
        false => Steered::Refused,
    }
}

/// Whether the round claims `batch` as it goes (`steered`): `wanted`, or under a hold only a
/// batch whose open run this request's first attempt opened.
pub(crate) fn wanted_when(request: &ReadyClaimRequest, batch: &Batch, steered: Steered) -> bool {
    match steered {
        Steered::Claims => wanted(request, batch),
        Steered::RetryOnly => retried_run(request, batch).is_some(),
        Steered::Refused => false,
    }
}

/// A held component's refusal: nothing read, nothing claimed.
pub(crate) fn refused(steering: Steering, known: Option<u64>) -> ReadyClaims {
    ReadyClaims { steering: moved(steering, known), held: true, answers: Vec::new() }
}

/// Whether the transaction claims `batch`: a forced request claims what exists; otherwise
/// the descriptor's readiness decides, as the runner's re-check did. A batch whose open run
/// carries the request's claim key is claimed again whatever it says: a retry after a lost
/// answer, which `claim` answers with the run the first attempt opened. A batch whose history
/// was pruned is never claimed.
pub(crate) fn wanted(request: &ReadyClaimRequest, batch: &Batch) -> bool {
    // Not even forced: a pruned batch's history is in its export until it is imported again.
    if batch.events.iter().any(|event| event.event_type.is_history_pruned()) {
        return false;
    }
    request.force || retried_run(request, batch).is_some() || request.descriptor.readiness(batch).is_ok()
}

/// Where the component's failed attempts on `batch` count from.
pub(crate) fn attempts_since(request: &ReadyClaimRequest, batch: &Batch) -> Seq {
    batch.last_reset_of(&request.descriptor.event_type)
}

/// The open run of ours that a first attempt of this (retried) request opened.
fn retried_run<'a>(request: &ReadyClaimRequest, batch: &'a Batch) -> Option<&'a Run> {
    let key = request.holder.claim_key.as_ref()?;
    batch
        .open_runs
        .iter()
        .find(|run| run.component == request.descriptor.name && run.holder.claim_key.as_ref() == Some(key))
}

/// The open run that keeps `batch` from the request, answered `held` (nothing written): the
/// component's open run, unless it is this request's own (a retry after a lost answer, which
/// claims it again). Exclusive, it keeps the batch unless `takeovers` names it with exactly
/// its generation and liveness (proven dead: claimed, and so abandoned, as `claim` does). Not
/// exclusive, only a run that is its batch's lock keeps it (`is_lock`): any other is
/// abandoned, as `claim` does. `None`: claim the batch. Judged on the batch as the claim's
/// transaction read it (PostgreSQL: as the round's read found it; a batch it then claims is
/// claimed only while unmoved since, so while its open run is still the one judged).
pub(crate) fn holding_run<'a>(request: &ReadyClaimRequest, batch: &'a Batch) -> Option<&'a Run> {
    let open = batch.open_runs.iter().find(|run| run.component == request.descriptor.name)?;
    if retried_run(request, batch).is_some_and(|ours| ours.generation == open.generation) {
        return None;
    }
    let keeps = match request.exclusive {
        true => takeover_naming(request, open).is_none(),
        false => !may_abandon(open, None),
    };
    keeps.then_some(open)
}

/// The takeover an exclusive request names `open` by, with exactly its batch, generation and
/// liveness. Only an exclusive claim takes a run over: for any other, `None`.
pub(crate) fn takeover_naming<'a>(request: &'a ReadyClaimRequest, open: &Run) -> Option<&'a Takeover> {
    request.exclusive.then(|| request.takeovers.iter().find(|takeover| names(takeover, open))).flatten()
}

/// Whether `takeover` names `open`: its batch, its generation and its holder's liveness.
fn names(takeover: &Takeover, open: &Run) -> bool {
    takeover.batch == open.batch_id
        && takeover.generation == open.generation
        && takeover.liveness == open.holder.liveness
}

/// Whether `open` is its batch's lock: its holder names a liveness record, so it claims as
/// the lock (claim-as-lock) and holds no batch lock beside it.
pub(crate) fn is_lock(open: &Run) -> bool {
    open.holder.liveness.is_some()
}

/// The rule every claim keeps, in every backend (PostgreSQL's claim functions keep it again
/// inside the database, `autocomp_claim`, so that a client of any release does): a claim may
/// abandon the batch's open run `open` (found open when it claims) only if that run is not
/// the batch's lock (`is_lock`), or `takeover` (the one an exclusive `claim_ready` names it
/// by, `takeover_naming`) names it with exactly its generation and liveness. Any other claim
/// of the batch is refused (`lock_conflict`, or answered `held` by `claim_ready`) and writes
/// nothing: were the run abandoned, its live holder and the claimer would both work the batch.
pub(crate) fn may_abandon(open: &Run, takeover: Option<&Takeover>) -> bool {
    !is_lock(open) || takeover.is_some_and(|takeover| names(takeover, open))
}

/// `claim`'s and `claim_many`'s refusal of a batch whose open run is its lock (`may_abandon`):
/// a `Conflict`, nothing written; the holder keeps the batch until it ends the run, or its
/// liveness record is gone and an exclusive claim takes the run over.
pub(crate) fn lock_conflict(open: &Run) -> StoreError {
    StoreError::Conflict(format!(
        "batch {}: run {} of {} is the batch's lock, held by {} (liveness {}); only an exclusive claim \
         that takes it over once that holder is proven dead may claim the batch",
        open.batch_id,
        open.generation,
        open.component,
        open.holder.agent,
        open.holder.liveness.as_deref().unwrap_or("none"),
    ))
}

/// An exclusive claim's refusal of `batch`, kept by `holding`: the batch as read, no claim,
/// and nothing written for it.
pub(crate) fn refusal(batch: Batch, holding: Run) -> ReadyAnswer {
    ReadyAnswer { batch, claim: None, failed_attempts: 0, checkpoint: None, held: Some(holding) }
}

/// Refuses a takeover that could never match a run: a liveness no holder may name.
pub(crate) fn check_takeovers(takeovers: &[Takeover]) -> Result<(), InvalidInput> {
    for liveness in takeovers.iter().filter_map(|takeover| takeover.liveness.as_deref()) {
        check_takeovers_liveness("takeovers.liveness", liveness)?;
    }
    Ok(())
}

/// Refuses a liveness record no holder may name, as `field`.
pub(crate) fn check_takeovers_liveness(field: &str, liveness: &str) -> Result<(), InvalidInput> {
    if liveness.is_empty() || liveness.len() > 255 || !liveness.chars().all(|c| c.is_ascii_graphic()) {
        return Err(InvalidInput::new(field, liveness, "must be 1-255 printable ASCII characters"));
    }
    Ok(())
}

/// Whether the claim must commit durably (synced, flushed) before it answers, whatever the
/// store's own setting relaxes: an exclusive one is the lock on its batches, and nothing else
/// keeps a second claimer off them if the store forgot it in a crash. (A SQLite file opened
/// in process syncs it only if its claims may come from other hosts:
/// `SqliteOptions::claims_from_other_hosts`.) Other claims may be
/// lost with the store's host: their batches are then simply ready again, and a batch lock
/// keeps a second claimer off.
pub(crate) fn durable(request: &ReadyClaimRequest) -> bool {
    request.exclusive
}

/// The answer for a batch read before its claim. A retried request's batch is answered as
/// its first attempt read it, without the run that attempt opened: that run is the claim.
pub(crate) fn answer(
    request: &ReadyClaimRequest,
    mut batch: Batch,
    claim: Option<Claim>,
    failed_attempts: u32,
    checkpoint: Option<Value>,
) -> ReadyAnswer {
    if let Some(retried) = retried_run(request, &batch).map(|run| run.generation) {
        batch.open_runs.retain(|run| !(run.component == request.descriptor.name && run.generation == retried));
    }
    ReadyAnswer { batch, claim, failed_attempts, checkpoint, held: None }
}
