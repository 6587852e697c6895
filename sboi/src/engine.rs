//! The index engine: one tantivy directory, caught up from any `ObjectStore`'s change feed.
//! The feed cursor rides in the commit payload, so documents and cursor are committed
//! together: a crash between steps re-applies a page (an idempotent upsert), never skips one.
//! One process writes at a time (tantivy's flock); the others read what is committed, and
//! a fresh query corrects that with the feed since (`fresh`), so it needs no writer. Here:
//! opening, catching up and rebuilding; what a commit answers is in `reads`, and comparing
//! the index with the store (and repairing it) in `drift`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use autocomp_model::{BatchId, BatchSummary, Seq};
use autocomp_store::{ObjectStore, StoreError};
use serde::{Deserialize, Serialize};
use tantivy::directory::MmapDirectory;
use tantivy::directory::error::LockError;
use tantivy::index::SegmentId;
use tantivy::{
    DocAddress, Index, IndexReader, IndexWriter, Opstamp, ReloadPolicy, Searcher, TantivyDocument, TantivyError,
};

use crate::bitsets::TermBitsets;
use crate::document::{Fields, SCHEMA_VERSION, Vocabulary};

mod drift;
mod fresh;
mod reads;
pub use drift::{Drift, Repaired};
pub use fresh::{Corrections, FreshAnswer};

/// The default `EngineOptions::max_corrections`: at 10,000 changed batches a fresh query
/// reads as many summaries, tens of milliseconds, still far less than a catch-up of them.
pub const MAX_CORRECTIONS: usize = 10_000;

/// How many times a read retries when another process commits between its reload and its
/// read of meta.json (`IndexEngine::snapshot`).
const SNAPSHOT_ATTEMPTS: usize = 20;

/// Why the index could not answer; a caller decides on the variant (and the store error's
/// kind), never on the words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("batch index at {dir}: {message}")]
    Index { dir: PathBuf, message: String },
    /// The index service cannot be reached, or answered that it cannot answer now: an outage
    /// of the index, not of the store (which the words of a `Store` error would say).
    #[error("index unavailable: {0}")]
    Unavailable(String),
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
    /// Keep one tantivy writer for the engine's life (the sboi service, the directory's only
    /// writer): a catch-up then neither opens a writer nor waits for merges. Off, each write
    /// takes the writer and releases it (many short processes sharing one directory).
    pub keep_writer: bool,
    /// Most batches changed since the last commit that a fresh query (`query_fresh`)
    /// evaluates from the store itself; past it the index must catch up first.
    pub max_corrections: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            page_size: 5_000,
            commit_every: 100_000,
            writer_threads: 2,
            writer_memory_bytes: 256 << 20,
            keep_writer: false,
            max_corrections: MAX_CORRECTIONS,
        }
    }
}

/// What a catch-up did. As JSON (the sboi service's `/v1/catch_up`):
/// `{"status": "up_to_date" | "applied" | "writer_busy", "cursor": N[, "batches": N]}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// Which batches of a write surely have no document yet, so need no delete first.
#[derive(Debug, Clone, Copy)]
enum Unindexed {
    None,
    /// Every batch (a rebuild's listing, after deleting everything).
    All,
    /// Batches whose `changed_seq` is at most this (a first catch-up; see `apply_feed`).
    UpTo(Seq),
}

impl Unindexed {
    fn covers(self, changed_seq: Seq) -> bool {
        match self {
            Unindexed::None => false,
            Unindexed::All => true,
            Unindexed::UpTo(seq) => changed_seq <= seq,
        }
    }
}

/// A commit's segments, each with its delete generation, sorted: equal lists, equal documents.
type Segments = Vec<(SegmentId, Option<Opstamp>)>;

/// The committed index as one commit left it (`IndexEngine::snapshot`).
struct Snapshot {
    searcher: Searcher,
    /// The vocabulary the commit's documents were built with.
    vocabulary: Arc<Vocabulary>,
    /// The commit's cursor: every store change up to it is in `searcher`'s documents.
    cursor: Seq,
}

/// What each commit records next to its documents.
#[derive(Serialize, Deserialize)]
struct CommitPayload {
    cursor: Seq,
    schema: u32,
    #[serde(default)]
    vocabulary: Vocabulary,
}

