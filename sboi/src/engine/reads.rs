//! What the committed index answers, read from its last commit with no writer: the batches
//! ready for a trigger, each selection's size, a page of a selection, and the documents
//! themselves. Apart from writing (catch-up, rebuild) and from the fresh answers built on it.

use std::ops::Bound;

use autocomp_model::{BatchId, Selection, Timestamp, Trigger};
use tantivy::collector::TopDocs;
use tantivy::collector::sort_key::SortByStaticFastValue;
use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, RangeQuery};
use tantivy::schema::Value;
use tantivy::{DocAddress, Order, Searcher, TantivyDocument, Term};

use super::{IndexEngine, IndexResult, Snapshot};
use crate::browse::{MAX_PAGE, Page, PageKey, PageOrder, PageRequest, Tally};
use crate::document::IndexedBatch;
use crate::query::{BlockedBy, selection_query, trigger_query};

impl IndexEngine {
    /// The batches the committed index holds ready for `trigger` at store time `now`, in
    /// trigger order (priority descending, then oldest first), limited.
    pub fn query_at(&self, trigger: &Trigger, now: Timestamp) -> IndexResult<Vec<BatchId>> {
        self.query_with(trigger, now, BlockedBy::Absent)
    }

    /// `query_at` with `blocked_by` in the shape given: the benchmark times the old shape
    /// beside the new on one index. Not for production use.
    #[doc(hidden)]
    pub fn query_with(&self, trigger: &Trigger, now: Timestamp, blocked_by: BlockedBy) -> IndexResult<Vec<BatchId>> {
        if trigger.limit == Some(0) {
            return Ok(Vec::new());
        }
        let snapshot = self.snapshot()?;
        let limit = trigger.limit.unwrap_or(usize::MAX);
        let hits = self.search(&snapshot, trigger, now, limit, blocked_by)?;
        self.ids_of(&snapshot.searcher, hits.into_iter())
    }

    /// The documents of `snapshot` ready for `trigger`, in trigger order, at most `limit`
    /// (at least one).
    pub(super) fn search(
        &self,
        snapshot: &Snapshot,
        trigger: &Trigger,
        now: Timestamp,
        limit: usize,
        blocked_by: BlockedBy,
    ) -> IndexResult<Vec<DocAddress>> {
        let searcher = &snapshot.searcher;
        // Never more than the index holds: tantivy sizes its collector by the limit, and a
        // trigger's limit may be any number a config or a request body spells.
        let limit = limit.clamp(1, (searcher.num_docs() as usize).max(1));
        let order = (
            (SortByStaticFastValue::<i64>::for_field("priority"), Order::Desc),
            (SortByStaticFastValue::<i64>::for_field("created_seq"), Order::Asc),
        );
        let query = trigger_query(&self.fields, trigger, now, &snapshot.vocabulary, blocked_by);
        let hits = searcher.search(&query, &TopDocs::with_limit(limit).order_by(order)).map_err(|e| self.fail(e))?;
        Ok(hits.into_iter().map(|(_, address)| address).collect())
    }

    /// Reads ids from the stored documents: a hit's stored document is one cached block
    /// read, where the `id` fast column decodes a dictionary block per hit (12x slower,
    /// measured in the index benchmark).
    fn ids_of(&self, searcher: &Searcher, addresses: impl Iterator<Item = DocAddress>) -> IndexResult<Vec<BatchId>> {
        addresses
            .map(|address| {
                let document: TantivyDocument = searcher.doc(address).map_err(|e| self.fail(e))?;
                let id = document.get_first(self.fields.id).and_then(|v| v.as_str());
                let id = id.ok_or_else(|| self.fail("a document has no id"))?;
                BatchId::new(id).map_err(|e| self.fail(e))
            })
            .collect()
    }

    /// Each selection's size in the committed index at store time `now`, and with `quietest`
    /// the last activity of its quietest batch (that costs a read per selected batch).
    pub fn tally_at(&self, selections: &[Selection], now: Timestamp, quietest: bool) -> IndexResult<Vec<Tally>> {
        let searcher = self.searcher()?;
        self.bitsets.tally(&searcher, &self.fields, selections, now, quietest).map_err(|e| self.fail(e))
    }

