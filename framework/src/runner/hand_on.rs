//! Hand-ons, the runner's side (`HandOnStore`). A watcher whose component takes hand-ons
//! offers itself as a taker once a pass of its got the component's turn, and withdraws while
//! it defers to another pass (a deferring watcher sleeps on a timer, not in the change feed)
//! and at its end. A result names the takers' components its batch is then ready for, judged
//! by their own triggers on the summary the result leaves (`ComponentDescriptor::ready_on_hand`,
//! from the takers' descriptors read at most every `TAKERS_FRESH_FOR`, off the append's
//! path), so the store opens their runs in the append's transaction. A taker's pass over the
//! runs handed to it (`Selection::Handed`) takes no turn and makes no claim: the run is the
//! claim and the lock, and the batch is worked and recorded as any claimed one. The append
//! announces each run it hands on to its taker, so a watcher reads its handed runs only when
//! its store handle heard of one (`handed_now`), or cannot tell.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use autocomp_model::{
    Batch, BatchId, BatchSummary, ComponentDescriptor, ComponentName, NewBatch, NewEvent, RunHolder, Seq,
    SummaryHeader, SummaryState, Timestamp,
};
use autocomp_store::{AnnouncementMark, Claim, ObjectStore, ReadyAnswer, StoreError, TakerOffer};
use tracing::{debug, warn};

use super::Runner;
use super::claim::log_claim;
use super::pass::{Claimed, Pass};
use super::phases::{self, Phase};
use super::takeover::ClaimLock;
use crate::component::Component;
use crate::exit::RunError;
use crate::locks::{LivenessHold, LockPath};

/// How long the takers' descriptors read are used before they are read again (in a task of
/// its own, beside the append that found them stale): an offer made since waits this long
/// at most for its first hand-on.
const TAKERS_FRESH_FOR: Duration = Duration::from_secs(1);

/// The takers' descriptors, and when they were read.
type TakersRead = (Instant, Arc<Vec<ComponentDescriptor>>);

/// The takers in this process: (liveness record, component) for each runner that offered.
/// A run is handed to a component's liveness record, not to a runner, and nothing but the
/// runner's own guards keeps it from being taken up twice; so of two runners of one
/// component sharing a lock service (one liveness record) only the first offers, and the
/// other claims as a runner without hand-ons does.
static TAKERS_IN_PROCESS: LazyLock<Mutex<HashSet<(String, ComponentName)>>> = LazyLock::new(Default::default);

/// A runner's place in `TAKERS_IN_PROCESS`, given up when the runner is dropped (its
/// handed runs released or left to be taken over as any process's are).
struct TakerPlace(String, ComponentName);

impl TakerPlace {
    /// The place of `component`'s taker under `liveness`, if no other runner holds it.
    fn take(liveness: &str, component: &ComponentName) -> Option<Self> {
        let mut takers = TAKERS_IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        takers.insert((liveness.to_owned(), component.clone())).then(|| Self(liveness.to_owned(), component.clone()))
    }
}

impl Drop for TakerPlace {
    fn drop(&mut self) {
        let mut takers = TAKERS_IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        takers.remove(&(std::mem::take(&mut self.0), self.1.clone()));
    }
}

/// What a runner keeps of hand-ons: its own offer, and the takers it judges its results for.
#[derive(Default)]
pub(super) struct HandOns {
    /// This runner's place as its component's taker under its liveness record, from its
    /// first offer on (runs may be handed to it until it is dropped).
    place: Mutex<Option<TakerPlace>>,
    /// The standing offer, with the liveness hold kept while it stands (a run may be handed
    /// to this process at any moment: its liveness is kept as for a held claim).
    offer: Mutex<Option<Option<LivenessHold>>>,
    /// The store keeps no takers (an offer was answered `false`): never offered again.
    store_keeps_none: AtomicBool,
    /// An offer was kept once: runs may be handed to this process.
    offered_once: AtomicBool,
    /// The takers' descriptors as last read, and when.
    takers: Arc<Mutex<Option<TakersRead>>>,
    /// A read of the takers is under way.
    refreshing: Arc<AtomicBool>,
    /// The handed runs the watcher's wake found, for the pass it then starts.
    found: Mutex<Vec<ReadyAnswer>>,
    /// Where the store handle's announcements stood at the last `hand_on_notice`.
    notice_mark: Mutex<Option<AnnouncementMark>>,
    /// The newest `claim_seq` of the runs handed to this process that it took up. A taker is
    /// handed one run of its component at a time, each opened after the one before it closed,
    /// so their seqs only grow: an announcement carrying a run at or below this one is of a
    /// run already taken up (found by a read before its announcement was asked about).
    taken_through: AtomicI64,
}