pub struct IndexEngine {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    options: EngineOptions,
    /// Term bitsets of the live segments, for counting selections.
    bitsets: TermBitsets,
    /// The writer between writes, with `EngineOptions::keep_writer`.
    kept_writer: Mutex<Option<IndexWriter>>,
    /// The vocabulary and cursor of the last commit `snapshot` read, by its segments.
    snapshot_cache: Mutex<Option<(Segments, Arc<Vocabulary>, Seq)>>,
    /// meta.json as it was when the reader last reloaded (see `searcher`).
    reloaded_for: Mutex<Option<Vec<u8>>>,
}

/// Creates the index directory 0700 whatever the umask (its parents as the umask says): the
/// index holds the batches' metadata, which `--reads-need-token` keeps from other users. An
/// existing directory is left as it is.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        created => created,
    }
}

impl IndexEngine {
    pub fn open(dir: impl AsRef<Path>) -> IndexResult<Self> {
        Self::open_with(dir, EngineOptions::default())
    }

    /// Opens the index in `dir`, creating it if needed (safe when several processes race).
    pub fn open_with(dir: impl AsRef<Path>, options: EngineOptions) -> IndexResult<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fail = |message: String| IndexError::Index { dir: dir.clone(), message };
        create_private_dir(&dir).map_err(|e| fail(format!("cannot create the directory: {e}")))?;
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
        let engine = Self {
            dir,
            index,
            reader,
            fields,
            options,
            bitsets: TermBitsets::default(),
            kept_writer: Mutex::new(None),
            snapshot_cache: Mutex::new(None),
            reloaded_for: Mutex::new(None),
        };
        engine.committed_cursor()?;
        Ok(engine)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Batches per store page (feed pages, rebuild and reconcile listings).
    pub fn page_size(&self) -> usize {
        self.options.page_size.max(1)
    }

    fn fail(&self, error: impl ToString) -> IndexError {
        IndexError::Index { dir: self.dir.clone(), message: error.to_string() }
    }

    /// The store seq up to which the index is committed (`Seq::ZERO` when empty).
    pub fn committed_cursor(&self) -> IndexResult<Seq> {
        Ok(self.committed()?.cursor)
    }

    /// The last commit's payload (an empty index: cursor zero, no vocabulary).
    fn committed(&self) -> IndexResult<CommitPayload> {
        let metas = self.index.load_metas().map_err(|e| self.fail(e))?;
        self.payload_of(metas.payload.as_deref())
    }

    fn payload_of(&self, payload: Option<&str>) -> IndexResult<CommitPayload> {
        let Some(payload) = payload else {
            return Ok(CommitPayload { cursor: Seq::ZERO, schema: SCHEMA_VERSION, vocabulary: Vocabulary::default() });
        };
        let payload: CommitPayload =
            serde_json::from_str(payload).map_err(|e| self.fail(format!("unreadable commit payload: {e}")))?;
        if payload.schema != SCHEMA_VERSION {
            return Err(self.fail(format!(
                "has schema version {}, this release uses {SCHEMA_VERSION}; rebuild it with `autocomp reindex`",
                payload.schema
            )));
        }
        Ok(payload)
    }

