//! Fresh answers with no commit on the query's path: the committed index's answer, corrected
//! by the batches the store changed after that commit's cursor, each evaluated by the model
//! (`Trigger::matches_at`) on its summary as the store holds it now.
//!
//! Why the two halves agree with `Trigger::select` at the feed's head: a batch the feed does
//! not name has not changed since the commit, so its document is its state now and the index
//! answers for it as the property tests hold it to; a batch the feed names is taken out of
//! the index's answer whatever its document says (new, changed, or with event types the
//! commit's vocabulary lacks) and judged by the model alone. Vocabulary growth thus touches
//! only changed batches: an unchanged batch holds no type its commit's vocabulary lacks.

use std::cmp::Reverse;
use std::collections::HashSet;

use autocomp_model::{BatchId, BatchSummary, Seq, SummaryAt, Timestamp, Trigger};
use autocomp_store::ObjectStore;
use tantivy::TantivyDocument;
use tantivy::schema::Value;

use super::{IndexEngine, IndexResult, Snapshot};
use crate::query::BlockedBy;

/// Most changes one read of the feed asks for (the stores refuse pages over 100,000).
const FEED_READ: usize = 50_000;

/// Trigger order as a sort key: priority descending, then oldest first (`order_key` of the
/// model, which takes a whole `Batch`; `created_seq` is unique per batch).
type OrderKey = (Reverse<i64>, i64);

/// The committed index as one commit left it, and the store's batches changed since: what a
/// fresh query corrects the index's answer with (`IndexEngine::corrections`). One read of
/// the store answers any number of triggers, all as of the same seq.
pub struct Corrections {
    snapshot: Snapshot,
    /// Every batch the feed named after the snapshot's cursor, up to `as_of`.
    changed: HashSet<BatchId>,
    /// Their summaries, read after the feed (a batch the store no longer has is left out).
    summaries: Vec<BatchSummary>,
    as_of: Seq,
}

impl Corrections {
    /// Every store change up to this seq is in answers built from these corrections.
    pub fn as_of(&self) -> Seq {
        self.as_of
    }

    /// The cursor of the commit read: every change up to it is in the committed index.
    pub fn committed(&self) -> Seq {
        self.snapshot.cursor
    }

    /// Batches changed after the commit, which answers take from the store.
    pub fn len(&self) -> usize {
        self.changed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.changed.is_empty()
    }
}

/// A fresh query's answer (`IndexEngine::query_fresh`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreshAnswer {
    /// The ready batches in trigger order (priority descending, then oldest first), limited:
    /// `Trigger::select` over the store's batches with every change up to `as_of`.
    pub batches: Vec<BatchId>,
    /// The head of the change feed when it was read. A batch changed later may show that
    /// change too (its summary is read after the feed), but none is missing an earlier one.
    pub as_of: Seq,
    /// The cursor of the commit whose documents answered for the unchanged batches.
    pub committed: Seq,
    /// Batches changed after that commit, evaluated from the store instead of the index.
    pub corrections: usize,
}

impl IndexEngine {
    /// The batches ready for `trigger` at store time `now` as of the store's head, without
    /// waiting for the index to commit the newest changes: the committed index's answer,
    /// corrected by the batches the store changed since (see the module's docs). `None` when
    /// more than `EngineOptions::max_corrections` batches changed: the index must catch up
    /// first. Reads the store (the feed, then the changed batches' summaries), never writes
    /// the index; the search runs on the calling thread, as `query_at`'s does.
    pub async fn query_fresh(
        &self,
        store: &dyn ObjectStore,
        trigger: &Trigger,
        now: Timestamp,
    ) -> IndexResult<Option<FreshAnswer>> {
        match self.corrections(store).await? {
            Some(corrections) => self.query_corrected(&corrections, trigger, now).map(Some),
            None => Ok(None),
        }
    }

    /// One consistent commit of the index (its documents and its cursor) and the store's
    /// batches changed after that cursor, for `query_corrected`; `None` when more than
    /// `EngineOptions::max_corrections` batches changed.
    pub async fn corrections(&self, store: &dyn ObjectStore) -> IndexResult<Option<Corrections>> {
        // The snapshot first: the feed must start at the cursor of the documents searched.
        let snapshot = self.snapshot()?;
        let Some((changed, as_of)) = self.changed_since(store, snapshot.cursor).await? else {
            return Ok(None);
        };
        let mut summaries = Vec::with_capacity(changed.len());
        for ids in changed.chunks(self.page_size()) {
            summaries.extend(store.get_summaries(ids).await?);
        }
        Ok(Some(Corrections { snapshot, changed: changed.into_iter().collect(), summaries, as_of }))
    }