impl<C: Component> Runner<C> {
    /// Whether this runner's offer to be handed batches stands.
    fn offer_stands(&self) -> bool {
        self.hand_ons.offer.lock().expect("the offer's mutex").is_some()
    }

    /// Whether runs may have been handed to this process: once it has offered, its watcher
    /// looks for them at each wake, retry and heartbeat, also after it withdrew (an append
    /// may have handed it one just before).
    pub(crate) fn may_have_handed_runs(&self) -> bool {
        self.hand_ons.offered_once.load(Ordering::Relaxed)
    }

    /// The liveness record runs may have been handed to this process under, if they may
    /// have been: its watcher sleeps as their taker (`HandOnStore::wait_as_taker`).
    pub(crate) fn taker_liveness(&self) -> Option<String> {
        self.handed_record().ok().flatten()
    }

    /// The liveness record of this runner's taker place, once an offer of its was kept: the
    /// one record runs are handed to it under, read and taken up by. A lock service's record
    /// never changes once made, it only goes (`LockService::liveness`); one that is not the
    /// place's any more counts as gone (`LocksLost`), as its runs may then be taken over by
    /// whoever finds it dead, and taking them up too would work a batch twice.
    fn handed_record(&self) -> Result<Option<String>, RunError> {
        if !self.may_have_handed_runs() {
            return Ok(None);
        }
        let own = self.own_liveness()?;
        match self.place_record() {
            Some(record) if record == own => Ok(Some(own)),
            _ => Err(RunError::LocksLost(format!(
                "this process's liveness record is not the one runs were handed to it under (now {own}): taking \
                 none up"
            ))),
        }
    }

    /// The liveness record this runner's taker place was taken under, if it holds one.
    fn place_record(&self) -> Option<String> {
        self.hand_ons.place.lock().expect("the taker place's mutex").as_ref().map(|place| place.0.clone())
    }

    /// Offers this watcher as a taker of its component's batches, if the component takes
    /// hand-ons, its claims are the batches' locks and the store keeps takers; a no-op while
    /// the offer stands. An offer that fails is logged: the watcher claims as before.
    pub(crate) async fn offer_to_take(&self) {
        if self.offer_stands()
            || self.hand_ons.store_keeps_none.load(Ordering::Relaxed)
            || !self.descriptor.takes_hand_ons()
            || !self.claims_are_locks()
        {
            return;
        }
        let Ok(liveness) = self.own_liveness() else { return };
        if !self.holds_taker_place(&liveness) {
            return debug!(liveness, "another runner of this component in this process takes its hand-ons");
        }
        let hold = match self.pipeline.locks.hold_liveness().await {
            Ok(hold) => hold,
            Err(e) => return debug!("not offering to take hand-ons: {e}"),
        };
        let holder = RunHolder { liveness: Some(liveness.clone()), ..self.run_holder() };
        let offer = TakerOffer { descriptor: self.readiness_descriptor(), holder };
        match self.pipeline.store.offer_to_take(offer).await {
            Ok(true) => {
                debug!(liveness, "offered to take hand-ons");
                *self.hand_ons.offer.lock().expect("the offer's mutex") = Some(hold);
                self.hand_ons.offered_once.store(true, Ordering::Relaxed);
            }
            Ok(false) => self.hand_ons.store_keeps_none.store(true, Ordering::Relaxed),
            Err(e) => warn!("cannot offer to take hand-ons (claiming as before): {e}"),
        }
    }