    /// Applies every change after the committed cursor. Returns at once when nothing
    /// changed, or when another process is the writer right now.
    pub async fn catch_up(&self, store: &dyn ObjectStore) -> IndexResult<CatchUp> {
        let cursor = self.committed_cursor()?;
        // Opening a writer is dear, so look first; a kept writer costs nothing to take,
        // and the feed's first page says the same thing one round trip sooner.
        if !self.options.keep_writer && store.changes(cursor, 1).await?.changes.is_empty() {
            return Ok(CatchUp::UpToDate { cursor });
        }
        let Some(writer) = self.try_writer().await? else {
            return Ok(CatchUp::WriterBusy { cursor: self.committed_cursor()? });
        };
        // Another process may have committed between our read and taking the writer.
        let CommitPayload { cursor, mut vocabulary, .. } = self.committed()?;
        let (writer, applied) = self.apply_feed(store, writer, cursor, &mut vocabulary).await?;
        self.release(writer).await?;
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
        let mut writer = self.wait_for_writer().await?;
        let mut vocabulary = self.committed()?.vocabulary;
        // A page with an event type the vocabulary lacks restarts the listing with it
        // grown: the documents before it, uncommitted, lack that type's `absent` term.
        // Each restart learns at least one type, so there are at most as many restarts as
        // types first seen during the rebuild (a component deployed meanwhile; rare).
        let (start, total) = 'listing: loop {
            writer.delete_all_documents().map_err(|e| self.fail(e))?;
            // Everything listed below is at least as new as `start`; later changes are
            // re-applied from the feed, harmlessly.
            let start = store.head().await?;
            let mut after: Option<BatchId> = None;
            let mut total = 0;
            loop {
                let page = store.list_summaries(after.as_ref(), self.options.page_size).await?;
                let Some(last) = page.last() else { break 'listing (start, total) };
                if let Some(grown) = vocabulary.grown_by(&page) {
                    tracing::info!(types = grown.len(), "rebuild: new event types; restarting the listing with them");
                    vocabulary = grown;
                    writer = self.rollback(writer).await?;
                    continue 'listing;
                }
                after = Some(last.id.clone());
                total += page.len();
                // The listing names each batch once, after `delete_all_documents`: nothing to delete.
                writer = self.index_batches(writer, page, &vocabulary, Unindexed::All).await?;
                progress(total);
            }
        };
        writer = self.commit(writer, start, &vocabulary).await?;
        let (writer, _) = self.apply_feed(store, writer, start, &mut vocabulary).await?;
        self.release(writer).await?;
        Ok(total)
    }

