//! `HandOnStore`: a stage handed on by the append (or the registration) that makes a batch
//! ready. A watcher that takes hand-ons offers itself (`offer_to_take`: its component's
//! descriptor and its holder, who names its liveness record); a runner whose result makes a
//! batch ready for such a component, judged by the component's trigger on the summary its
//! event leaves (`ComponentDescriptor::ready_on_hand`), names that component in its append
//! (`append_handing_on`; a source names it in its registration, `register_handing_on`), and
//! the store opens the component's run for an idle taker in the same transaction, with no
//! claim of the taker's, and announces it to the taker (`hand_on_notice`, `wait_as_taker`):
//! the taker reads it (`handed_runs`) and works it as claimed. The judgement is exact because
//! the store hands on only while the batch is as the appending run's claim read it
//! (`HandOn::rule`; a registration, only a batch it creates), and the run it opens names the
//! taker's liveness, so it is the batch's lock as any exclusive claim's: a taker that died is
//! taken over once proven dead, which also withdraws its offers.
//!
//! A store that keeps no takers answers the defaults: an offer is not kept (`false`), no
//! taker is listed, an append hands nothing on, nobody is handed a run. Its components claim
//! every batch as before.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::time::Duration;

use autocomp_model::{
    Batch, BatchId, ChangeInterest, ComponentDescriptor, ComponentName, Event, InvalidInput, NewBatch, NewEvent, Run,
    RunHolder, Seq,
};
use serde_json::Value;

use super::ready_claims::{ReadyAnswer, check_takeovers_liveness};
use super::{AnnouncementMark, BatchStore, Claim, CreateOutcome, StoreResult};
use crate::write_rules;

/// Most components one append hands its batch on to.
pub const MAX_HAND_ONS: usize = 64;

/// A watcher's offer to be handed batches (`HandOnStore::offer_to_take`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakerOffer {
    /// The component, as its readiness is judged: the appender judges a batch ready for it
    /// with this descriptor's trigger.
    pub descriptor: ComponentDescriptor,
    /// Who the runs handed to it name: its `liveness` is required (a handed run is its
    /// batch's lock).
    pub holder: RunHolder,
}

/// What `append_handing_on` did: the event, as `append_event` answers it, and the runs it
/// opened for the components it handed the batch on to (none when the store hands nothing
/// on, or no taker was idle, or the batch moved since the appending run's claim).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HandedOn {
    pub event: Event,
    #[serde(default)]
    pub runs: Vec<Run>,
}

/// What `register_handing_on` did: the registration as `register_batch` answers it, and the
/// runs it opened for the components it handed the new batch to (none when the batch existed
/// already, the store hands nothing on, or no taker was idle).
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredHandingOn {
    pub outcome: CreateOutcome,
    pub runs: Vec<Run>,
}

/// What a store handle heard of hand-ons to one taker since its last question
/// (`HandOnStore::hand_on_notice`): the append that hands a run on announces it to the taker
/// (`ChangeConcern::Handed`), so a taker reads its handed runs only when told of one, and
/// not even then when the announcements carried them.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOnNotice {
    /// `Some(true)`: a run was handed to it; `Some(false)`: none was, and every commit since
    /// was announced to this handle; `None`: the handle cannot tell (`handed_runs` answers).
    pub handed: Option<bool>,
    /// Where the next question starts from (`None` while the handle hears no announcements).
    pub mark: Option<AnnouncementMark>,
    /// The runs handed to it since, each as `handed_runs` answers it, as their announcements
    /// carried them: `Some` only when `handed` is `Some(true)` and every hand-on announced
    /// since carried its answer (PostgreSQL's, where it fits a notification); the taker works
    /// them without reading them.
    pub runs: Option<Vec<ReadyAnswer>>,
}

impl HandOnNotice {
    /// A handle that hears no announcements of hand-ons: it can never tell.
    pub const UNKNOWN: HandOnNotice = HandOnNotice { handed: None, mark: None, runs: None };
}

