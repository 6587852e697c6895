//! The index engine: one tantivy directory, caught up from any `ObjectStore`'s change feed.
//! The feed cursor rides in the commit payload, so documents and cursor are committed
//! together: a crash between steps re-applies a page (an idempotent upsert), never skips one.
//! One process writes at a time (tantivy's flock); the others read what is committed.

use std::fs::File;
use std::path::{Path, PathBuf};

use std::ops::Bound;

use autocomp_store::{Batch, BatchId, ObjectStore, Selection, Seq, StoreError, Timestamp, Trigger};
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::collector::sort_key::SortByStaticFastValue;
use tantivy::directory::MmapDirectory;
use tantivy::directory::error::LockError;
use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, RangeQuery};
use tantivy::schema::Value;
use tantivy::{
    DocAddress, Index, IndexReader, IndexWriter, Order, ReloadPolicy, Searcher, TantivyDocument, TantivyError, Term,
};

use crate::bitsets::TermBitsets;
use crate::browse::{MAX_PAGE, Page, PageKey, PageOrder, PageRequest, Tally};
use crate::document::{Fields, IndexedBatch, SCHEMA_VERSION};
use crate::query::{selection_query, trigger_query};

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("batch index at {dir}: {message}")]
    Index { dir: PathBuf, message: String },
}

pub type IndexResult<T> = Result<T, IndexError>;

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Changes read from the feed per page (and batches fetched per store request).
    pub page_size: usize,
    /// Commit (with the cursor) after this many indexed batches; bounds re-work after a crash.
    pub commit_every: usize,
    pub writer_threads: usize,
    pub writer_memory_bytes: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self { page_size: 5_000, commit_every: 100_000, writer_threads: 2, writer_memory_bytes: 256 << 20 }
    }
}

/// What a catch-up did. As JSON (the sboi service's `/v1/catch_up`):
/// `{"status": "up_to_date" | "applied" | "writer_busy", "cursor": N[, "batches": N]}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CatchUp {
    /// Nothing had changed since the committed cursor.
    UpToDate { cursor: Seq },
    /// Indexed this many batch versions and committed up to `cursor`.
    Applied { batches: usize, cursor: Seq },
    /// Another process holds the writer; queries see what it has committed.
    WriterBusy { cursor: Seq },
}

impl CatchUp {
    /// The store seq up to which every change is in the committed index after this catch-up.
    pub fn cursor(&self) -> Seq {
        match *self {
            CatchUp::UpToDate { cursor } | CatchUp::Applied { cursor, .. } | CatchUp::WriterBusy { cursor } => cursor,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct CommitPayload {
    cursor: Seq,
    schema: u32,
}

pub struct IndexEngine {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    options: EngineOptions,
    /// Term bitsets of the live segments, for counting selections.
    bitsets: TermBitsets,
}

impl IndexEngine {
    pub fn open(dir: impl AsRef<Path>) -> IndexResult<Self> {
        Self::open_with(dir, EngineOptions::default())
    }

    /// Opens the index in `dir`, creating it if needed (safe when several processes race).
    pub fn open_with(dir: impl AsRef<Path>, options: EngineOptions) -> IndexResult<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fail = |message: String| IndexError::Index { dir: dir.clone(), message };
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("cannot create the directory: {e}")))?;
        let index = {
            // Two processes creating the same fresh index would both write meta.json.
            let guard = File::create(dir.join(".autocomp-create.lock"))
                .and_then(|file| file.lock().map(|()| file))
                .map_err(|e| fail(format!("cannot lock for creation: {e}")))?;
            let directory = MmapDirectory::open(&dir).map_err(|e| fail(e.to_string()))?;
            let (schema, _) = Fields::schema();
            let index = Index::open_or_create(directory, schema.clone()).map_err(|e| fail(e.to_string()))?;
            drop(guard);
            if index.schema() != schema {
                return Err(fail(
                    "was built by another version of autocomp (its fields differ); delete the directory or run \
                     `autocomp reindex` to rebuild it"
                        .into(),
                ));
            }
            index
        };
        let fields = Fields::from_schema(&index.schema()).map_err(|e| fail(e.to_string()))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e: TantivyError| fail(e.to_string()))?;
        let engine = Self { dir, index, reader, fields, options, bitsets: TermBitsets::default() };
        engine.committed_cursor()?;
        Ok(engine)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn fail(&self, error: impl ToString) -> IndexError {
        IndexError::Index { dir: self.dir.clone(), message: error.to_string() }
    }

