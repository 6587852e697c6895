//! `--watch`: a component that stays up and starts a pass as soon as the index offers it a
//! batch, sleeping in the store's change feed (a long poll) in between; while the component
//! is held (paused, draining, circuit open) it asks nothing and sleeps until the steering
//! moves the store. Each pass is exactly a cron pass (poll lock, claims, fencing, results,
//! registry), but for the component's turn: a pass that claimed all it found keeps the poll
//! lock for the next one, given back between passes once idle or held long enough
//! (`runner/turn.rs`). A heartbeat pass keeps the registry fresh and catches readiness that
//! only time brings; one that finds the turn held elsewhere defers to its holder, who looks.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{BatchId, Seq, Timestamp};
use autocomp_sboi::BatchIndex;
use autocomp_store::{AnnouncementMark, ObjectStore};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::component::Component;
use crate::exit::{self, RunError};
use crate::runner::{Judged, Runner, Selection, phases, stop_requested};
use crate::verdict::{PassEnd, pass, pass_verdict};

mod deferral;
mod feed;

/// The longest single wait in the change feed. The store service caps its long polls
/// anyway; a bound here keeps a hung connection from outliving a heartbeat by much.
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// How long a wake waits for another process to finish writing an embedded index.
const INDEX_WAIT: Duration = Duration::from_secs(2);
/// After a pass whose batches waited for a full pool, or that found another pass holding
/// the poll lock, the next look comes within a quarter of how long it has waited so far,
/// between `POOL_RETRY_FIRST` and `POOL_RETRY_MAX`: a slot or the poll lock frees without the
/// store moving (its holder records its result just before releasing it, claims nothing, or
/// dies). Measured from when the waiting began, not doubled per pass: passes woken by store
/// changes meanwhile (new batches registered) do not push the next look further away.
const POOL_RETRY_FIRST: Duration = Duration::from_millis(500);
const POOL_RETRY_MAX: Duration = Duration::from_secs(10);

/// How soon to look again when batches have waited `waited` for a slot or the poll lock.
fn pool_retry_after(waited: Duration) -> Duration {
    (waited / 4).clamp(POOL_RETRY_FIRST, POOL_RETRY_MAX)
}

/// What wakes a watcher and what it asks.
pub struct Watched {
    /// Its change feed is what the watcher sleeps in.
    pub store: Arc<dyn ObjectStore>,
    /// Asked whether it has caught up with the store before the candidates are counted.
    pub index: Arc<dyn BatchIndex>,
}

/// Watches until shutdown, the loss of the lock service or a timed-out batch; returns the
/// exit code a cron pass would have (1 once any pass failed a batch, else 0), or the error
/// that ended it (the store or index unreachable: exit 5, as for a cron pass).
pub async fn run_watching<C: Component>(
    runner: &Arc<Runner<C>>,
    watched: Watched,
    heartbeat: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<u8, RunError> {
    let Watched { store, index } = watched;
    runner.coalesce_reports();
    runner.keep_turns();
    let mut watcher = Watcher {
        runner,
        store: &store,
        index: &index,
        heartbeat,
        worst: exit::OK,
        last_pass: None,
        waiting_since: None,
        deferral: deferral::Deferral::default(),
        offers: feed::FeedOffers::new(feed::DEPTH_FACTOR, feed::MIN_DEPTH),
        refused: None,
    };
    let watched = phases::watching(runner.name(), watch_loop(&mut watcher, &mut shutdown)).await;
    runner.withdraw_offer().await;
    runner.release_handed().await;
    runner.give_back_turn(true).await;
    // Whatever the registry has not heard yet, however the watch ended.
    let flushed = runner.flush_reports(true).await;
    let code = watched?;
    flushed?;
    Ok(code)
}

/// A watch in progress: what it watches, and what it remembers between passes.
struct Watcher<'a, C: Component> {
    runner: &'a Arc<Runner<C>>,
    store: &'a Arc<dyn ObjectStore>,
    index: &'a Arc<dyn BatchIndex>,
    heartbeat: Duration,
    /// The exit code at shutdown: 1 once a pass failed a batch.
    worst: u8,
    /// When the last pass started; `None` before the first, which runs at once, as a cron
    /// start would: it registers the component and takes whatever is ready already.
    last_pass: Option<Instant>,
    /// Since when batches have waited for a pool slot, if they do.
    waiting_since: Option<Instant>,
    /// Whether another pass has held the component's poll lock at every try, and since when:
    /// until a pass of this watcher gets it, the watcher stays out of the way (below).
    deferral: deferral::Deferral,
    /// What the index last answered, corrected by the change feed since.
    offers: feed::FeedOffers,
    /// Why the last pass refused to start (a broken contract), said once until it changes.
    refused: Option<String>,
}