    /// One page of a selection at store time `now`, after `request.after` in its order.
    pub fn page_at(&self, request: &PageRequest, now: Timestamp) -> IndexResult<Page> {
        let Snapshot { searcher, vocabulary, .. } = self.snapshot()?;
        let limit = request.limit.min(MAX_PAGE);
        if limit == 0 {
            return Ok(Page { batches: Vec::new(), next: None });
        }
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, selection_query(&self.fields, &request.selection, now, &vocabulary))];
        if let Some(after) = request.after {
            clauses.push((Occur::Must, self.after_key(request.order, after)));
        }
        let query = BooleanQuery::new(clauses);
        // One more than the page, to know whether another follows.
        let want = (limit + 1).min((searcher.num_docs() as usize).max(1));
        let created = (SortByStaticFastValue::<i64>::for_field("created_seq"), Order::Asc);
        let addresses: Vec<DocAddress> = match request.order {
            PageOrder::Oldest => {
                let hits = searcher.search(&query, &TopDocs::with_limit(want).order_by(created));
                hits.map_err(|e| self.fail(e))?.into_iter().map(|(_, a)| a).collect()
            }
            PageOrder::Priority => {
                let priority = (SortByStaticFastValue::<i64>::for_field("priority"), Order::Desc);
                let hits = searcher.search(&query, &TopDocs::with_limit(want).order_by((priority, created)));
                hits.map_err(|e| self.fail(e))?.into_iter().map(|(_, a)| a).collect()
            }
        };
        let more = addresses.len() > limit;
        let mut batches = Vec::with_capacity(limit);
        let mut last = None;
        for address in addresses.into_iter().take(limit) {
            let document: TantivyDocument = searcher.doc(address).map_err(|e| self.fail(e))?;
            let summary = self.fields.summary(&document);
            last = Some(PageKey { priority: summary.priority, created_seq: summary.created_seq });
            batches.push(BatchId::new(summary.id).map_err(|e| self.fail(e))?);
        }
        Ok(Page { batches, next: if more { last } else { None } })
    }

    /// The batches after `key` in `order` (keyset pagination: no offset to count).
    fn after_key(&self, order: PageOrder, key: PageKey) -> Box<dyn Query> {
        let later = |field, value: i64| -> Box<dyn Query> {
            Box::new(RangeQuery::new(Bound::Excluded(Term::from_field_i64(field, value)), Bound::Unbounded))
        };
        let created_after = later(self.fields.created_seq, key.created_seq);
        match order {
            PageOrder::Oldest => created_after,
            PageOrder::Priority => {
                let priority = |bound: (Bound<Term>, Bound<Term>)| -> Box<dyn Query> {
                    Box::new(RangeQuery::new(bound.0, bound.1))
                };
                let at = Term::from_field_i64(self.fields.priority, key.priority);
                let lower = priority((Bound::Unbounded, Bound::Excluded(at.clone())));
                let same = priority((Bound::Included(at.clone()), Bound::Included(at)));
                let same_and_later =
                    Box::new(BooleanQuery::new(vec![(Occur::Must, same), (Occur::Must, created_after)]));
                Box::new(BooleanQuery::new(vec![(Occur::Should, lower), (Occur::Should, same_and_later)]))
            }
        }
    }

    /// Every document in the committed index, sorted by id (for checks and `explain`).
    pub fn dump(&self) -> IndexResult<Vec<IndexedBatch>> {
        let searcher = self.searcher()?;
        let limit = (searcher.num_docs() as usize).max(1);
        let hits = searcher
            .search(&AllQuery, &TopDocs::with_limit(limit).order_by_string_fast_field("id", Order::Asc))
            .map_err(|e| self.fail(e))?;
        hits.into_iter()
            .map(|(_, address)| {
                let document: TantivyDocument = searcher.doc(address).map_err(|e| self.fail(e))?;
                Ok(self.fields.summary(&document))
            })
            .collect()
    }

    /// What the index holds for one batch, if anything.
    pub fn get(&self, id: &BatchId) -> IndexResult<Option<IndexedBatch>> {
        let searcher = self.searcher()?;
        let query = tantivy::query::TermQuery::new(self.fields.id_term(id), tantivy::schema::IndexRecordOption::Basic);
        let hits = searcher.search(&query, &TopDocs::with_limit(1).order_by_score()).map_err(|e| self.fail(e))?;
        match hits.first() {
            Some((_, address)) => {
                let document: TantivyDocument = searcher.doc(*address).map_err(|e| self.fail(e))?;
                Ok(Some(self.fields.summary(&document)))
            }
            None => Ok(None),
        }
    }

    pub fn num_docs(&self) -> IndexResult<u64> {
        Ok(self.searcher()?.num_docs())
    }
}