    /// The store seq up to which the index is committed (`Seq::ZERO` when empty).
    pub fn committed_cursor(&self) -> IndexResult<Seq> {
        let metas = self.index.load_metas().map_err(|e| self.fail(e))?;
        let Some(payload) = metas.payload else { return Ok(Seq::ZERO) };
        let payload: CommitPayload =
            serde_json::from_str(&payload).map_err(|e| self.fail(format!("unreadable commit payload: {e}")))?;
        if payload.schema != SCHEMA_VERSION {
            return Err(self.fail(format!(
                "has schema version {}, this release uses {SCHEMA_VERSION}; rebuild it with `autocomp reindex`",
                payload.schema
            )));
        }
        Ok(payload.cursor)
    }

    /// Applies every change after the committed cursor. Returns at once when nothing
    /// changed, or when another process is the writer right now.
    pub async fn catch_up(&self, store: &dyn ObjectStore) -> IndexResult<CatchUp> {
        let cursor = self.committed_cursor()?;
        if store.changes(cursor, 1).await?.changes.is_empty() {
            return Ok(CatchUp::UpToDate { cursor });
        }
        let Some(writer) = self.try_writer().await? else {
            return Ok(CatchUp::WriterBusy { cursor: self.committed_cursor()? });
        };
        // Another process may have committed between our read and taking the writer.
        let cursor = self.committed_cursor()?;
        let (writer, applied) = self.apply_feed(store, writer, cursor).await?;
        self.finish(writer).await?;
        Ok(match applied {
            (0, cursor) => CatchUp::UpToDate { cursor },
            (batches, cursor) => CatchUp::Applied { batches, cursor },
        })
    }

    /// Rebuilds the index from the whole store. Waits for any other writer to finish.
    pub async fn rebuild(&self, store: &dyn ObjectStore) -> IndexResult<usize> {
        self.rebuild_with_progress(store, &mut |_| {}).await
    }

