//! The service's answers bounded in items and bytes: a request may ask for at most `MAX_ITEMS`,
//! a backend reads at most a page at once, and an answer of several batches, histories,
//! summaries or listings stops at `MAX_ANSWER_BYTES`, counted item by item as it is read (413),
//! instead of holding all it names. Apart from the declarations so each of those stays a line.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde::Serialize;

use super::stream;
use super::wire::{
    ClaimAnswer, ClaimManyAnswer, ClaimManyRequest, ListBatches, LogPageRequest, MAX_ANSWER_BYTES, MAX_ITEMS,
    MAX_WAIT_MS, ReadyClaimsAnswer, distinct,
};
use crate::port::ready_claims::ReadyClaimRequest;
use crate::port::{BatchHistory, BatchListing, LogPage, MAX_RETENTION_PAGE, ObjectStore, StoreError, StoreResult};
use crate::write_rules::MAX_BATCH_PAGE;
use autocomp_http::api::{Answered, Reply};
use autocomp_http::error::ApiError;
use autocomp_model::{Batch, BatchId, BatchSummary, InvalidInput};

/// `get_batch`: one whole batch, written as it is read (`stream`), never held whole.
pub(super) async fn batch(
    store: &Arc<dyn ObjectStore>,
    id: BatchId,
    reply: Reply<Batch>,
) -> Result<Answered, ApiError> {
    let found = stream::sized(store.as_ref(), std::slice::from_ref(&id), "get_batch", "ids").await?;
    let batch = found.into_iter().next().ok_or(StoreError::NotFound(id))?;
    Ok(stream::batch(Arc::clone(store), batch, reply))
}

/// `get_batches`: the batches named, each once, written as they are read.
pub(super) async fn batches(
    store: &Arc<dyn ObjectStore>,
    ids: Vec<BatchId>,
    reply: Reply<Vec<Batch>>,
) -> Result<Answered, ApiError> {
    one_page("ids", at_most("ids", ids.len())?)?;
    let ids = distinct(ids);
    let found = stream::sized(store.as_ref(), &ids, "get_batches", "ids").await?;
    Ok(stream::batches(Arc::clone(store), found, reply))
}

/// `list_batches`: the ids from the summaries (no logs read), then as `get_batches`.
pub(super) async fn listed_batches(
    store: &Arc<dyn ObjectStore>,
    request: ListBatches,
    reply: Reply<Vec<Batch>>,
) -> Result<Answered, ApiError> {
    one_page("limit", at_most("limit", request.limit)?)?;
    let listed = store.list_summaries(request.after.as_ref(), request.limit).await?;
    let ids: Vec<BatchId> = listed.into_iter().map(|summary| summary.id).collect();
    let found = stream::sized(store.as_ref(), &ids, "list_batches", "limit").await?;
    Ok(stream::batches(Arc::clone(store), found, reply))
}

/// `get_summaries`, read a group at a time within the answer's bytes.
pub(super) async fn summaries(store: &dyn ObjectStore, ids: Vec<BatchId>) -> Result<Vec<BatchSummary>, ApiError> {
    one_page("ids", at_most("ids", ids.len())?)?;
    let ids = distinct(ids);
    by_ids(store, &ids, "get_summaries", MAX_BATCH_PAGE, |store, ids| store.get_summaries(ids)).await
}

/// `list_summaries`, read a page at a time within the answer's bytes.
pub(super) async fn listed_summaries(
    store: &dyn ObjectStore,
    request: ListBatches,
) -> Result<Vec<BatchSummary>, ApiError> {
    one_page("limit", at_most("limit", request.limit)?)?;
    let read: for<'a> fn(&'a dyn ObjectStore, Option<&'a BatchId>, usize) -> Read<'a, BatchSummary> =
        |store, after, n| store.list_summaries(after, n);
    listed(store, request.after, request.limit, "list_summaries", MAX_BATCH_PAGE, read, |s| &s.id).await
}