    /// The seq a fresh query would be exact for now, without reading any summary; `None`
    /// when it would need more than `EngineOptions::max_corrections` corrections.
    pub async fn fresh_through(&self, store: &dyn ObjectStore) -> IndexResult<Option<Seq>> {
        let cursor = self.committed_cursor()?;
        Ok(self.changed_since(store, cursor).await?.map(|(_, as_of)| as_of))
    }

    /// `trigger`'s answer at store time `now` from `corrections` (see `query_fresh`).
    pub fn query_corrected(
        &self,
        corrections: &Corrections,
        trigger: &Trigger,
        now: Timestamp,
    ) -> IndexResult<FreshAnswer> {
        let Corrections { snapshot, changed, summaries, as_of } = corrections;
        let limit = trigger.limit.unwrap_or(usize::MAX);
        let mut batches = Vec::new();
        if limit > 0 {
            // Each changed batch takes at most one place from the index's answer: asking for
            // that many more keeps the first `limit` unchanged ones in it.
            let wanted = limit.saturating_add(changed.len());
            let addresses = self.search(snapshot, trigger, now, wanted, BlockedBy::Absent)?;
            let mut indexed = Vec::with_capacity(addresses.len());
            for address in addresses {
                let document: TantivyDocument = snapshot.searcher.doc(address).map_err(|e| self.fail(e))?;
                let id = document.get_first(self.fields.id).and_then(|v| v.as_str());
                let id =
                    BatchId::new(id.ok_or_else(|| self.fail("a document has no id"))?).map_err(|e| self.fail(e))?;
                if changed.contains(&id) {
                    continue;
                }
                let number = |field| document.get_first(field).and_then(|v| v.as_i64()).unwrap_or_default();
                indexed.push(((Reverse(number(self.fields.priority)), number(self.fields.created_seq)), id));
            }
            let mut corrected: Vec<(OrderKey, BatchId)> = summaries
                .iter()
                .filter(|summary| trigger.matches_at(&SummaryAt { summary, at: now }, now))
                .map(|summary| ((Reverse(i64::from(summary.priority)), summary.created_seq.0), summary.id.clone()))
                .collect();
            corrected.sort_by_key(|(key, _)| *key);
            batches = merge(indexed, corrected, limit);
        }
        Ok(FreshAnswer { batches, as_of: *as_of, committed: snapshot.cursor, corrections: changed.len() })
    }

    /// The batches the feed names after `cursor`, each once, and the head it was read to;
    /// `None` past `max_corrections`. Pages are read as a catch-up reads them: a batch that
    /// changes again while they are read moves to a later page, never out of the feed.
    async fn changed_since(&self, store: &dyn ObjectStore, cursor: Seq) -> IndexResult<Option<(Vec<BatchId>, Seq)>> {
        let bound = self.options.max_corrections;
        let (mut seen, mut changed) = (HashSet::new(), Vec::new());
        let mut from = cursor;
        loop {
            // One more than may still be taken, to tell "exactly the bound" from "past it".
            let limit = (bound.saturating_add(1) - changed.len()).min(FEED_READ);
            let page = store.changes(from, limit).await?;
            let exhausted = page.changes.len() < limit || page.next >= page.head;
            for (_, id) in page.changes {
                if seen.insert(id.clone()) {
                    changed.push(id);
                }
            }
            if changed.len() > bound {
                return Ok(None);
            }
            if exhausted {
                return Ok(Some((changed, page.next.max(from))));
            }
            from = page.next;
        }
    }
}

/// The first `limit` of two lists each in trigger order, in trigger order.
fn merge(indexed: Vec<(OrderKey, BatchId)>, corrected: Vec<(OrderKey, BatchId)>, limit: usize) -> Vec<BatchId> {
    let (mut indexed, mut corrected) = (indexed.into_iter().peekable(), corrected.into_iter().peekable());
    let mut merged = Vec::with_capacity(limit.min(indexed.len() + corrected.len()));
    while merged.len() < limit {
        let next = match (indexed.peek(), corrected.peek()) {
            (Some((a, _)), Some((b, _))) if b < a => corrected.next(),
            (Some(_), _) => indexed.next(),
            (None, _) => corrected.next(),
        };
        let Some((_, id)) = next else { break };
        merged.push(id);
    }
    merged
}
