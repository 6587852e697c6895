//! Answers of whole batches (`get_batch`, `get_batches`, `list_batches`) written as they are
//! read (`Reply::stream`), so the service holds about one page of a log per reader, not the
//! answer: a batch that fits in `WHOLE_BYTES` is read whole (with others as small, in one
//! read), a larger one as its head and then its log page by page (`log_page_within`), each
//! event whose details a page leaves out read alone (`event_at`). The JSON is byte for byte
//! what serializing the `Batch` writes, so clients read it unchanged.
//!
//! A streamed answer cannot turn into a 413 once its status is sent: the cap of an answer of
//! several batches is decided first, from each batch's head (its stored bytes and its
//! number of events, `sized`), before a byte of the answer is written.

use std::sync::Arc;

use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::wire::MAX_ANSWER_BYTES;
use crate::port::{BatchHead, DETAILS_SHOWN_BYTES, LogCursor, ObjectStore, StoreError, event_at};
use autocomp_http::api::{Answered, Pieces, Reply};
use autocomp_http::error::ApiError;
use autocomp_model::{Batch, BatchId, BatchType, Run, Seq, Timestamp};

/// A batch whose estimated answer is at most this is read whole, and consecutive such
/// batches together up to `GROUP_BYTES`: what a reader of small batches costs stays one read.
const WHOLE_BYTES: u64 = 1 << 20;
const GROUP_BYTES: u64 = 4 << 20;

/// Events per page of a large batch's log: with details over `DETAILS_SHOWN_BYTES` read one
/// event at a time, a page holds at most 1 MiB of details.
const EVENTS_PER_PAGE: usize = 64;

/// What an event's JSON adds to its details (seq, batch, type, outcome, agent, time, run),
/// and a batch's to its metadata and events, at most in practice: the estimate `sized`
/// caps answers by.
const EVENT_ALLOWANCE: u64 = 512;
const BATCH_ALLOWANCE: u64 = 4 << 10;

/// A batch found, with the estimated bytes of its JSON.
pub(super) struct Found {
    id: BatchId,
    bytes: u64,
}

/// Each batch of `ids` that exists, in order, with its estimated size (from its head, read
/// and dropped one at a time); refused (413) when there is more than one and together they
/// pass `MAX_ANSWER_BYTES`, as the answer would.
pub(super) async fn sized(
    store: &dyn ObjectStore,
    ids: &[BatchId],
    operation: &str,
    field: &str,
) -> Result<Vec<Found>, ApiError> {
    let (mut found, mut total) = (Vec::new(), 0u64);
    for id in ids {
        let head = match store.batch_head(id).await {
            Ok(head) => head,
            Err(StoreError::NotFound(_)) => continue,
            Err(error) => return Err(error.into()),
        };
        let bytes = head.stored_bytes + head.event_count * EVENT_ALLOWANCE + BATCH_ALLOWANCE;
        total += bytes;
        found.push(Found { id: id.clone(), bytes });
        if found.len() > 1 && total > MAX_ANSWER_BYTES {
            let message = format!(
                "the answer to {operation} would pass {MAX_ANSWER_BYTES} bytes (64 MiB) at its {} item: ask for \
                 fewer {field} per request (one batch is always answered, whatever its size)",
                found.len()
            );
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message));
        }
    }
    Ok(found)
}

/// Answers `batches` (found by `sized`) as a JSON array, written as read.
pub(super) fn batches(store: Arc<dyn ObjectStore>, batches: Vec<Found>, reply: Reply<Vec<Batch>>) -> Answered {
    let (pieces, answered) = reply.stream();
    tokio::spawn(async move {
        let written = async {
            send(&pieces, b"[".to_vec()).await?;
            write_all(store.as_ref(), &batches, &pieces).await?;
            send(&pieces, b"]".to_vec()).await
        };
        finish(written.await, pieces).await;
    });
    answered
}

/// Answers one batch (found by `sized`), written as read.
pub(super) fn batch(store: Arc<dyn ObjectStore>, batch: Found, reply: Reply<Batch>) -> Answered {
    let (pieces, answered) = reply.stream();
    tokio::spawn(async move {
        let written = write_all(store.as_ref(), std::slice::from_ref(&batch), &pieces).await;
        finish(written, pieces).await;
    });
    answered
}

/// Why a streamed answer stopped before its end.
enum Cut {
    /// The client went away: nothing to tell anyone.
    Gone,
    Store(StoreError),
}

impl From<StoreError> for Cut {
    fn from(error: StoreError) -> Self {
        Cut::Store(error)
    }
}

async fn finish(written: Result<(), Cut>, pieces: Pieces) {
    if let Err(Cut::Store(error)) = written {
        tracing::warn!(%error, "a streamed answer cut short");
        pieces.fail(error.to_string()).await;
    }
}

async fn send(pieces: &Pieces, piece: Vec<u8>) -> Result<(), Cut> {
    if pieces.send(piece).await { Ok(()) } else { Err(Cut::Gone) }
}

