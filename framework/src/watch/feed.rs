//! What a watcher offers from the store's change feed: for each question a pass asks the
//! index (`Runner::candidate_triggers`: the trigger, then the retry trigger, each limited),
//! the batches of the index's last full answer, kept with their summaries and corrected
//! look after look by the batches the feed names since, each judged by the model
//! (`Trigger::matches_at`), as sboi's fresh path corrects a commit. A look reads the feed
//! once and the changed batches' summaries once, and asks the index nothing while that
//! answer is exact.
//!
//! Why the answer is `Trigger::select` at the feed's head. For each trigger the watcher
//! holds the batches that match it *unsettled* (without `settled_for`, its one clause that
//! time alone changes, and without its limit), with their summaries, every one of them up
//! to a *reach* in trigger order: all of them, or all up to the last batch of the index's
//! answer (asked for `depth` of them) still unchanged. A batch the feed names is taken out
//! and judged again on the summary the store holds now; one it does not name is as the
//! summary held says. So the ready batches within the reach are exactly the held ones the
//! whole trigger matches at `now` (a summary held unchanged judged at a later `now` is that
//! batch judged now), and every ready batch past the reach comes after them in trigger
//! order: when at least `limit` are within it, or the reach is everything, the first
//! `limit` are `select`'s answer, in its order (priority, then oldest). A pass claims in
//! that order, as it claims the index's.
//!
//! The index is asked in full, exactly when the held answer could not be exact:
//! - nothing is held: the first look, the first after a heartbeat (which drops what is
//!   held, so no drift outlives one), after a look that failed, after the index had not
//!   reached the store's head (`covers`), or when the trigger itself changed;
//! - the feed names more than `MAX_FEED_BATCHES` batches since the last look (the watcher
//!   fell behind: reading them would cost more than asking);
//! - a trigger has fewer than its `limit` ready within its reach while the reach is not
//!   everything: it may be missing more (typically once a pass took what it was offered
//!   from a backlog); that trigger alone is asked again.
//!
//! A trigger whose fresh full answer cannot answer exactly either (batches not yet settled
//! fill its reach: a burst under a debounce, many transient failures waiting out their
//! backoff) is asked of the index at every look, as before, until the next heartbeat.
//!
//! Like sboi's fresh path, a summary read after the feed may show a later change of its
//! batch (the next look reads that change and judges it again). A full answer the index
//! gave from behind the store's head (`BatchIndex::query_checked`: a service past the
//! changes it corrects) is not held: that trigger is asked directly, and in full again at
//! the next look.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use autocomp_model::{BatchId, BatchSummary, Seq, SummaryAt, Timestamp, Trigger};
use autocomp_sboi::BatchIndex;
use autocomp_store::{AnnouncementMark, ObjectStore};
use tracing::debug;

use super::INDEX_WAIT;
use crate::exit::RunError;

/// Most batches the feed may name since the last look before the index is asked instead.
const MAX_FEED_BATCHES: usize = 2_000;
/// Changes per feed read.
const FEED_PAGE: usize = 1_000;
/// Batches per `get_summaries` read (the stores take up to 10,000).
const SUMMARY_PAGE: usize = 1_000;
/// A full answer asks for this many times a trigger's limit (`Runner::candidate_triggers`:
/// four times the batches a pass claims): the passes that take from a backlog follow it a
/// while before the index is asked again.
pub(super) const DEPTH_FACTOR: usize = 2;
/// Fewest batches a full answer asks for: a trickle's whole ready set fits, so its reach
/// is everything and no pass of it needs the index again.
pub(super) const MIN_DEPTH: usize = 64;
/// Most batches held for one trigger; past it only the first `MIN_DEPTH * 4` are kept (the
/// reach shrinks to the last of them).
const MAX_HELD: usize = 20_000;

/// Trigger order as a key: priority descending, then oldest first (the model's `order_key`,
/// which takes a whole `Batch`; `created_seq` is unique per batch).
type OrderKey = (Reverse<i32>, i64);

fn key_of(summary: &BatchSummary) -> OrderKey {
    (Reverse(summary.priority), summary.created_seq.0)
}

/// What one look offers, and what it cost.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Offer {
    /// The candidates in the order a pass claims them: each trigger's answer in turn,
    /// without repeats, as `Runner::candidates` gives the index's.
    pub ids: Vec<BatchId>,
    /// Whether every store change up to the head the look was asked about is in the answer.
    pub covered: bool,
    /// The store's head the answer is as of: the feed's, read by the look, or the one it was
    /// given or read first (a later change wakes the next look).
    pub seen: Seq,
    /// Taken before the feed's pages, when the look read them: every change they did not
    /// show is announced after it (a sleep from `seen` wakes for those alone).
    pub read_after: Option<AnnouncementMark>,
    /// Index queries this look asked: full answers and direct questions.
    pub asked: usize,
    /// Triggers answered from what the watcher held (corrected by the feed).
    pub from_feed: usize,
    /// Triggers answered from a full answer of the index asked in this look.
    pub refreshed: usize,
    /// Triggers answered by the index directly (the held answer could not be exact).
    pub direct: usize,
    /// Batches the feed named since the last look.
    pub changed: usize,
    /// The summary each offered batch was judged on, for those the watcher holds one of
    /// (its `changed_seq` is what a claim of it goes by).
    pub summaries: HashMap<BatchId, BatchSummary>,
}