    /// Whether this runner is (or now becomes) its component's one taker under `liveness` in
    /// this process (`TAKERS_IN_PROCESS`). A place is kept for the runner's life: under
    /// another record than its place's (which no lock service makes) it offers no more.
    fn holds_taker_place(&self, liveness: &str) -> bool {
        let mut place = self.hand_ons.place.lock().expect("the taker place's mutex");
        match place.as_ref() {
            Some(held) => held.0 == liveness,
            None => {
                *place = TakerPlace::take(liveness, &self.name);
                place.is_some()
            }
        }
    }

    /// Withdraws the standing offer (a watcher that defers or ends). Runs already handed stay
    /// this process's: its next wake (or pass) works them, or whoever finds it dead takes them
    /// over.
    pub(crate) async fn withdraw_offer(&self) {
        let Some(hold) = self.hand_ons.offer.lock().expect("the offer's mutex").take() else { return };
        // Withdrawn under the record it was made under, which is its place's.
        let Some(liveness) = self.place_record() else { return };
        if let Err(e) = self.pipeline.store.withdraw_offer(&self.name, &liveness).await {
            warn!("cannot withdraw the offer to take hand-ons: {e}");
        }
        drop(hold);
    }

    /// At a watcher's end, after its offer is withdrawn: the runs handed to it that it did
    /// not start are released (closed without an event, ready again for the next pass of
    /// the step) rather than left to be taken over once this process is proven dead.
    pub(crate) async fn release_handed(&self) {
        if !self.may_have_handed_runs() {
            return;
        }
        // What a question found is released below with the rest, not taken up again.
        self.hand_ons.found.lock().expect("the found runs' mutex").clear();
        let Ok(Some(liveness)) = self.handed_record() else { return };
        let handed = match self.pipeline.store.handed_runs(&self.readiness_descriptor(), &liveness).await {
            Ok(handed) => handed,
            Err(e) => return warn!("cannot read the runs handed to this watcher at its end: {e}"),
        };
        for run in handed.into_iter().filter_map(|answer| answer.claim.map(|claim| claim.run)) {
            self.give_back_handed(&run.batch_id, run.generation, "at the watcher's end").await;
        }
    }

    /// Releases a run handed to this process that it will not work (closed without an event:
    /// the batch is ready again for the next pass of the step); a failure is logged, and the
    /// run is then taken over once this process is proven dead.
    async fn give_back_handed(&self, batch: &BatchId, generation: i64, why: &str) {
        match self.pipeline.store.release(batch, &self.name, generation).await {
            Ok(()) => debug!(%batch, "released a run handed to this watcher ({why})"),
            Err(e) => warn!(%batch, "cannot release a run handed to this watcher ({why}): {e}"),
        }
    }

    /// The descriptor a claim's readiness is judged by: without what readiness does not read.
    pub(super) fn readiness_descriptor(&self) -> ComponentDescriptor {
        ComponentDescriptor { result_schema: None, reads: Vec::new(), ..self.descriptor.clone() }
    }

    /// The takers' components `event`, the result of `claim` on `batch` (as its claim read
    /// it), makes the batch ready for: judged by each one's trigger on the summary the event
    /// leaves. The event's seq is not known yet: any seq past the claim's orders it as the
    /// store will (the store hands on only while nothing changed the batch since the claim).
    pub(super) fn hand_ons(&self, batch: &Batch, claim: &Claim, event: &NewEvent) -> Vec<ComponentName> {
        let takers = self.known_takers();
        if takers.iter().all(|taker| taker.name == self.name) {
            return Vec::new();
        }
        takers_ready(&takers, &summary_after(batch, claim, event), Some(&self.name))
    }

    /// Reads the takers again beside the pass, if the ones read are stale: its results then
    /// judge by a fresh list without waiting for it.
    pub(super) fn refresh_takers(&self) {
        self.known_takers();
    }