port_trait! {
    /// Stages handed on by the append that makes a batch ready.
    pub trait HandOnStore: BatchStore {
        /// Keeps `offer` (replacing one of the same component and liveness): from now on an
        /// append may hand the component's ready batches to this holder, one at a time (none
        /// while it holds an open run of the component). `false`: this store hands nothing
        /// on, nothing is kept.
        #[checked(check_offer(&offer)?)]
        async fn offer_to_take(&self, offer: TakerOffer) -> StoreResult<bool> {
            let _ = offer;
            Ok(false)
        }

        /// Withdraws the component's offer naming `liveness` (a watcher at its end); a
        /// withdrawn or unknown offer is a no-op. Runs already handed stay the holder's.
        #[checked(check_liveness(liveness)?)]
        async fn withdraw_offer(&self, component: &ComponentName, liveness: &str) -> StoreResult<()> {
            let _ = (component, liveness);
            Ok(())
        }

        /// The components that have an offer standing, each by the descriptor of its newest
        /// offer, in name order: what an appender judges its batch on.
        async fn takers(&self) -> StoreResult<Vec<ComponentDescriptor>> {
            Ok(Vec::new())
        }

        /// `append_event`, and in the same transaction a run of each component of `hand_on`
        /// for one of its idle takers, where `HandOn::rule` allows: the event names its run
        /// (a result), the batch has not changed since that run's claim, the steering holds
        /// neither the component nor the pipeline, the batch has no open run of the
        /// component, and a taker of it holds no open run of it. Refused as `append_event`
        /// refuses; a component that cannot be handed the batch is left out, nothing written
        /// for it.
        #[checked(event.validate()?; check_hand_on(&event, hand_on)?)]
        async fn append_handing_on(
            &self,
            batch: &BatchId,
            event: NewEvent,
            hand_on: &[ComponentName],
        ) -> StoreResult<HandedOn> {
            let _ = hand_on;
            Ok(HandedOn { event: self.append_event(batch, event).await?, runs: Vec::new() })
        }

        /// `register_batch`, and in the same transaction, if it registers the batch (it did
        /// not exist), a run of each component of `hand_on` for one of its idle takers, where
        /// neither the component nor the pipeline is held: the registrar judged the new batch
        /// ready for them on the summary it has with `first` (nothing else can have touched a
        /// batch this transaction creates, so the judgement is exact). Refused as
        /// `register_batch` refuses.
        #[checked(batch.validate()?; first.validate()?; write_rules::check_first_event(&first)?;
            check_registration_hand_on(hand_on)?)]
        async fn register_handing_on(
            &self,
            batch: NewBatch,
            first: NewEvent,
            hand_on: &[ComponentName],
        ) -> StoreResult<RegisteredHandingOn> {
            let _ = hand_on;
            Ok(RegisteredHandingOn { outcome: self.register_batch(batch, first).await?, runs: Vec::new() })
        }

        /// Whether this handle heard of a run of `component` handed to the taker `liveness`
        /// since `since` (the mark of this handle's last notice; `None` at first), with the
        /// runs themselves where the announcements carried them (`HandOnNotice::runs`, their
        /// attempts counted from `component`'s event type's newest `Reset`). Answered from
        /// what the handle heard, no round trip. Once the taker offered through this handle,
        /// such a hand-on also wakes its `wait_for_concerning_change`, so a taker that asks
        /// before it sleeps, and sleeps from a mark taken before it asked, never sleeps
        /// through one. The default cannot tell.
        async fn hand_on_notice(
            &self,
            component: &ComponentDescriptor,
            liveness: &str,
            since: Option<AnnouncementMark>,
        ) -> HandOnNotice {
            let _ = (component, liveness, since);
            HandOnNotice::UNKNOWN
        }

        /// `wait_for_concerning_change` for the taker `liveness` of `component`: a run
        /// handed to it wakes it too (answered `None`, as an announcement that concerns it),
        /// so a hand-on announced after the mark it sleeps from is never slept through. The
        /// default, for a store that announces no hand-on, waits as
        /// `wait_for_concerning_change` (its notices cannot tell: the taker reads instead).
        async fn wait_as_taker(
            &self,
            since: Seq,
            read_after: Option<AnnouncementMark>,
            interest: &ChangeInterest,
            component: &ComponentName,
            liveness: &str,
            timeout: Duration,
        ) -> StoreResult<Option<Seq>> {
            let _ = (component, liveness);
            self.wait_for_concerning_change(since, read_after, interest, timeout).await
        }

        /// The open runs of `component` naming `liveness` (a taker's), each as a claim round
        /// answers a claimed batch: the batch as it was before the run was opened, the run,
        /// the failed attempts since its event type's newest `Reset`, the checkpoint. The
        /// caller leaves out the ones it is working on.
        #[checked(check_liveness(liveness)?)]
        async fn handed_runs(&self, component: &ComponentDescriptor, liveness: &str) -> StoreResult<Vec<ReadyAnswer>> {
            let _ = (component, liveness);
            Ok(Vec::new())
        }
    }
}

/// Refuses an offer the store could never hand a run to: an invalid descriptor, one that
/// takes no hand-ons, a holder without a valid liveness.
pub(crate) fn check_offer(offer: &TakerOffer) -> Result<(), InvalidInput> {
    offer.descriptor.validate()?;
    offer.holder.validate()?;
    if !offer.descriptor.takes_hand_ons() {
        return Err(InvalidInput::new(
            "descriptor",
            offer.descriptor.name.as_str(),
            "takes no hand-ons (a source, a human step, a step with pools or with settled_for)",
        ));
    }
    if let Some(key) = &offer.holder.claim_key {
        return Err(InvalidInput::new(
            "holder.claim_key",
            key.as_str(),
            "a taker's runs are opened by appends, not claimed",
        ));
    }
    match &offer.holder.liveness {
        Some(liveness) => check_liveness(liveness),
        None => Err(InvalidInput::new("holder.liveness", "none", "a taker's runs must name its liveness record")),
    }
}

