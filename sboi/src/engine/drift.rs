//! Finding and fixing where the committed index differs from the store (the follower's
//! reconciliation): `drift` compares a page of the store's batches with the documents, and
//! `repair` rewrites or deletes what it found. Apart from the feed's catch-up, which it backs up.

use std::collections::HashMap;

use autocomp_model::{BatchId, BatchSummary, Seq};
use tantivy::TantivyDocument;
use tantivy::collector::DocSetCollector;

use super::{CommitPayload, IndexEngine, IndexResult, Snapshot, Unindexed};
use crate::document::IndexedBatch;
use crate::query::listing_page;

/// Where the index differs from one page of the store (`IndexEngine::drift`).
#[derive(Debug, Default)]
pub struct Drift {
    /// Batches whose document is missing or differs, and is not newer.
    stale: Vec<BatchSummary>,
    /// Documents of batches the store did not list.
    gone: Vec<BatchId>,
    listed_after: Seq,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        self.stale.is_empty() && self.gone.is_empty()
    }
}

/// What `IndexEngine::repair` changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Repaired {
    /// Documents written again from the store's batch.
    pub rewritten: usize,
    /// Documents of batches the store no longer has, deleted.
    pub deleted: usize,
}

impl IndexEngine {
    /// Compares one page of the store's batches with the committed index (reads only; see
    /// `repair`). `page` is what `list_summaries` returned after `after`, read after the store's
    /// head was `listed_after`; it covers the ids up to its last, or to the end with `to_end`.
    /// A document is stale when it differs from the page's batch, is not newer (a catch-up
    /// may have indexed a later version since the page was read) and the batch's change is
    /// one the index had already applied (a later one is the feed's to bring); it is gone when
    /// the page lacks its batch and it is not newer than `listed_after`.
    pub fn drift(
        &self,
        page: Vec<BatchSummary>,
        after: Option<&BatchId>,
        to_end: bool,
        listed_after: Seq,
    ) -> IndexResult<Drift> {
        // Read before the snapshot, which is then at least this new: every change up to it
        // is in the documents compared. A batch changed since is not drift but a change the
        // feed brings (and the catch-up rewrites its document whole anyway).
        let indexed_through = self.committed_cursor()?;
        let Snapshot { searcher, vocabulary, .. } = self.snapshot()?;
        let through = page.last().filter(|_| !to_end).map(|last| &last.id);
        let addresses =
            searcher.search(&listing_page(&self.fields, after, through), &DocSetCollector).map_err(|e| self.fail(e))?;
        let mut indexed: HashMap<String, IndexedBatch> = HashMap::with_capacity(addresses.len());
        for address in addresses {
            let document: TantivyDocument = searcher.doc(address).map_err(|e| self.fail(e))?;
            let summary = self.fields.summary(&document);
            indexed.insert(summary.id.clone(), summary);
        }
        let mut drift = Drift { listed_after, ..Drift::default() };
        for batch in page {
            match indexed.remove(batch.id.as_str()) {
                _ if batch.changed_seq > indexed_through => {}
                Some(held) if held.changed_seq > batch.changed_seq.0 => {}
                Some(held) if held == self.fields.summary(&self.fields.document(&batch, &vocabulary)) => {}
                _ => drift.stale.push(batch),
            }
        }
        drift.gone = indexed
            .into_values()
            .filter(|held| held.changed_seq <= listed_after.0)
            .map(|held| BatchId::new(held.id).map_err(|e| self.fail(e)))
            .collect::<IndexResult<_>>()?;
        Ok(drift)
    }

    /// Fixes what `drift` found, checked again against the index as committed now (it may
    /// have moved on since): rewrites stale documents, never over a newer one, deletes gone
    /// ones, and commits with the committed cursor. Holds the writer only for that.
    pub async fn repair(&self, drift: Drift) -> IndexResult<Repaired> {
        if drift.is_empty() {
            return Ok(Repaired::default());
        }
        let mut writer = self.wait_for_writer().await?;
        let CommitPayload { cursor, mut vocabulary, .. } = self.committed()?;
        let searcher = self.searcher()?;
        let held = |id: &BatchId| -> IndexResult<Option<IndexedBatch>> {
            let query =
                tantivy::query::TermQuery::new(self.fields.id_term(id), tantivy::schema::IndexRecordOption::Basic);
            let hits = searcher.search(&query, &DocSetCollector).map_err(|e| self.fail(e))?;
            match hits.into_iter().next() {
                Some(address) => Ok(Some(self.fields.summary(&searcher.doc(address).map_err(|e| self.fail(e))?))),
                None => Ok(None),
            }
        };
        let mut rewrite = Vec::new();
        for batch in drift.stale {
            match held(&batch.id)? {
                Some(held) if held.changed_seq > batch.changed_seq.0 => {}
                Some(held) if held == self.fields.summary(&self.fields.document(&batch, &vocabulary)) => {}
                _ => rewrite.push(batch),
            }
        }
        let mut delete = Vec::new();
        for id in drift.gone {
            if held(&id)?.is_some_and(|held| held.changed_seq <= drift.listed_after.0) {
                delete.push(id);
            }
        }
        let repaired = Repaired { rewritten: rewrite.len(), deleted: delete.len() };
        if repaired == Repaired::default() {
            self.release(writer).await?;
            return Ok(repaired);
        }
        if let Some(grown) = vocabulary.grown_by(&rewrite) {
            writer = self.rewrite_for(writer, cursor, &grown).await?;
            vocabulary = grown;
        }
        for id in &delete {
            writer.delete_term(self.fields.id_term(id));
        }
        writer = self.index_batches(writer, rewrite, &vocabulary, Unindexed::None).await?;
        writer = self.commit(writer, cursor, &vocabulary).await?;
        self.release(writer).await?;
        Ok(repaired)
    }
}