/// `get_listings`, read a group at a time within the answer's bytes.
pub(super) async fn listings(store: &dyn ObjectStore, ids: Vec<BatchId>) -> Result<Vec<BatchListing>, ApiError> {
    one_page("ids", at_most("ids", ids.len())?)?;
    let ids = distinct(ids);
    by_ids(store, &ids, "get_listings", MAX_BATCH_PAGE, |store, ids| store.get_listings(ids)).await
}

/// `histories`: each batch's whole history (log and runs), read a group at a time within the
/// answer's bytes, as `get_summaries` is: an export of batches near their own cap would
/// otherwise hold up to 1000 of them in one answer.
pub(super) async fn histories(store: &dyn ObjectStore, ids: Vec<BatchId>) -> Result<Vec<BatchHistory>, ApiError> {
    // Refused as the backends refuse it: repeats count, as they did before the ids were grouped.
    crate::write_rules::check_page("ids", ids.len(), MAX_RETENTION_PAGE)?;
    let ids = distinct(ids);
    by_ids(store, &ids, "histories", MAX_RETENTION_PAGE, |store, ids| store.histories(ids)).await
}

/// `log_page`, whole or read by size.
pub(super) async fn log_page(store: &dyn ObjectStore, request: LogPageRequest) -> Result<LogPage, ApiError> {
    let cursor = request.cursor().map_err(ApiError::invalid)?;
    Ok(match request.details_up_to {
        None => store.log_page(&request.id, cursor, request.limit).await?,
        Some(up_to) => store.log_page_within(&request.id, cursor, request.limit, up_to).await?,
    })
}

/// `claim_many`: every claim's own answer, in the order asked.
pub(super) async fn claim_many(
    store: &dyn ObjectStore,
    request: ClaimManyRequest,
) -> Result<ClaimManyAnswer, ApiError> {
    at_most("batches", request.batches.len())?;
    let answers = store.claim_many(&request.batches, &request.component, &request.holder).await?;
    Ok(ClaimManyAnswer { answers: answers.into_iter().map(ClaimAnswer::from).collect() })
}

/// `claim_ready`: the round as the store did it, its answer refused (413) when it would pass
/// `MAX_ANSWER_BYTES` with more than one batch in it (each batch comes whole, as read). Counted
/// once the round is done, so its claims stand: `HttpStore` asks again in halves with the same
/// claim key, which answer the runs it opened, as a retry after a lost answer does.
pub(super) async fn claim_ready(
    store: &dyn ObjectStore,
    request: ReadyClaimRequest,
) -> Result<ReadyClaimsAnswer, ApiError> {
    let answer = ReadyClaimsAnswer::from(store.claim_ready(&request).await?);
    let mut budget = Budget::default();
    for item in &answer.answers {
        budget.add(item, "claim_ready", "batches")?;
    }
    Ok(answer)
}

/// One read of the backend, as the port's methods return it.
type Read<'a, T> = std::pin::Pin<Box<dyn Future<Output = StoreResult<Vec<T>>> + Send + 'a>>;

/// A read by ids, `ids` read a group at a time and counted as they come (`Budget`).
async fn by_ids<T: Serialize>(
    store: &dyn ObjectStore,
    ids: &[BatchId],
    operation: &str,
    most: usize,
    read: for<'a> fn(&'a dyn ObjectStore, &'a [BatchId]) -> Read<'a, T>,
) -> Result<Vec<T>, ApiError> {
    let mut budget = Budget::default();
    let mut answer = Vec::new();
    let mut rest = ids;
    while !rest.is_empty() {
        let (group, later) = rest.split_at(budget.group(most).min(rest.len()));
        for item in read(store, group).await? {
            budget.add(&item, operation, "ids")?;
            answer.push(item);
        }
        rest = later;
    }
    Ok(answer)
}