async fn watch_loop<C: Component>(
    watcher: &mut Watcher<'_, C>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<u8, RunError> {
    // The head the last sleep read at its end, if it read one (a change that concerns the
    // watcher wakes it without a read): the next look needs no head read of its own.
    let mut woke_at: Option<Seq> = None;
    loop {
        if *shutdown.borrow() {
            return Ok(watcher.worst);
        }
        // A taker first works the runs handed to it, if its store handle heard of any (no
        // read otherwise), and reads for them at each heartbeat whatever it heard.
        let heartbeat_read = watcher.last_pass.is_some_and(|at| at.elapsed() >= watcher.heartbeat);
        if let Some(code) = watcher.take_up_handed(heartbeat_read, &mut woke_at, shutdown).await? {
            return Ok(code);
        }
        // Between passes, off every batch's path: a turn kept idle or long enough goes back.
        watcher.runner.give_back_turn(false).await;
        let retry = watcher.still_deferring(shutdown).await;
        if retry == Retry::Held {
            // The head the feed's wake read is older than the look after the deferral.
            woke_at = None;
            match watcher.defer(shutdown).await? {
                ControlFlow::Break(code) => return Ok(code),
                ControlFlow::Continue(()) => continue,
            }
        }
        // The look answers as of a head (`seen`) every change up to which it read: a change
        // after it wakes the wait below, so readiness between the question and the wait is
        // never slept through.
        let heartbeat_due = watcher.last_pass.is_none_or(|at| at.elapsed() >= watcher.heartbeat);
        let (offered, judged, covered, seen) = phases::look(watcher.look(woke_at.take(), heartbeat_due)).await?;
        let go_again = if heartbeat_due || !offered.is_empty() {
            let handled = match watcher.pass(offered, judged, heartbeat_due).await? {
                ControlFlow::Break(code) => return Ok(code),
                ControlFlow::Continue(handled) => handled,
            };
            if *shutdown.borrow() {
                return Ok(watcher.worst);
            }
            // A pass that worked on anything goes again at once: a full queue leaves more
            // behind, and whatever arrived while it worked is already in the store. One that
            // claimed nothing although the index offered batches (another worker has them,
            // or the store's re-check refused them) wrote nothing that moves the head, so it
            // sleeps from the head read before it: a change made while it ran wakes it at
            // once, and a batch held elsewhere costs one pass per store change, no loop.
            if handled > 0 {
                debug!(handled, "pass worked; looking again");
            }
            handled > 0 || !covered
        } else {
            // Nothing offered (or held): nothing waits for a pool slot either.
            watcher.waiting_since = None;
            if retry == Retry::Free {
                // The retry found the turn free and there is nothing to claim: the watcher
                // sleeps in the change feed again rather than looking at every retry until a
                // pass of its gets the turn (a heartbeat that met a cron pass left an idle
                // watcher so for up to a heartbeat). How long it has deferred is kept, for
                // the deferral that begins when its next pass meets the busy turn again, so a
                // busy component's watchers retry no more often (`deferral.rs`).
                watcher.deferral.back_to_feed(Instant::now());
            }
            !covered
        };
        // Handed a run while it looked or passed (the hand-on's announcement came before the
        // question below; one after it wakes the sleep, which starts from the look's mark or
        // head read, both before the question).
        if go_again || watcher.runner.handed_now().await? {
            continue;
        }
        match phases::sleep(watcher.sleep(seen, shutdown)).await? {
            ControlFlow::Break(code) => return Ok(code),
            ControlFlow::Continue(head) => woke_at = head,
        }
    }
}

/// What a deferring watcher's retry (or a wake of one back in the feed from a deferral) read
/// of the component's turn: still held elsewhere (defer again), read free (a look that finds
/// nothing sends it to the feed), or nothing to tell (it has not deferred, a heartbeat is
/// due, or a service that cannot tell by a read: look).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    Held,
    Free,
    Look,
}

/// What a look offers: the candidates, those it found ready on their summaries (`Judged`),
/// whether its answer covers every change up to `seen`, and where the next sleep starts.
type Looked = (Vec<BatchId>, Judged, bool, Seen);