/// The batches, comma-separated: small ones read together, large ones page by page.
async fn write_all(store: &dyn ObjectStore, batches: &[Found], pieces: &Pieces) -> Result<(), Cut> {
    let mut first = true;
    let mut rest = batches;
    while let Some(next) = rest.first() {
        if next.bytes > WHOLE_BYTES {
            write_large(store, &next.id, pieces, &mut first).await?;
            rest = &rest[1..];
            continue;
        }
        let (mut taken, mut bytes) = (0, 0);
        while let Some(small) = rest.get(taken).filter(|small| small.bytes <= WHOLE_BYTES) {
            if taken > 0 && bytes + small.bytes > GROUP_BYTES {
                break;
            }
            bytes += small.bytes;
            taken += 1;
        }
        let ids: Vec<BatchId> = rest[..taken].iter().map(|small| small.id.clone()).collect();
        let mut piece = Vec::new();
        for batch in store.get_batches(&ids).await? {
            comma(&mut piece, &mut first);
            json(&mut piece, &batch)?;
        }
        send(pieces, piece).await?;
        rest = &rest[taken..];
    }
    Ok(())
}

/// One batch from its head and its log read page by page: the events the head counts (one
/// appended since is left for the next read, as a whole read would have left it).
async fn write_large(store: &dyn ObjectStore, id: &BatchId, pieces: &Pieces, first: &mut bool) -> Result<(), Cut> {
    let head = match store.batch_head(id).await {
        Ok(head) => head,
        // Batches are never removed; a store that lost one since `sized` found it answers
        // without it, as a whole read would.
        Err(StoreError::NotFound(_)) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    let mut piece = Vec::new();
    comma(&mut piece, first);
    // Only what closes the batch is kept of the head while its log is read (its effective
    // events in full may be megabytes).
    let (open_runs, as_of, count) = opening(&mut piece, head)?;
    let (mut after, mut left) = (Seq::ZERO, count);
    let mut first_event = true;
    while left > 0 {
        let limit = usize::try_from(left).unwrap_or(EVENTS_PER_PAGE).min(EVENTS_PER_PAGE);
        let page = store.log_page_within(id, LogCursor::After(after), limit, DETAILS_SHOWN_BYTES).await?;
        if page.events.is_empty() {
            break;
        }
        let left_out = page.details_left_out;
        for event in page.events {
            after = event.seq;
            left -= 1;
            comma(&mut piece, &mut first_event);
            if left_out.iter().any(|(seq, _)| *seq == event.seq) {
                // Send what is held before reading the large event, so only it is held.
                send(pieces, std::mem::take(&mut piece)).await?;
                let whole = event_at(store, id, event.seq)
                    .await?
                    .ok_or_else(|| StoreError::Unavailable(format!("event {} of batch {id} is gone", event.seq.0)))?;
                json(&mut piece, &whole)?;
            } else {
                json(&mut piece, &event)?;
            }
            if left == 0 {
                break;
            }
        }
        send(pieces, std::mem::take(&mut piece)).await?;
    }
    piece.extend_from_slice(b"],\"open_runs\":");
    json(&mut piece, &open_runs)?;
    piece.extend_from_slice(b",\"as_of\":");
    json(&mut piece, &as_of)?;
    piece.push(b'}');
    send(pieces, piece).await
}

/// A `Batch`'s fields before its events, in its order: its JSON up to `"events":[`.
#[derive(Serialize)]
struct Opening<'a> {
    id: &'a BatchId,
    #[serde(rename = "type")]
    batch_type: &'a BatchType,
    priority: i32,
    metadata: &'a Map<String, Value>,
    created_seq: Seq,
    modified_seq: Seq,
    changed_seq: Seq,
    created_at: Timestamp,
    modified_at: Timestamp,
}

/// Writes the opening and answers what the batch closes with (open runs, `as_of`) and how
/// many events it has; the rest of the head is dropped.
fn opening(piece: &mut Vec<u8>, head: BatchHead) -> Result<(Vec<Run>, Timestamp, u64), Cut> {
    let summary = &head.summary;
    json(
        piece,
        &Opening {
            id: &summary.id,
            batch_type: &summary.batch_type,
            priority: summary.priority,
            metadata: &head.metadata,
            created_seq: summary.created_seq,
            modified_seq: summary.modified_seq,
            changed_seq: summary.changed_seq,
            created_at: head.created_at,
            modified_at: head.modified_at,
        },
    )?;
    piece.pop(); // its closing brace: the events follow
    piece.extend_from_slice(b",\"events\":[");
    Ok((head.open_runs, head.as_of, head.event_count))
}

fn comma(piece: &mut Vec<u8>, first: &mut bool) {
    if !std::mem::take(first) {
        piece.push(b',');
    }
}

fn json<T: Serialize>(piece: &mut Vec<u8>, value: &T) -> Result<(), Cut> {
    // Serializing what the store has read into memory cannot fail.
    serde_json::to_writer(piece, value).map_err(|e| Cut::Store(StoreError::Unavailable(e.to_string())))
}
