//! `RetentionStore`: a finished batch's history taken out of the store after it was exported,
//! and put back from the export. Pruning keeps the batch, its effective events (the final
//! state of each step) and one `History_Pruned` event naming the export; it removes every
//! other event and every run. Such a batch is ready for no component until its history is
//! imported again, which puts every exported event and run back as it was.

use autocomp_model::{Batch, BatchId, EventType, NewEvent, Run, Seq};
use serde::{Deserialize, Serialize};

use super::{StoreError, StoreResult};
use crate::write_rules;

/// Most batches one `histories`, `prune_histories` or `restore_histories` call takes: each is
/// one transaction, kept short so passes go on between them.
pub const MAX_RETENTION_PAGE: usize = 1_000;

/// A batch's whole history as an export holds it: the batch with its whole log, and every run
/// any component had on it (open or closed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BatchHistory {
    pub batch: Batch,
    pub runs: Vec<Run>,
}

/// What to prune of one batch: its history as exported was read at `changed_seq`, and
/// `marker` (a `History_Pruned` success naming the export) stands for it afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PruneTicket {
    pub id: BatchId,
    pub changed_seq: Seq,
    pub marker: NewEvent,
}

/// What became of one batch of a `prune_histories` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum PruneAnswer {
    /// Its history is gone from the store: `events` events and `runs` runs were removed, and
    /// the marker recorded at `marker_seq`.
    Pruned { events: u64, runs: u64, marker_seq: Seq },
    /// It changed since it was exported (a pass, an operator), or a run is open on it: nothing
    /// was removed; the next prune exports it again.
    Moved { changed_seq: Seq },
    /// Its history was pruned already.
    AlreadyPruned,
    /// The store has no such batch.
    NotFound,
}

/// What became of one batch of a `restore_histories` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum RestoreAnswer {
    /// Its pruned history is back: `events` events and `runs` runs were put back and the
    /// `History_Pruned` event removed.
    Restored { events: u64, runs: u64 },
    /// Its history is in the store (never pruned, or imported already): nothing was written.
    NotPruned,
    /// The store has no such batch: an export restores a pruned batch of the store it came
    /// from, not a batch the store never had.
    NotFound,
}

port_trait! {
    /// Exporting, pruning and restoring batch histories.
    pub trait RetentionStore {
        /// The named batches' whole histories (`BatchHistory`), in the order asked, each once,
        /// unknown ids left out. What an export writes.
        #[checked(write_rules::check_page("ids", ids.len(), MAX_RETENTION_PAGE)?)]
        async fn histories(&self, ids: &[BatchId]) -> StoreResult<Vec<BatchHistory>>;

        /// Prunes each ticket's batch in one transaction: unless it changed since
        /// `changed_seq` or a run is open on it, every event but its effective ones, its runs,
        /// checkpoints and saved run outputs are removed, and the marker is appended. Answers
        /// in the order asked.
        #[checked(
            write_rules::check_page("tickets", tickets.len(), MAX_RETENTION_PAGE)?;
            check_tickets(&tickets)?
        )]
        async fn prune_histories(&self, tickets: Vec<PruneTicket>) -> StoreResult<Vec<PruneAnswer>>;

        /// Puts each pruned batch's exported history back, each batch whole or not at all: its
        /// `History_Pruned` event is removed, every exported event the store lacks is inserted
        /// at its seq and every exported run at its generation, and the batch's summary is
        /// worked out from the whole log again. Events appended after the prune stay. Answers
        /// in the order asked.
        #[checked(
            write_rules::check_page("histories", histories.len(), MAX_RETENTION_PAGE)?;
            check_histories(&histories)?
        )]
        async fn restore_histories(&self, histories: Vec<BatchHistory>) -> StoreResult<Vec<RestoreAnswer>>;
    }
}

fn check_tickets(tickets: &[PruneTicket]) -> StoreResult<()> {
    for ticket in tickets {
        if !ticket.marker.event_type.is_history_pruned() || ticket.marker.run.is_some() {
            return Err(StoreError::Invalid(autocomp_model::InvalidInput::new(
                "marker",
                ticket.marker.event_type.as_str(),
                format!("must be a {} event outside any run", EventType::HISTORY_PRUNED),
            )));
        }
        autocomp_model::check_object("marker details", &ticket.marker.details)?;
    }
    Ok(())
}

fn check_histories(histories: &[BatchHistory]) -> StoreResult<()> {
    for history in histories {
        let id = &history.batch.id;
        let foreign = |what: &str| {
            StoreError::Invalid(autocomp_model::InvalidInput::new(
                "history",
                id.as_str(),
                format!("holds {what} of another batch"),
            ))
        };
        if history.batch.events.iter().any(|event| event.batch_id != *id) {
            return Err(foreign("an event"));
        }
        if history.runs.iter().any(|run| run.batch_id != *id) {
            return Err(foreign("a run"));
        }
        if let Some(event) = history.batch.events.iter().find(|event| event.event_type.is_history_pruned()) {
            return Err(StoreError::Invalid(autocomp_model::InvalidInput::new(
                "history",
                id.as_str(),
                format!(
                    "holds a {} event (seq {}): an export holds what was pruned",
                    EventType::HISTORY_PRUNED,
                    event.seq
                ),
            )));
        }
        for event in &history.batch.events {
            autocomp_model::check_object("details", &event.details)?;
        }
    }
    Ok(())
}