    /// The takers as last read; a stale or missing list is read again in a task of its own
    /// (this append goes by what was read, none at first; a failed read keeps none, so
    /// nothing is handed on until one succeeds).
    fn known_takers(&self) -> Arc<Vec<ComponentDescriptor>> {
        let known = self.hand_ons.takers.lock().expect("the takers' mutex").clone();
        let fresh = known.as_ref().is_some_and(|(read, _)| read.elapsed() < TAKERS_FRESH_FOR);
        if !fresh && !self.hand_ons.refreshing.swap(true, Ordering::AcqRel) {
            let store: Arc<dyn ObjectStore> = Arc::clone(&self.pipeline.store);
            let (slot, refreshing) = (Arc::clone(&self.hand_ons.takers), Arc::clone(&self.hand_ons.refreshing));
            let reader = self.name.clone();
            tokio::spawn(async move {
                // Bounded: a read that never answers would leave the list unread for good.
                let read = tokio::time::timeout(TAKERS_FRESH_FOR * 5, store.takers()).await;
                let takers = match read.unwrap_or_else(|_| Err(StoreError::Unavailable("no answer".into()))) {
                    Ok(takers) => {
                        let names: Vec<&str> = takers.iter().map(|taker| taker.name.as_str()).collect();
                        debug!(%reader, takers = %names.join(","), "read the takers of hand-ons");
                        takers
                    }
                    Err(e) => {
                        debug!("cannot read the takers of hand-ons: {e}");
                        Vec::new()
                    }
                };
                *slot.lock().expect("the takers' mutex") = Some((Instant::now(), Arc::new(takers)));
                refreshing.store(false, Ordering::Release);
            });
        }
        known.map(|(_, takers)| takers).unwrap_or_default()
    }

    /// Whether runs of its component were handed to this process since the last question:
    /// taken from the announcements when they carried the runs, read (`find_handed`) when
    /// the store handle heard of one without them, or cannot tell (it hears no
    /// announcements, or missed some); else answered from what it heard, with no read. A
    /// hand-on announced after the question wakes the watcher's next sleep, if that sleep
    /// starts from a mark or a head read taken before the question (its look's).
    pub(crate) async fn handed_now(&self) -> Result<bool, RunError> {
        let Some(liveness) = self.handed_record()? else { return Ok(false) };
        if !self.hand_ons.found.lock().expect("the found runs' mutex").is_empty() {
            // Found by the question before, not taken up yet.
            return Ok(true);
        }
        let since = *self.hand_ons.notice_mark.lock().expect("the notice mark's mutex");
        let notice = self.pipeline.store.hand_on_notice(&self.descriptor, &liveness, since).await;
        *self.hand_ons.notice_mark.lock().expect("the notice mark's mutex") = notice.mark;
        match (notice.handed, notice.runs) {
            (Some(false), _) => Ok(false),
            (Some(true), Some(mut runs)) => {
                let taken_through = self.hand_ons.taken_through.load(Ordering::Acquire);
                runs.retain(|answer| answer.claim.as_ref().is_some_and(|claim| claim.run.claim_seq.0 > taken_through));
                let found = !runs.is_empty();
                *self.hand_ons.found.lock().expect("the found runs' mutex") = runs;
                Ok(found)
            }
            _ => self.find_handed().await,
        }
    }

    /// Whether the store handed this process runs of its component (read): found, they wait
    /// for the pass over them (`Selection::Handed`).
    pub(crate) async fn find_handed(&self) -> Result<bool, RunError> {
        let Some(liveness) = self.handed_record()? else { return Ok(false) };
        let answers = self.pipeline.store.handed_runs(&self.readiness_descriptor(), &liveness).await?;
        let found = !answers.is_empty();
        *self.hand_ons.found.lock().expect("the found runs' mutex") = answers;
        Ok(found)
    }