/// How far in trigger order a held answer holds every batch matching its trigger unsettled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Everything,
    UpTo(OrderKey),
    /// Every batch of the index's answer changed since: no key is known to be covered.
    Nothing,
}

impl Reach {
    fn covers(&self, key: &OrderKey) -> bool {
        match self {
            Reach::Everything => true,
            Reach::UpTo(last) => key <= last,
            Reach::Nothing => false,
        }
    }
}

/// One trigger's answer as the watcher holds it (see the module's docs).
struct Held {
    /// The trigger without `settled_for` and `limit`: every held batch matches it.
    unsettled: Trigger,
    batches: BTreeMap<OrderKey, BatchSummary>,
    keys: HashMap<BatchId, OrderKey>,
    reach: Reach,
}

impl Held {
    fn new(unsettled: Trigger, reach: Reach) -> Self {
        Self { unsettled, batches: BTreeMap::new(), keys: HashMap::new(), reach }
    }

    /// The batch `id` changed; `now` is its summary as the store holds it (`None`: gone).
    fn change(&mut self, id: &BatchId, now: Option<&BatchSummary>, at: Timestamp) {
        if let Some(key) = self.keys.remove(id) {
            self.batches.remove(&key);
        }
        let Some(summary) = now else { return };
        let key = key_of(summary);
        // The unsettled trigger has no clause time changes: `at` decides nothing here.
        if self.reach.covers(&key) && self.unsettled.matches_at(&SummaryAt { summary, at }, at) {
            self.keys.insert(summary.id.clone(), key);
            self.batches.insert(key, summary.clone());
        }
        if self.batches.len() > MAX_HELD {
            self.shrink(MIN_DEPTH * 4);
        }
    }

    /// Keeps the first `kept` batches: every one up to the last kept is still held.
    fn shrink(&mut self, kept: usize) {
        let Some(last) = self.batches.keys().nth(kept.saturating_sub(1)).copied() else { return };
        let dropped = self.batches.split_off(&(last.0, last.1 + 1));
        for summary in dropped.values() {
            self.keys.remove(&summary.id);
        }
        self.reach = Reach::UpTo(last);
    }

    /// `trigger`'s answer at `now` if what is held makes it exact (see the module's docs).
    fn answer(&self, trigger: &Trigger, now: Timestamp) -> Option<Vec<BatchId>> {
        let limit = trigger.limit.unwrap_or(usize::MAX);
        let ready: Vec<BatchId> = self
            .batches
            .values()
            .filter(|summary| trigger.matches_at(&SummaryAt { summary, at: now }, now))
            .take(limit)
            .map(|summary| summary.id.clone())
            .collect();
        (self.reach == Reach::Everything || ready.len() >= limit).then_some(ready)
    }
}

/// How the watcher answers one trigger.
enum Following {
    /// Nothing held yet: the next look asks the index in full.
    Unknown,
    Held(Box<Held>),
    /// Its fresh full answer could not answer: asked of the index at each look until the
    /// next heartbeat.
    Asked,
}

/// What is held between looks.
struct State {
    /// The feed is read on from here: every change up to it is in what is held.
    cursor: Seq,
    /// One per trigger, in `Runner::candidate_triggers` order.
    triggers: Vec<Following>,
}

impl State {
    /// The summary held of `id`, by whichever trigger holds it.
    fn summary_of(&self, id: &BatchId) -> Option<&BatchSummary> {
        self.triggers.iter().find_map(|following| match following {
            Following::Held(held) => held.keys.get(id).and_then(|key| held.batches.get(key)),
            _ => None,
        })
    }
}

/// The store and the index a watcher asks.
pub(super) struct Ports<'a> {
    pub store: &'a dyn ObjectStore,
    pub index: &'a dyn BatchIndex,
}

/// A watcher's offers between the index's answers (see the module's docs).
pub(super) struct FeedOffers {
    /// A full answer asks for this many times a trigger's limit, so that a few passes
    /// taking from a backlog can follow before the next one...
    depth_factor: usize,
    /// ...and for at least this many.
    min_depth: usize,
    /// `None`: the next look asks the index in full.
    state: Option<State>,
}