/// Where a sleep starts: the head every change up to which the look saw, and the mark taken
/// before the feed's pages it read, if it read them (`Offer::read_after`).
#[derive(Clone, Copy)]
struct Seen {
    head: Seq,
    read_after: Option<AnnouncementMark>,
}

impl From<Seq> for Seen {
    fn from(head: Seq) -> Self {
        Self { head, read_after: None }
    }
}

impl<C: Component> Watcher<'_, C> {
    /// What the index offers now (nothing when held or when a heartbeat pass asks itself),
    /// whether it had caught up with the store's head the answer is as of, and that head
    /// (`seen`: every change up to it is in the answer). `woke`: the head the sleep read
    /// after whatever woke it, if it read one. Reads the head only where the answer needs it
    /// before the look: a look that follows what it holds by the change feed answers as of
    /// the feed's head (one round trip fewer a stage over PostgreSQL or HTTP).
    async fn look(&mut self, woke: Option<Seq>, heartbeat_due: bool) -> Result<Looked, RunError> {
        let mut woke = woke;
        // The steering is read when the one last seen may hold the component, and while
        // batches wait for a pool slot: no claim reaches the store then to answer a pool's
        // new size (or a hold) in its stead.
        if heartbeat_due || self.waiting_since.is_some() || self.runner.may_be_held() {
            // The head before the steering: a resume after the read moves the head past it.
            let seen = match woke {
                Some(head) => head,
                None => self.store.head().await?,
            };
            if heartbeat_due {
                // The heartbeat's pass asks the index itself; what the watcher held is
                // dropped, so the next look asks the index in full and no drift outlives a
                // heartbeat.
                self.offers.forget();
                let asked = Instant::now();
                let covered = self.index.covers(seen, INDEX_WAIT).await?;
                debug!(covered_in = ?asked.elapsed(), "asked the index");
                return Ok((Vec::new(), Judged::new(), covered, seen.into()));
            }
            if let Some(held) = self.runner.held().await? {
                // Held: no pass (it would claim nothing) until the steering changes, which
                // moves the head and wakes the wait below, or the heartbeat (which reports
                // the hold).
                debug!("held, not looking for work: {held}");
                return Ok((Vec::new(), Judged::new(), true, seen.into()));
            }
            woke = Some(seen);
        }
        // Every watcher woke on the same change; with an embedded index another process
        // may be writing it. Past the bound the pass's store re-check is the safety net,
        // and the index is asked again rather than slept on: nothing else might move the
        // store, and the work it holds back would wait for a heartbeat.
        let asked = Instant::now();
        // Between the index's full answers, the batches the change feed names since.
        let ports = feed::Ports { store: self.store.as_ref(), index: self.index.as_ref() };
        let triggers = self.runner.candidate_triggers();
        let offer = self.offers.offer(&ports, &triggers, woke, Timestamp::now()).await?;
        debug!(offered = offer.ids.len(), asked = offer.asked, from_feed = offer.from_feed, refreshed = offer.refreshed,
            direct = offer.direct, changed = offer.changed, looked_in = ?asked.elapsed(), "looked for work");
        let judged = self.runner.judged_ready(offer.summaries.values());
        Ok((offer.ids, judged, offer.covered, Seen { head: offer.seen, read_after: offer.read_after }))
    }

    /// One pass: over what the index offered, or a heartbeat's over what it finds itself.
    /// Breaks with the exit code when the pass ends the watch; else how many batches it
    /// took up.
    async fn pass(
        &mut self,
        offered: Vec<BatchId>,
        judged: Judged,
        heartbeat_due: bool,
    ) -> Result<ControlFlow<u8, usize>, RunError> {
        debug!(offered = offered.len(), heartbeat_due, "starting a pass");
        self.last_pass = Some(Instant::now());
        // A heartbeat asks the index itself; otherwise the pass takes what it was offered.
        let selection = if heartbeat_due { Selection::Ready } else { Selection::Offered(offered, judged) };
        let (handled, look_again_soon) = match pass_verdict(pass(self.runner, &selection).await, &mut self.worst) {
            PassEnd::Stop(code) => return Ok(ControlFlow::Break(code)),
            PassEnd::Error(e) => return Err(e),
            PassEnd::Refused(reason) => {
                // Refused passes take nothing up: no batch may be handed to this watcher.
                self.runner.withdraw_offer().await;
                self.runner.release_handed().await;
                // Said once: the watcher stays up and tries again at the next offer or
                // heartbeat, which starts again once the contract is mended.
                if self.refused.as_ref() != Some(&reason) {
                    error!(
                        "pass not started; staying up and trying again at each change offered and each heartbeat \
                         ({:?}): {reason}",
                        self.heartbeat
                    );
                    self.refused = Some(reason);
                }
                (0, false)
            }
            PassEnd::Continue { handled, waiting, busy } => {
                if let Some(reason) = self.refused.take() {
                    // At the refusal's level's neighbour: whoever read that must read this.
                    warn!("passes start again: the refusal no longer holds ({reason})");
                }
                // A deferring watcher sleeps on a timer, not in the change feed: it takes no
                // hand-ons meanwhile (the turn's holder does).
                if busy {
                    self.deferral.met_busy_turn(Instant::now());
                    self.runner.withdraw_offer().await;
                } else {
                    self.deferral.got_turn();
                    self.runner.offer_to_take().await;
                }
                (handled, waiting > 0)
            }
        };
        if heartbeat_due {
            self.runner.flush_reports(true).await?;
        }
        self.waiting_since = match (look_again_soon, self.waiting_since) {
            (false, _) => None,
            (true, None) => Some(Instant::now()),
            (true, since) => since,
        };
        Ok(ControlFlow::Continue(handled))
    }

    /// A taker's wake: the runs the store handed it (read when its handle heard of one or
    /// cannot tell, or `read` says so), taken up if there are any; what arrived meanwhile is
    /// then looked for from the store's head after them (`woke_at` dropped). The exit code
    /// when the pass ends the watch or a shutdown came meanwhile.
    async fn take_up_handed(
        &mut self,
        read: bool,
        woke_at: &mut Option<Seq>,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Option<u8>, RunError> {
        let handed = match read && self.runner.may_have_handed_runs() {
            true => self.runner.find_handed().await?,
            false => self.runner.handed_now().await?,
        };
        if !handed {
            return Ok(None);
        }
        *woke_at = None;
        match self.take_up().await? {
            ControlFlow::Break(code) => Ok(Some(code)),
            ControlFlow::Continue(()) => Ok((*shutdown.borrow()).then_some(self.worst)),
        }
    }

    /// A taker's pass over the runs the store handed it (`Selection::Handed`); breaks with the
    /// exit code when the pass ends the watch.
    async fn take_up(&mut self) -> Result<ControlFlow<u8>, RunError> {
        match pass_verdict(pass(self.runner, &Selection::Handed).await, &mut self.worst) {
            PassEnd::Stop(code) => Ok(ControlFlow::Break(code)),
            PassEnd::Error(e) => Err(e),
            PassEnd::Refused(_) => {
                // It works nothing it is handed until its passes start again.
                self.runner.withdraw_offer().await;
                self.runner.release_handed().await;
                Ok(ControlFlow::Continue(()))
            }
            PassEnd::Continue { .. } => Ok(ControlFlow::Continue(())),
        }
    }

    /// A deferring watcher's retry, before any store read: if the lock service says by a
    /// read that the component's turn is still held elsewhere, the watcher defers again
    /// without looking (at 2,000 workers each deferred look was a store feed read, the
    /// store's main load: docs/capacity.md). So does a watcher woken in the change feed after
    /// it went back there from a deferral (`Deferral::has_deferred`): at 2,000 workers the
    /// watchers whose retries had found the turn free between two of its holder's passes
    /// each looked at every change after, finding nothing the holder had not taken (a look
    /// is a horizon and a feed page), and never deferred again. A heartbeat still runs its
    /// pass. A shutdown requested meanwhile (the read may wait for a lock service
    /// reconnecting) answers `Held`: `defer` then sees the request at once.
    async fn still_deferring(&mut self, shutdown: &mut watch::Receiver<bool>) -> Retry {
        let heartbeat_due = self.last_pass.is_none_or(|at| at.elapsed() >= self.heartbeat);
        if heartbeat_due || !self.deferral.has_deferred() {
            return Retry::Look;
        }
        let held = tokio::select! {
            held = self.runner.turn_held_elsewhere() => held,
            _ = stop_requested(shutdown) => return Retry::Held,
        };
        match held {
            Some(true) => {
                // Back from the feed: the deferral goes on from the time deferred before.
                self.deferral.met_busy_turn(Instant::now());
                Retry::Held
            }
            Some(false) => Retry::Free,
            None => Retry::Look,
        }
    }

    /// The longest the next sleep may last: until the heartbeat, a pool retry, results due
    /// to the registry, the kept turn due back, and at most `LONGEST_WAIT`.
    fn wait_bound(&self) -> Duration {
        let results_due = self.runner.results_due_in();
        let until_heartbeat = self.heartbeat.saturating_sub(self.last_pass.map_or(Duration::ZERO, |at| at.elapsed()));
        until_heartbeat
            .min(LONGEST_WAIT)
            .min(self.waiting_since.map_or(LONGEST_WAIT, |since| pool_retry_after(since.elapsed())))
            .min(results_due.unwrap_or(LONGEST_WAIT))
            .min(self.runner.turn_due_in().unwrap_or(LONGEST_WAIT))
    }

    /// Sleeps in the store's change feed from `seen` until a change concerns the component
    /// (an append of a type its triggers read or of its own type, or a change that concerns
    /// everyone: see `Trigger::interest`), the heartbeat, a pool retry or results due to the
    /// registry; breaks with the exit code on shutdown. The commits of other stages do not
    /// wake it: they cannot make a batch ready for it. A watcher deferring to another pass of
    /// its component sleeps as `defer` says instead. Answers the head read at the wake, if
    /// the sleep read one.
    async fn sleep(
        &self,
        seen: Seen,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<ControlFlow<u8, Option<Seq>>, RunError> {
        if self.deferral.is_deferring() {
            return Ok(match self.defer(shutdown).await? {
                ControlFlow::Break(code) => ControlFlow::Break(code),
                ControlFlow::Continue(()) => ControlFlow::Continue(None),
            });
        }
        // About to sleep: results already recorded go to the registry once a second's worth
        // has passed since its last write, and the sleep ends by then.
        self.runner.flush_reports(false).await?;
        let wait = self.wait_bound();
        let interest = self.runner.change_interest();
        // A taker is woken by a run handed to it as well.
        let taker = self.runner.taker_liveness();
        let woken = async {
            match &taker {
                Some(liveness) => {
                    let name = self.runner.name();
                    self.store.wait_as_taker(seen.head, seen.read_after, &interest, name, liveness, wait).await
                }
                None => self.store.wait_for_concerning_change(seen.head, seen.read_after, &interest, wait).await,
            }
        };
        tokio::select! {
            // A change that concerns it wakes it without a head read: the look's feed read
            // answers its own head.
            head = woken => {
                let head = head?;
                match head {
                    None => debug!("a change concerning it"),
                    Some(head) if head > seen.head => debug!(?head, "the store moved"),
                    Some(_) => {}
                }
                Ok(ControlFlow::Continue(head))
            }
            _ = stop_requested(shutdown) => {
                info!("stopping: no pass running");
                Ok(ControlFlow::Break(self.worst))
            }
        }
    }

    /// A watcher deferring to another pass of its component (it found the poll lock held at
    /// every try since its deferral began) is not woken by changes at all, only by its retry:
    /// the holder is a watcher woken by the same changes (or a pass that ends), so waking
    /// every other watcher of the component for each change only had them all look and find
    /// the lock busy, a herd of store reads (docs/capacity.md). The retry is the bound on how
    /// long work waits if the holder stops: within a quarter of the time deferred, 0.5-10 s.
    /// Breaks with the exit code on shutdown.
    async fn defer(&self, shutdown: &mut watch::Receiver<bool>) -> Result<ControlFlow<u8>, RunError> {
        self.runner.flush_reports(false).await?;
        let wait = self.wait_bound().min(self.deferral.retry_after(Instant::now()));
        debug!(?wait, "another pass holds the poll lock; deferring to it");
        tokio::select! {
            _ = tokio::time::sleep(wait) => Ok(ControlFlow::Continue(())),
            _ = stop_requested(shutdown) => {
                info!("stopping: no pass running");
                Ok(ControlFlow::Break(self.worst))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_a_slot_is_retried_within_a_quarter_of_its_length_between_the_bounds() {
        assert_eq!(pool_retry_after(Duration::ZERO), POOL_RETRY_FIRST);
        assert_eq!(pool_retry_after(Duration::from_secs(8)), Duration::from_secs(2));
        assert_eq!(pool_retry_after(Duration::from_secs(3600)), POOL_RETRY_MAX);
    }
}