/// Refuses a liveness no holder may name.
pub(crate) fn check_liveness(liveness: &str) -> Result<(), InvalidInput> {
    check_takeovers_liveness("liveness", liveness)
}

/// Refuses a hand-on without a run to judge it by, naming a component twice or too many.
pub(crate) fn check_hand_on(event: &NewEvent, hand_on: &[ComponentName]) -> Result<(), InvalidInput> {
    if !hand_on.is_empty() && event.run.is_none() {
        let names = hand_on.iter().map(ComponentName::as_str).collect::<Vec<_>>().join(",");
        return Err(InvalidInput::new("hand_on", names, "only a result (an event naming its run) hands on"));
    }
    check_registration_hand_on(hand_on)
}

/// Refuses a hand-on naming a component twice or too many.
pub(crate) fn check_registration_hand_on(hand_on: &[ComponentName]) -> Result<(), InvalidInput> {
    if hand_on.len() > MAX_HAND_ONS {
        return Err(InvalidInput::new("hand_on", hand_on.len().to_string(), format!("at most {MAX_HAND_ONS}")));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = hand_on.iter().find(|name| !seen.insert(*name)) {
        return Err(InvalidInput::new("hand_on", twice.as_str(), "names a component more than once"));
    }
    Ok(())
}

/// A handed run as `handed_runs` answers it: the batch as a claim round answers a claimed
/// one (without the run, opened after what the batch was judged on), the run as its claim,
/// the failed attempts since its type's newest `Reset` and the checkpoint.
pub(crate) fn handed_answer(
    run: Run,
    mut batch: Batch,
    failed_attempts: u32,
    checkpoint: Option<Value>,
) -> ReadyAnswer {
    batch.open_runs.retain(|open| !(open.component == run.component && open.generation == run.generation));
    ReadyAnswer { batch, claim: Some(Claim { run, abandoned: None }), failed_attempts, checkpoint, held: None }
}

/// What a store reads, inside the append's transaction, to decide one hand-on.
pub(crate) struct HandOn<'a> {
    /// The appending run's claim seq: where the batch stood when its runner read it.
    pub claim_seq: Seq,
    /// The batch's newest change before this append.
    pub changed_seq: Seq,
    /// The steering holds the component or the whole pipeline.
    pub held: bool,
    /// The batch's open runs of the component.
    pub open: &'a [Run],
}

impl HandOn<'_> {
    /// Whether the store may open the component's run for a taker (which it then picks among
    /// those holding no open run of the component): the batch is as the appender's claim read
    /// it (so the appender's judgement of it is exact), nothing holds the component, and
    /// nobody works the batch for it.
    pub(crate) fn rule(&self) -> bool {
        self.changed_seq == self.claim_seq && !self.held && self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use autocomp_model::{Agent, EventType, Outcome, RunState, Timestamp};

    use super::*;

    fn open_run() -> Run {
        Run {
            batch_id: BatchId::new("B1").unwrap(),
            component: ComponentName::new("checker").unwrap(),
            generation: 1,
            holder: RunHolder {
                agent: Agent::new("a").unwrap(),
                host: "h".into(),
                pid: 1,
                claim_key: None,
                liveness: None,
            },
            started_at: Timestamp(0),
            claim_seq: Seq(7),
            state: RunState::Open,
            ended_at: None,
            transient: false,
        }
    }

    #[test]
    fn a_hand_on_needs_the_batch_as_claimed_no_hold_and_nobody_on_the_step() {
        let as_claimed = HandOn { claim_seq: Seq(7), changed_seq: Seq(7), held: false, open: &[] };
        assert!(as_claimed.rule());
        assert!(!HandOn { changed_seq: Seq(8), ..as_claimed }.rule(), "moved since the claim");
        assert!(!HandOn { held: true, ..as_claimed }.rule(), "the step or the pipeline held");
        let open = [open_run()];
        assert!(!HandOn { open: &open, ..as_claimed }.rule(), "someone works the step on it");
    }

    #[test]
    fn only_a_result_hands_on_each_step_once() {
        let checker = ComponentName::new("checker").unwrap();
        let event = NewEvent::new(EventType::new("Received").unwrap(), Outcome::Success, Agent::new("a").unwrap());
        assert!(check_hand_on(&event, &[]).is_ok(), "naming none is an append");
        let refused = check_hand_on(&event, std::slice::from_ref(&checker)).unwrap_err();
        assert_eq!((refused.field.as_str(), refused.value.as_str()), ("hand_on", "checker"));
        let result = event.in_run(ComponentName::new("receiver").unwrap(), 1);
        assert!(check_hand_on(&result, std::slice::from_ref(&checker)).is_ok());
        let twice = check_hand_on(&result, &[checker.clone(), checker]).unwrap_err();
        assert_eq!(twice.reason, "names a component more than once");
        let many: Vec<ComponentName> =
            (0..=MAX_HAND_ONS).map(|n| ComponentName::new(format!("step-{n}")).unwrap()).collect();
        assert_eq!(check_hand_on(&result, &many).unwrap_err().value, (MAX_HAND_ONS + 1).to_string());
    }
}