    /// A taker's claim phase (`Selection::Handed`): the runs `find_handed` found (read again
    /// if it found none), each claimed as a claim round answers it (past `max_attempts` its
    /// give-up is recorded instead of work).
    pub(super) async fn take_handed(&self, pass: &mut Pass) -> Result<(), RunError> {
        self.refresh_takers();
        let Some(liveness) = self.handed_record()? else { return Ok(()) };
        let found = std::mem::take(&mut *self.hand_ons.found.lock().expect("the found runs' mutex"));
        let mut answers = match found.is_empty() {
            true => self.pipeline.store.handed_runs(&self.readiness_descriptor(), &liveness).await?,
            false => found,
        };
        // A run told twice (an announcement heard again) is worked once.
        answers.sort_by_key(|answer| answer.claim.as_ref().map(|claim| claim.run.claim_seq));
        answers.dedup_by_key(|answer| answer.claim.as_ref().map(|claim| claim.run.claim_seq));
        phases::mark(Phase::Claim);
        let breaker_counting = self.steering.get().is_some_and(|steering| steering.breakers.contains_key(&self.name));
        let mut gave_up = Vec::new();
        for ReadyAnswer { batch, claim, failed_attempts, checkpoint, .. } in answers {
            let Some(claim) = claim else { continue };
            self.hand_ons.taken_through.fetch_max(claim.run.claim_seq.0, Ordering::AcqRel);
            if let Err(refusal) = self.descriptor.readiness(&batch) {
                // Judged by another descriptor of the step (a rolling upgrade): not ours to work.
                self.give_back_handed(&batch.id, claim.generation(), &format!("not ready for it: {refusal}")).await;
                continue;
            }
            let span = self.batch_span(&batch.id);
            log_claim(&batch.id, &claim, &span);
            let path = LockPath::Batch(self.name.clone(), batch.id.clone());
            let lock = ClaimLock::boxed(path, &self.pipeline.locks, &liveness).await?;
            let claimed = Claimed { batch, claim, lock, slots: Vec::new(), checkpoint, breaker_counting, span };
            match failed_attempts >= self.config.max_attempts {
                true => gave_up.push((claimed, failed_attempts)),
                false => pass.claimed.push(claimed),
            }
        }
        let recorded = self.give_up(gave_up).await;
        pass.summary.results.extend(recorded);
        Ok(())
    }
}

/// The components of `takers` (but the appender's own) a change that leaves a batch as
/// `summary` makes it ready for: whom that change hands the batch on to.
fn takers_ready(
    takers: &[ComponentDescriptor],
    summary: &BatchSummary,
    appender: Option<&ComponentName>,
) -> Vec<ComponentName> {
    takers
        .iter()
        .filter(|taker| Some(&taker.name) != appender && taker.ready_on_hand(summary))
        .map(|taker| taker.name.clone())
        .collect()
}

/// The components of `takers` a batch registered with `first` is ready for, judged by their
/// triggers on the summary the registration leaves: whom it hands the new batch on to
/// (`HandOnStore::register_handing_on`). The seqs are the registration's order, not the
/// store's: nothing else is in a batch its registration creates.
pub fn registration_hand_ons(takers: &[ComponentDescriptor], new: &NewBatch, first: &NewEvent) -> Vec<ComponentName> {
    if takers.is_empty() {
        return Vec::new();
    }
    let now = Timestamp::now();
    let batch = new.registered(Seq(1), now);
    let mut state = SummaryState::of(&batch);
    state.record(&first.clone().recorded(&new.id, Seq(2), now));
    let summary = state.summary(SummaryHeader { changed_seq: Seq(2), ..SummaryHeader::of(&batch) });
    takers_ready(takers, &summary, None)
}