/// One look in progress: where it asks, its store time, and what it found so far.
struct Look<'a> {
    ports: &'a Ports<'a>,
    now: Timestamp,
    /// Whether the index was found to answer as of the state's cursor (`covers`), once asked.
    reaches_cursor: Option<bool>,
    offer: Offer,
}

impl FeedOffers {
    pub(super) fn new(depth_factor: usize, min_depth: usize) -> Self {
        Self { depth_factor: depth_factor.max(1), min_depth: min_depth.max(1), state: None }
    }

    /// Drops what is held: the next look asks the index in full (after a heartbeat).
    pub(super) fn forget(&mut self) {
        self.state = None;
    }

    /// The candidates for `triggers` (`Runner::candidate_triggers`) at store time `now`, and
    /// the store's head they are as of (`Offer::seen`: a later change wakes the next look).
    /// `woke`: a head read since the last look (after whatever woke the watcher), which the
    /// answer covers at least; without it a look that follows the feed answers as of the
    /// feed's head, one that asks the index in full reads the head first. On an error
    /// nothing is held any more.
    pub(super) async fn offer(
        &mut self,
        ports: &Ports<'_>,
        triggers: &[Trigger],
        woke: Option<Seq>,
        now: Timestamp,
    ) -> Result<Offer, RunError> {
        let mut look = Look { ports, now, reaches_cursor: None, offer: Offer { covered: true, ..Offer::default() } };
        let mut held = self.state.take().filter(|state| state.triggers.len() == triggers.len());
        let read_after = match held {
            Some(_) => ports.store.announcement_mark().await,
            None => None,
        };
        if let Some(state) = &mut held
            && !correct(state, &mut look).await?
        {
            held = None;
        }
        let mut state = match held {
            Some(state) => {
                // The feed was read to its head, after `woke` was: every change up to it is
                // judged below.
                look.offer.seen = state.cursor;
                look.offer.read_after = read_after;
                state
            }
            None => {
                // Nothing to correct: the index's full answers, as of the head at least.
                let seen = match woke {
                    Some(head) => head,
                    None => ports.store.head().await?,
                };
                look.offer.seen = seen;
                if !ports.index.covers(seen, INDEX_WAIT).await? {
                    debug!(?seen, "the index did not reach the store's head in time; asking it as it is");
                    look.offer.covered = false;
                    let ids = ask_each(ports.index, triggers, &mut look.offer).await?;
                    look.offer.ids = ids;
                    return Ok(look.offer);
                }
                look.reaches_cursor = Some(true);
                State { cursor: seen, triggers: triggers.iter().map(|_| Following::Unknown).collect() }
            }
        };
        let mut answers = Vec::with_capacity(triggers.len());
        for (trigger, following) in triggers.iter().zip(&mut state.triggers) {
            answers.push(self.answer(trigger, following, state.cursor, &mut look).await?);
        }
        for id in answers.into_iter().flatten() {
            if !look.offer.ids.contains(&id) {
                if let Some(summary) = state.summary_of(&id) {
                    look.offer.summaries.insert(id.clone(), summary.clone());
                }
                look.offer.ids.push(id);
            }
        }
        self.state = Some(state);
        Ok(look.offer)
    }

    /// One trigger's answer: from what is held when exact, else from a fresh full answer
    /// (as of `cursor`), else from the index directly.
    async fn answer(
        &self,
        trigger: &Trigger,
        following: &mut Following,
        cursor: Seq,
        look: &mut Look<'_>,
    ) -> Result<Vec<BatchId>, RunError> {
        let unsettled = Trigger { settled_for: None, limit: None, ..trigger.clone() };
        if let Following::Held(held) = following {
            if held.unsettled != unsettled {
                *following = Following::Unknown;
            } else if let Some(ids) = held.answer(trigger, look.now) {
                look.offer.from_feed += 1;
                return Ok(ids);
            }
        }
        let reaches_cursor = match look.reaches_cursor {
            Some(reaches) => reaches,
            None => *look.reaches_cursor.insert(look.ports.index.covers(cursor, INDEX_WAIT).await?),
        };
        if !reaches_cursor {
            // Held answers stay held; this one comes from the index as it is, once.
            look.offer.covered = false;
        } else if !matches!(following, Following::Asked) {
            let depth = trigger.limit.map_or(usize::MAX, |limit| limit.saturating_mul(self.depth_factor));
            let depth = depth.max(self.min_depth);
            match full_answer(unsettled, depth, cursor, look).await? {
                Some(held) => {
                    let answer = held.answer(trigger, look.now);
                    *following = Following::Held(Box::new(held));
                    if let Some(ids) = answer {
                        look.offer.refreshed += 1;
                        return Ok(ids);
                    }
                    debug!("batches not yet settled fill the index's answer; asking it directly until the heartbeat");
                    *following = Following::Asked;
                }
                // Asked again in full at the next look.
                None => *following = Following::Unknown,
            }
        }
        look.offer.direct += 1;
        look.offer.asked += 1;
        Ok(look.ports.index.query(trigger).await?)
    }
}