/// A listing in id order, read a page at a time and counted as it comes (`Budget`).
async fn listed<T: Serialize>(
    store: &dyn ObjectStore,
    mut after: Option<BatchId>,
    limit: usize,
    operation: &str,
    most: usize,
    read: for<'a> fn(&'a dyn ObjectStore, Option<&'a BatchId>, usize) -> Read<'a, T>,
    id: fn(&T) -> &BatchId,
) -> Result<Vec<T>, ApiError> {
    let mut budget = Budget::default();
    let mut answer: Vec<T> = Vec::new();
    while answer.len() < limit {
        let asked = budget.group(most).min(limit - answer.len());
        let page = read(store, after.as_ref(), asked).await?;
        let short = page.len() < asked;
        for item in page {
            budget.add(&item, operation, "limit")?;
            answer.push(item);
        }
        match answer.last() {
            Some(last) if !short => after = Some(id(last).clone()),
            _ => break,
        }
    }
    Ok(answer)
}

/// An answer's JSON bytes, counted item by item as the answer is read, so a read that
/// would pass `MAX_ANSWER_BYTES` stops there (413) instead of holding all it names. An
/// answer of one item is never refused: one batch is bounded by its store's
/// `max_batch_bytes`, and a caller can ask for nothing smaller.
#[derive(Default)]
struct Budget {
    bytes: u64,
    items: u64,
    /// The size of the last group read.
    last_group: usize,
}

impl Budget {
    fn add<T: Serialize>(&mut self, item: &T, operation: &str, field: &str) -> Result<(), ApiError> {
        let mut counted = Counted(0);
        // Writing to a counter cannot fail, nor can serializing what the store has read.
        serde_json::to_writer(&mut counted, item)
            .map_err(|e| ApiError::from(StoreError::Unavailable(e.to_string())))?;
        // The brackets and commas of the JSON array.
        self.bytes += counted.0 + 1;
        self.items += 1;
        if self.items > 1 && self.bytes + 1 > MAX_ANSWER_BYTES {
            let message = format!(
                "the answer to {operation} would pass {MAX_ANSWER_BYTES} bytes (64 MiB) at its {} item: ask for \
                 fewer {field} per request (one batch is always answered, whatever its size)",
                self.items
            );
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message));
        }
        Ok(())
    }

    /// How many items to read next: about an eighth of the cap at the average size read so
    /// far, at most `most`; until something is found, one, then twice the last (so ids
    /// that name nothing are not read one by one).
    fn group(&mut self, most: usize) -> usize {
        let next = match self.bytes.checked_div(self.items) {
            None => self.last_group.saturating_mul(2),
            Some(average) => usize::try_from((MAX_ANSWER_BYTES / 8) / average.max(1)).unwrap_or(most),
        };
        self.last_group = next.clamp(1, most);
        self.last_group
    }
}

/// A `Write` that keeps only the count of the bytes written.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the backends of this crate read at most at once (ids asked, repeats included, or a
/// listing's limit), refused here as they refuse it: the service answers as its store does.
fn one_page(field: &str, count: usize) -> Result<(), ApiError> {
    if count > MAX_BATCH_PAGE {
        return Err(crate::write_rules::page_too_large(field, count, MAX_BATCH_PAGE).into());
    }
    Ok(())
}

/// `count` when a request may ask for that many items (`MAX_ITEMS`).
pub(super) fn at_most(field: &str, count: usize) -> Result<usize, ApiError> {
    if count > MAX_ITEMS {
        let reason = format!("at most {MAX_ITEMS} per request");
        return Err(ApiError::invalid(InvalidInput::new(field, count.to_string(), reason)));
    }
    Ok(count)
}

/// How long a long poll may be asked to wait: at most `MAX_WAIT_MS`.
pub(super) fn wait(timeout_ms: u64) -> Result<Duration, ApiError> {
    if timeout_ms > MAX_WAIT_MS {
        let reason = format!("at most {MAX_WAIT_MS} ms");
        return Err(ApiError::invalid(InvalidInput::new("timeout_ms", timeout_ms.to_string(), reason)));
    }
    Ok(Duration::from_millis(timeout_ms))
}