    /// `rebuild`, calling `progress` with the number of batches indexed so far after each
    /// page of `page_size` batches (for a progress bar; `autocomp reindex`).
    pub async fn rebuild_with_progress(
        &self,
        store: &dyn ObjectStore,
        progress: &mut (dyn FnMut(usize) + Send),
    ) -> IndexResult<usize> {
        let writer = loop {
            if let Some(writer) = self.try_writer().await? {
                break writer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        writer.delete_all_documents().map_err(|e| self.fail(e))?;
        // Everything listed below is at least as new as `start`; later changes are
        // re-applied from the feed, harmlessly.
        let start = store.head().await?;
        let mut writer = writer;
        let mut after: Option<BatchId> = None;
        let mut total = 0;
        loop {
            let page = store.list_batches(after.as_ref(), self.options.page_size).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            total += page.len();
            writer = self.index_batches(writer, page).await?;
            progress(total);
        }
        writer = self.commit(writer, start).await?;
        let (writer, _) = self.apply_feed(store, writer, start).await?;
        self.finish(writer).await?;
        Ok(total)
    }

    async fn try_writer(&self) -> IndexResult<Option<IndexWriter>> {
        let index = self.index.clone();
        let (threads, memory) = (self.options.writer_threads.max(1), self.options.writer_memory_bytes);
        match tokio::task::spawn_blocking(move || index.writer_with_num_threads(threads, memory)).await {
            Ok(Ok(writer)) => Ok(Some(writer)),
            Ok(Err(TantivyError::LockFailure(LockError::LockBusy, _))) => Ok(None),
            Ok(Err(e)) => Err(self.fail(e)),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Indexes feed pages from `cursor` on, committing every `commit_every` batches and at
    /// the end. Returns the writer, the number of batches indexed and the final cursor.
    async fn apply_feed(
        &self,
        store: &dyn ObjectStore,
        mut writer: IndexWriter,
        mut cursor: Seq,
    ) -> IndexResult<(IndexWriter, (usize, Seq))> {
        let (mut applied, mut pending) = (0, 0);
        let mut page = self.fetch_page(store, cursor).await?;
        while let Some((batches, page_end)) = page {
            let count = batches.len();
            // The store reads the next page while tantivy indexes this one: a catch-up is
            // mostly store reads, and the two run on different threads.
            let (indexed, following) =
                tokio::join!(self.index_batches(writer, batches), self.fetch_page(store, page_end));
            writer = indexed?;
            page = following?;
            (applied, pending, cursor) = (applied + count, pending + count, page_end);
            if pending >= self.options.commit_every {
                writer = self.commit(writer, cursor).await?;
                pending = 0;
            }
        }
        if pending > 0 {
            writer = self.commit(writer, cursor).await?;
        }
        Ok((writer, (applied, cursor)))
    }

    /// The batches changed after `cursor` (one feed page) and where that page ends.
    async fn fetch_page(&self, store: &dyn ObjectStore, cursor: Seq) -> IndexResult<Option<(Vec<Batch>, Seq)>> {
        let page = store.changes(cursor, self.options.page_size).await?;
        if page.changes.is_empty() {
            return Ok(None);
        }
        let ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        Ok(Some((store.get_batches(&ids).await?, page.next)))
    }

    /// Upserts: a batch's old document is deleted and its new one added in the same commit.
    async fn index_batches(&self, writer: IndexWriter, batches: Vec<Batch>) -> IndexResult<IndexWriter> {
        let fields = self.fields;
        tokio::task::spawn_blocking(move || {
            for batch in &batches {
                writer.delete_term(fields.id_term(&batch.id));
                writer.add_document(fields.document(batch))?;
            }
            Ok(writer)
        })
        .await
        .map_err(|e| self.fail(e))?
        .map_err(|e: TantivyError| self.fail(e))
    }

    async fn commit(&self, mut writer: IndexWriter, cursor: Seq) -> IndexResult<IndexWriter> {
        let payload = serde_json::to_string(&CommitPayload { cursor, schema: SCHEMA_VERSION }).expect("serializes");
        tokio::task::spawn_blocking(move || {
            let mut prepared = writer.prepare_commit()?;
            prepared.set_payload(&payload);
            prepared.commit()?;
            Ok(writer)
        })
        .await
        .map_err(|e| self.fail(e))?
        .map_err(|e: TantivyError| self.fail(e))
    }

    /// Lets merges finish and releases the writer lock.
    async fn finish(&self, writer: IndexWriter) -> IndexResult<()> {
        tokio::task::spawn_blocking(move || writer.wait_merging_threads())
            .await
            .map_err(|e| self.fail(e))?
            .map_err(|e| self.fail(e))
    }

    fn searcher(&self) -> IndexResult<Searcher> {
        self.reader.reload().map_err(|e| self.fail(e))?;
        Ok(self.reader.searcher())
    }

    /// The batches the committed index holds ready for `trigger` at store time `now`, in
    /// trigger order (priority descending, then oldest first), limited.
    pub fn query_at(&self, trigger: &Trigger, now: Timestamp) -> IndexResult<Vec<BatchId>> {
        let searcher = self.searcher()?;
        // Never more than the index holds: tantivy sizes its collector by the limit, and a
        // trigger's limit may be any number a config or a request body spells.
        let everything = (searcher.num_docs() as usize).max(1);
        let limit = match trigger.limit {
            Some(0) => return Ok(Vec::new()),
            Some(limit) => limit.min(everything),
            None => everything,
        };
        let order = (
            (SortByStaticFastValue::<i64>::for_field("priority"), Order::Desc),
            (SortByStaticFastValue::<i64>::for_field("created_seq"), Order::Asc),
        );
        let query = trigger_query(&self.fields, trigger, now);
        let hits = searcher.search(&query, &TopDocs::with_limit(limit).order_by(order)).map_err(|e| self.fail(e))?;
        self.ids_of(&searcher, hits.into_iter().map(|(_, address)| address))
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
        let searcher = self.searcher()?;
        let limit = request.limit.min(MAX_PAGE);
        if limit == 0 {
            return Ok(Page { batches: Vec::new(), next: None });
        }
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, selection_query(&self.fields, &request.selection, now))];
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