    async fn wait_for_writer(&self) -> IndexResult<IndexWriter> {
        loop {
            if let Some(writer) = self.try_writer().await? {
                return Ok(writer);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// The writer: the one this engine keeps (`EngineOptions::keep_writer`), or a new one;
    /// `None` while another process (or, with a kept writer, another task) holds it.
    async fn try_writer(&self) -> IndexResult<Option<IndexWriter>> {
        if let Some(writer) = self.kept_writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Ok(Some(writer));
        }
        let index = self.index.clone();
        let (threads, memory) = (self.options.writer_threads.max(1), self.options.writer_memory_bytes);
        let opened = tokio::task::spawn_blocking(move || {
            let writer = index.writer_with_num_threads(threads, memory)?;
            // A writer that died before its commit (a process that exited mid-catch-up: the
            // embedded index catches up in the background) leaves files no commit names;
            // the next writer reaches the same names (a segment's `.del` at the same opstamp)
            // and tantivy refuses to overwrite them. Sweep them before writing.
            writer.garbage_collect_files().wait()?;
            Ok(writer)
        });
        match opened.await {
            Ok(Ok(writer)) => Ok(Some(writer)),
            Ok(Err(TantivyError::LockFailure(LockError::LockBusy, _))) => Ok(None),
            Ok(Err(e)) => Err(self.fail(e)),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Hands a writer with nothing uncommitted back: kept for the next write, or (per
    /// catch-up, many processes sharing the directory) merged and released. A write that
    /// fails drops its writer instead, which discards what it had not committed.
    async fn release(&self, writer: IndexWriter) -> IndexResult<()> {
        if self.options.keep_writer {
            *self.kept_writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(writer);
            return Ok(());
        }
        self.finish(writer).await
    }

    /// Indexes feed pages from `cursor` on, committing every `commit_every` batches and at
    /// the end. Returns the writer, the number of batches indexed and the final cursor. A
    /// page bringing an event type `vocabulary` lacks grows it (`rewrite_for`) first.
    async fn apply_feed(
        &self,
        store: &dyn ObjectStore,
        mut writer: IndexWriter,
        mut cursor: Seq,
        vocabulary: &mut Vocabulary,
    ) -> IndexResult<(IndexWriter, (usize, Seq))> {
        let (mut applied, mut pending) = (0, 0);
        let mut page = self.fetch_page(store, cursor).await?;
        // From an empty index (a first catch-up), a batch changed no later than the first
        // page's head is listed for the first time in this feed: a batch listed earlier
        // comes again only after a change, which takes a later seq. Its document cannot
        // exist, and skipping its delete spares the commit looking it up in every segment.
        // Only a full first page is worth the look at the index's segments.
        let unindexed = match &page {
            Some((batches, _, head)) if batches.len() == self.options.page_size && self.holds_no_documents()? => {
                Unindexed::UpTo(*head)
            }
            _ => Unindexed::None,
        };
        while let Some((batches, page_end, _)) = page {
            let count = batches.len();
            if let Some(grown) = vocabulary.grown_by(&batches) {
                writer = self.commit(writer, cursor, vocabulary).await?;
                writer = self.rewrite_for(writer, cursor, &grown).await?;
                (*vocabulary, pending) = (grown, 0);
            }
            // The store reads the next page while tantivy indexes this one: a catch-up is
            // mostly store reads, and the two run on different threads.
            let (indexed, following) = tokio::join!(
                self.index_batches(writer, batches, vocabulary, unindexed),
                self.fetch_page(store, page_end)
            );
            writer = indexed?;
            page = following?;
            (applied, pending, cursor) = (applied + count, pending + count, page_end);
            if pending >= self.options.commit_every {
                writer = self.commit(writer, cursor, vocabulary).await?;
                pending = 0;
            }
        }
        if pending > 0 {
            writer = self.commit(writer, cursor, vocabulary).await?;
        }
        Ok((writer, (applied, cursor)))
    }

    /// Grows the vocabulary of a committed index with nothing uncommitted: rewrites every
    /// document from its stored fields (all but `absent`, which `present` and the
    /// vocabulary determine; no store read) and commits them with `grown`. Readers see the
    /// old documents with the old vocabulary or the new with the new, and the two commits
    /// share no segment, which is how `snapshot` tells which vocabulary a searcher needs.
    async fn rewrite_for(&self, writer: IndexWriter, cursor: Seq, grown: &Vocabulary) -> IndexResult<IndexWriter> {
        // We hold the writer, so this is the last commit.
        let searcher = self.searcher()?;
        let (fields, vocabulary) = (self.fields, grown.clone());
        let started = std::time::Instant::now();
        let writer = tokio::task::spawn_blocking(move || {
            writer.delete_all_documents()?;
            for (ord, segment) in searcher.segment_readers().iter().enumerate() {
                for doc_id in segment.doc_ids_alive() {
                    let mut document: TantivyDocument = searcher.doc(DocAddress::new(ord as u32, doc_id))?;
                    fields.add_absent(&mut document, &vocabulary);
                    writer.add_document(document)?;
                }
            }
            Ok(writer)
        })
        .await
        .map_err(|e| self.fail(e))?
        .map_err(|e: TantivyError| self.fail(e))?;
        let writer = self.commit(writer, cursor, grown).await?;
        tracing::info!(types = grown.len(), elapsed = ?started.elapsed(), "index: new event types; rewrote every document");
        Ok(writer)
    }

    /// Whether the last commit holds no document (from meta.json, without opening segments).
    fn holds_no_documents(&self) -> IndexResult<bool> {
        let segments = self.index.searchable_segment_metas().map_err(|e| self.fail(e))?;
        Ok(segments.iter().all(|segment| segment.num_docs() == 0))
    }

    /// The batches changed after `cursor` (one feed page), where that page ends, and the
    /// store's head when it was read.
    async fn fetch_page(
        &self,
        store: &dyn ObjectStore,
        cursor: Seq,
    ) -> IndexResult<Option<(Vec<BatchSummary>, Seq, Seq)>> {
        let page = store.changes(cursor, self.options.page_size).await?;
        if page.changes.is_empty() {
            return Ok(None);
        }
        let ids: Vec<BatchId> = page.changes.into_iter().map(|(_, id)| id).collect();
        Ok(Some((store.get_summaries(&ids).await?, page.next, page.head)))
    }

    /// Upserts: a batch's old document is deleted and its new one added in the same commit.
    /// `vocabulary` must know every event type of `batches`.
    async fn index_batches(
        &self,
        writer: IndexWriter,
        batches: Vec<BatchSummary>,
        vocabulary: &Vocabulary,
        unindexed: Unindexed,
    ) -> IndexResult<IndexWriter> {
        let (fields, vocabulary) = (self.fields, vocabulary.clone());
        tokio::task::spawn_blocking(move || {
            for batch in &batches {
                if !unindexed.covers(batch.changed_seq) {
                    writer.delete_term(fields.id_term(&batch.id));
                }
                writer.add_document(fields.document(batch, &vocabulary))?;
            }
            Ok(writer)
        })
        .await
        .map_err(|e| self.fail(e))?
        .map_err(|e: TantivyError| self.fail(e))
    }

    async fn commit(&self, mut writer: IndexWriter, cursor: Seq, vocabulary: &Vocabulary) -> IndexResult<IndexWriter> {
        let payload = CommitPayload { cursor, schema: SCHEMA_VERSION, vocabulary: vocabulary.clone() };
        let payload = serde_json::to_string(&payload).expect("serializes");
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

    /// Discards what the writer has not committed.
    async fn rollback(&self, mut writer: IndexWriter) -> IndexResult<IndexWriter> {
        tokio::task::spawn_blocking(move || writer.rollback().map(|_| writer))
            .await
            .map_err(|e| self.fail(e))?
            .map_err(|e| self.fail(e))
    }

    /// Lets merges finish and releases the writer lock.
    async fn finish(&self, writer: IndexWriter) -> IndexResult<()> {
        tokio::task::spawn_blocking(move || writer.wait_merging_threads())
            .await
            .map_err(|e| self.fail(e))?
            .map_err(|e| self.fail(e))
    }

    /// A searcher of the last commit, with the vocabulary its documents were built with and
    /// the cursor committed with them. meta.json may already be a newer commit's (another
    /// process commits between the reload and the read): its payload is taken only when its
    /// segments, with their delete generations, are the searcher's, retrying otherwise.
    /// Equal segments mean equal documents, since every write adds a segment or bumps one's
    /// deletes: so the pair is what that commit held, whichever of several commits with these
    /// documents it was (a merge saves the same payload with new segments; a commit that
    /// moves only the cursor leaves the documents as they were). Vocabularies differ only
    /// across a rewrite of every document (`rewrite_for`), which shares no segment.
    fn snapshot(&self) -> IndexResult<Snapshot> {
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let searcher = self.searcher()?;
            // Sorted by id (a BTreeMap's keys), as the commit's below.
            let segments: Segments =
                searcher.generation().segments().iter().map(|(id, deletes)| (*id, *deletes)).collect();
            {
                let cached = self.snapshot_cache.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((cached_segments, vocabulary, cursor)) = cached.as_ref()
                    && *cached_segments == segments
                {
                    return Ok(Snapshot { searcher, vocabulary: Arc::clone(vocabulary), cursor: *cursor });
                }
            }
            let metas = self.index.load_metas().map_err(|e| self.fail(e))?;
            let mut committed: Segments =
                metas.segments.iter().map(|segment| (segment.id(), segment.delete_opstamp())).collect();
            committed.sort();
            if committed == segments {
                let payload = self.payload_of(metas.payload.as_deref())?;
                let vocabulary = Arc::new(payload.vocabulary);
                *self.snapshot_cache.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((segments, Arc::clone(&vocabulary), payload.cursor));
                return Ok(Snapshot { searcher, vocabulary, cursor: payload.cursor });
            }
        }
        Err(self.fail(format!("the index changed under {SNAPSHOT_ATTEMPTS} reads in a row; try again")))
    }

    /// A searcher of the newest commit. A reload opens every segment anew (under tantivy's
    /// meta lock) and starts an empty stored-document cache: about half a millisecond per
    /// query at a million batches, more than the typical trigger's search. Every commit
    /// rewrites meta.json, so the reader reloads only when meta.json is not the one it last
    /// reloaded for. Read before reloading: a commit in between only costs a second reload.
    fn searcher(&self) -> IndexResult<Searcher> {
        let meta = std::fs::read(self.dir.join("meta.json")).ok();
        let mut reloaded_for = self.reloaded_for.lock().unwrap_or_else(|p| p.into_inner());
        if meta.is_none() || *reloaded_for != meta {
            self.reader.reload().map_err(|e| self.fail(e))?;
            *reloaded_for = meta;
        }
        Ok(self.reader.searcher())
    }
}