/// Brings what is held up to the feed's head: one read of the feed, one of the changed
/// batches' summaries, each judged for every trigger. False (nothing corrected) when the
/// feed names more than `MAX_FEED_BATCHES` batches.
async fn correct(state: &mut State, look: &mut Look<'_>) -> Result<bool, RunError> {
    let store = look.ports.store;
    // Each changed batch with its summary as the newest page naming it read it (`None`: it is
    // gone), in the order the feed first named them.
    let (mut summaries, mut changed): (HashMap<BatchId, Option<BatchSummary>>, Vec<BatchId>) =
        (HashMap::new(), Vec::new());
    // Where the next page starts, and the horizon of the first page: the cursor moves no
    // further, since a store's horizon may lag its present (PostgreSQL's look never waits
    // for a writer in flight) and a page past it may miss a change still in flight; what the
    // later pages named is named again by the next look.
    let (mut from, mut horizon) = (state.cursor, None);
    let cursor = loop {
        // One more than may still be taken, to tell "exactly the bound" from "past it", a
        // page at a time (a PostgreSQL store reads a page of at most `FEED_PAGE`, with its
        // batches' summaries, in one statement).
        let limit = (MAX_FEED_BATCHES + 1 - changed.len()).min(FEED_PAGE);
        let (page, read) = store.changed_summaries(from, limit).await?;
        let horizon = *horizon.get_or_insert(page.head);
        let last = page.changes.last().map(|(seq, _)| *seq);
        let exhausted = page.changes.len() < limit;
        let mut read: HashMap<BatchId, BatchSummary> = read.into_iter().map(|s| (s.id.clone(), s)).collect();
        for (_, id) in page.changes {
            let now = read.remove(&id);
            if summaries.insert(id.clone(), now).is_none() {
                changed.push(id);
            }
        }
        if changed.len() > MAX_FEED_BATCHES {
            debug!(since = ?state.cursor, "the feed named too many batches since the last look; asking the index");
            return Ok(false);
        }
        match last {
            Some(last) if !exhausted => from = last.max(from),
            _ => break page.next.min(page.head).min(horizon).max(state.cursor),
        }
    };
    look.offer.changed = changed.len();
    for following in &mut state.triggers {
        if let Following::Held(held) = following {
            for id in &changed {
                held.change(id, summaries.get(id).and_then(Option::as_ref), look.now);
            }
        }
    }
    state.cursor = cursor;
    Ok(true)
}

/// The index's answer for `unsettled` (the first `depth`), held with its batches' summaries
/// as of `cursor`: the reach ends at the last batch unchanged since (`changed_seq`), whose
/// key the index ordered it by; the feed read on from `cursor` judges the others again.
/// `None` when a lagging index answered from behind the store's head (`query_checked`).
async fn full_answer(
    unsettled: Trigger,
    depth: usize,
    cursor: Seq,
    look: &mut Look<'_>,
) -> Result<Option<Held>, RunError> {
    let asked = Trigger { limit: (depth != usize::MAX).then_some(depth), ..unsettled.clone() };
    look.offer.asked += 1;
    let (ids, fresh) = look.ports.index.query_checked(&asked).await?;
    if !fresh {
        debug!("the index answered from behind the store's head; holding nothing of it");
        return Ok(None);
    }
    let summaries = summaries_of(look.ports.store, &ids).await?;
    let reach = if ids.len() < depth {
        Reach::Everything
    } else {
        summaries.iter().rev().find(|s| s.changed_seq <= cursor).map_or(Reach::Nothing, |s| Reach::UpTo(key_of(s)))
    };
    let mut held = Held::new(unsettled, reach);
    for summary in &summaries {
        held.change(&summary.id, Some(summary), look.now);
    }
    Ok(Some(held))
}

/// The summaries of `ids` the store has, in that order.
async fn summaries_of(store: &dyn ObjectStore, ids: &[BatchId]) -> Result<Vec<BatchSummary>, RunError> {
    let mut summaries = Vec::with_capacity(ids.len());
    for page in ids.chunks(SUMMARY_PAGE) {
        summaries.extend(store.get_summaries(page).await?);
    }
    Ok(summaries)
}

/// Each trigger's answer from the index, without repeats (what `Runner::candidates` asks).
async fn ask_each(index: &dyn BatchIndex, triggers: &[Trigger], offer: &mut Offer) -> Result<Vec<BatchId>, RunError> {
    let mut ids = Vec::new();
    for trigger in triggers {
        offer.asked += 1;
        offer.direct += 1;
        for id in index.query(trigger).await? {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

#[cfg(test)]
#[path = "feed_tests.rs"]
mod tests;