/// The summary `batch` (as the claim read it, before its run was opened) has once `event`
/// is recorded and the claim's run closed: what a taker's readiness is judged on.
fn summary_after(batch: &Batch, claim: &Claim, event: &NewEvent) -> BatchSummary {
    let seq = Seq(claim.run.claim_seq.0.max(batch.changed_seq.0) + 1);
    let mut state = SummaryState::of(batch);
    state.record(&event.clone().recorded(&batch.id, seq, Timestamp::now()));
    state.run_closed(&claim.run.component);
    state.summary(SummaryHeader { changed_seq: seq, ..SummaryHeader::of(batch) })
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, BatchId, BatchType, EventType, Outcome, Run, RunState, Trigger};

    use super::*;

    #[test]
    fn one_runner_a_component_and_liveness_record_is_a_taker_in_a_process() {
        let (checker, archiver) = (ComponentName::new("checker").unwrap(), ComponentName::new("archiver").unwrap());
        let first = TakerPlace::take("local:h:1:aa", &checker).expect("the first runner's place");
        assert!(TakerPlace::take("local:h:1:aa", &checker).is_none(), "a second runner of the step under one record");
        let other_step = TakerPlace::take("local:h:1:aa", &archiver).expect("another step under the record");
        let other_record = TakerPlace::take("local:h:1:bb", &checker).expect("the step under another record");
        drop(first);
        let next = TakerPlace::take("local:h:1:aa", &checker).expect("the place once its runner is gone");
        drop((next, other_step, other_record));
    }

    #[test]
    fn a_registration_is_handed_to_the_takers_its_first_event_makes_it_ready_for() {
        let step = |name: &str, requires: &str| {
            let trigger = Trigger::builder().requires(requires).blocked_by(format!("{name}_Done").as_str()).build();
            let done = EventType::new(format!("{name}_Done")).unwrap();
            ComponentDescriptor::new(ComponentName::new(name).unwrap(), "1", done, trigger)
        };
        let takers = [step("checker", "Data_Received"), step("archiver", "checker_Done")];
        let new = NewBatch::new(BatchId::new("B1").unwrap(), BatchType::new("Delivery").unwrap());
        let delivered =
            NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, Agent::new("trigger").unwrap());
        let names = |names: Vec<ComponentName>| names.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(names(registration_hand_ons(&takers, &new, &delivered)), ["checker"]);
        let failed = NewEvent { outcome: Outcome::Failure, ..delivered };
        assert!(registration_hand_ons(&takers, &new, &failed).is_empty(), "a failed delivery is ready for nobody");
        assert!(registration_hand_ons(&[], &new, &failed).is_empty());
    }

    #[test]
    fn the_summary_a_result_leaves_has_its_event_and_not_its_run() {
        let (receiver, checker) = (ComponentName::new("receiver").unwrap(), ComponentName::new("checker").unwrap());
        let run = Run {
            batch_id: BatchId::new("B1").unwrap(),
            component: receiver.clone(),
            generation: 3,
            holder: RunHolder {
                agent: Agent::new("r").unwrap(),
                host: "h".into(),
                pid: 1,
                claim_key: None,
                liveness: None,
            },
            started_at: Timestamp(0),
            claim_seq: Seq(41),
            state: RunState::Open,
            ended_at: None,
            transient: false,
        };
        let batch = Batch {
            id: BatchId::new("B1").unwrap(),
            batch_type: BatchType::new("RoundTrip").unwrap(),
            priority: 0,
            metadata: Default::default(),
            created_seq: Seq(1),
            modified_seq: Seq(1),
            changed_seq: Seq(41),
            created_at: Timestamp(0),
            modified_at: Timestamp(0),
            events: Vec::new(),
            open_runs: vec![run.clone()],
            as_of: Timestamp(0),
        };
        let claim = Claim { run, abandoned: None };
        let received = NewEvent::new(EventType::new("Received").unwrap(), Outcome::Success, Agent::new("r").unwrap())
            .in_run(receiver.clone(), 3);
        let after = summary_after(&batch, &claim, &received);
        assert!(after.running.is_empty(), "{:?}", after.running);
        assert!(after.changed_seq > Seq(41));
        let trigger = Trigger::builder().requires("Received").blocked_by("Checked").build();
        let taker = ComponentDescriptor::new(checker, "1", EventType::new("Checked").unwrap(), trigger);
        assert!(taker.ready_on_hand(&after));
        assert!(!taker.ready_on_hand(&BatchSummary::of(&batch)), "not before the result");
    }
}
