//! The index schema and the one document per batch, built from the batch's summary (the
//! store's `BatchSummary`: its effective events without details, its running
//! components). Everything a trigger clause asks is precomputed here as an exact
//! term or a fast field, so a query is term lookups and one range, never a log scan.

use std::collections::BTreeSet;

use autocomp_model::{BatchId, BatchSummary, Outcome, Timestamp};
use serde::{Deserialize, Serialize};
use tantivy::schema::{FAST, Field, INDEXED, STORED, STRING, Schema, TantivyDocument, Value};
use tantivy::{Term, doc};

/// Bumped whenever the fields change; an index with another version is rebuilt.
/// 2: the `absent` field and the vocabulary in the commit payload.
/// 3: `stale` and `skipped`; a stale effective event is in no other per-type field.
/// (Still 3: an acknowledged failure of type `T` is the term `acknowledged:T` in the `failed`
/// field, beside `T`. An index built before holds none, since no failure was acknowledged
/// before the action existed, so it needs no rebuild.)
pub const SCHEMA_VERSION: u32 = 3;

/// The `failed` field's term for an acknowledged failure of a type: `acknowledged:T`. Event
/// types hold no `:`, so it is never a type's own term.
pub(crate) fn acknowledged_term(event_type: &str) -> String {
    format!("{ACKNOWLEDGED_PREFIX}{event_type}")
}

const ACKNOWLEDGED_PREFIX: &str = "acknowledged:";

/// The event types the documents of one commit were built knowing: each document holds
/// `absent:T` for every type `T` here that the batch has no current effective event of. Append-only,
/// and every type present in any document is in it, so `blocked_by T` is `Must absent:T`
/// for a known `T` (a sparse term that leads the intersection) and vacuous for any other.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Vocabulary(BTreeSet<String>);

impl Vocabulary {
    pub fn contains(&self, event_type: &str) -> bool {
        self.0.contains(event_type)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The types of this vocabulary not in `present` (sorted by name, as the vocabulary
    /// is): one merge walk, no set built per document.
    pub fn absent_from<'a>(&'a self, present: impl Iterator<Item = &'a str>) -> impl Iterator<Item = &'a str> {
        let mut present = present.peekable();
        self.0.iter().map(String::as_str).filter(move |event_type| {
            while present.next_if(|held| held < event_type).is_some() {}
            present.peek() != Some(event_type)
        })
    }

    /// This vocabulary plus every effective event type of `batches` it lacks, or `None`
    /// when it already knows them all.
    pub fn grown_by(&self, batches: &[BatchSummary]) -> Option<Vocabulary> {
        let mut missing = batches
            .iter()
            .flat_map(|batch| batch.effective.iter().map(|event| event.event_type.as_str()))
            .filter(|event_type| !self.contains(event_type))
            .peekable();
        missing.peek()?;
        let mut grown = self.clone();
        grown.0.extend(missing.map(str::to_owned));
        Some(grown)
    }
}

#[derive(Clone, Copy)]
pub struct Fields {
    pub id: Field,
    pub batch_type: Field,
    pub priority: Field,
    pub created_seq: Field,
    pub modified_seq: Field,
    pub changed_seq: Field,
    /// Store-clock millis of the newest content change or event (for `settled_for`).
    pub last_activity: Field,
    /// Event types with an effective event, any outcome.
    pub present: Field,
    pub succeeded: Field,
    pub failed: Field,
    /// Effective events older than the last content change.
    pub old: Field,
    /// Effective events at least as new as the last content change (`present` minus `old`).
    pub current: Field,
    /// Effective events that are failures flagged `transient`.
    pub transient: Field,
    /// Effective events that are successes recorded by `skip`.
    pub skipped: Field,
    /// Effective events worked out from content the batch no longer has. Such an event is
    /// in no other per-type field: triggers and selections count only current events.
    pub stale: Field,
    /// Components with an open run on the batch.
    pub running: Field,
    /// Vocabulary types with no effective event (not stored: derived from `present`).
    pub absent: Field,
}

impl Fields {
    pub fn schema() -> (Schema, Fields) {
        let mut builder = Schema::builder();
        let string = STRING | STORED;
        let number = INDEXED | FAST | STORED;
        let fields = Fields {
            id: builder.add_text_field("id", STRING | STORED | FAST),
            batch_type: builder.add_text_field("type", string.clone()),
            priority: builder.add_i64_field("priority", number.clone()),
            created_seq: builder.add_i64_field("created_seq", number.clone()),
            modified_seq: builder.add_i64_field("modified_seq", STORED),
            changed_seq: builder.add_i64_field("changed_seq", STORED),
            last_activity: builder.add_i64_field("last_activity", number),
            present: builder.add_text_field("present", string.clone()),
            succeeded: builder.add_text_field("succeeded", string.clone()),
            failed: builder.add_text_field("failed", string.clone()),
            old: builder.add_text_field("old", string.clone()),
            current: builder.add_text_field("current", string.clone()),
            transient: builder.add_text_field("transient", string.clone()),
            skipped: builder.add_text_field("skipped", string.clone()),
            stale: builder.add_text_field("stale", string.clone()),
            running: builder.add_text_field("running", string),
            absent: builder.add_text_field("absent", STRING),
        };
        (builder.build(), fields)
    }

    pub fn from_schema(schema: &Schema) -> tantivy::Result<Fields> {
        let get = |name: &str| schema.get_field(name);
        Ok(Fields {
            id: get("id")?,
            batch_type: get("type")?,
            priority: get("priority")?,
            created_seq: get("created_seq")?,
            modified_seq: get("modified_seq")?,
            changed_seq: get("changed_seq")?,
            last_activity: get("last_activity")?,
            present: get("present")?,
            succeeded: get("succeeded")?,
            failed: get("failed")?,
            old: get("old")?,
            current: get("current")?,
            transient: get("transient")?,
            skipped: get("skipped")?,
            stale: get("stale")?,
            running: get("running")?,
            absent: get("absent")?,
        })
    }

    pub fn id_term(&self, id: &BatchId) -> Term {
        Term::from_field_text(self.id, id.as_str())
    }

    pub fn document(&self, batch: &BatchSummary, vocabulary: &Vocabulary) -> TantivyDocument {
        let mut document = doc!(
            self.id => batch.id.as_str(),
            self.batch_type => batch.batch_type.as_str(),
            self.priority => i64::from(batch.priority),
            self.created_seq => batch.created_seq.0,
            self.modified_seq => batch.modified_seq.0,
            self.changed_seq => batch.changed_seq.0,
            self.last_activity => batch.last_activity.millis(),
        );
        let (stale, current): (Vec<_>, Vec<_>) =
            batch.effective.iter().partition(|event| event.is_stale_at(batch.modified_seq));
        for event in &stale {
            document.add_text(self.stale, event.event_type.as_str());
        }
        for event in &current {
            let event_type = event.event_type.as_str();
            document.add_text(self.present, event_type);
            let outcome_field = match event.outcome {
                Outcome::Success => self.succeeded,
                Outcome::Failure => self.failed,
            };
            document.add_text(outcome_field, event_type);
            let age_field = if event.seq < batch.modified_seq { self.old } else { self.current };
            document.add_text(age_field, event_type);
            if event.transient {
                document.add_text(self.transient, event_type);
            }
            if event.skipped {
                document.add_text(self.skipped, event_type);
            }
            if event.acknowledged {
                document.add_text(self.failed, acknowledged_term(event_type));
            }
        }
        for component in &batch.running {
            document.add_text(self.running, component.as_str());
        }
        debug_assert!(batch.effective.windows(2).all(|w| w[0].event_type < w[1].event_type), "effective not sorted");
        for event_type in vocabulary.absent_from(current.iter().map(|event| event.event_type.as_str())) {
            document.add_text(self.absent, event_type);
        }
        document
    }

    /// Adds `absent:T` for each vocabulary type the document has no `present` term of: how
    /// a stored document (which lacks `absent`) is rebuilt for a grown vocabulary.
    pub fn add_absent(&self, document: &mut TantivyDocument, vocabulary: &Vocabulary) {
        let mut present: Vec<String> =
            document.get_all(self.present).filter_map(|v| v.as_str().map(str::to_owned)).collect();
        present.sort();
        let absent: Vec<&str> = vocabulary.absent_from(present.iter().map(String::as_str)).collect();
        for event_type in absent {
            document.add_text(self.absent, event_type);
        }
    }

    /// What the index holds for one batch, read back for comparisons and `explain`.
    pub fn summary(&self, document: &TantivyDocument) -> IndexedBatch {
        let text = |field| -> Vec<String> {
            let mut values: Vec<String> =
                document.get_all(field).filter_map(|v| v.as_str().map(str::to_owned)).collect();
            values.sort();
            values
        };
        let number = |field| document.get_first(field).and_then(|v| v.as_i64()).unwrap_or_default();
        let (acknowledged, failed): (Vec<String>, Vec<String>) =
            text(self.failed).into_iter().partition(|term| term.starts_with(ACKNOWLEDGED_PREFIX));
        let acknowledged = acknowledged.into_iter().map(|term| term[ACKNOWLEDGED_PREFIX.len()..].to_owned()).collect();
        IndexedBatch {
            id: text(self.id).pop().unwrap_or_default(),
            batch_type: text(self.batch_type).pop().unwrap_or_default(),
            priority: number(self.priority),
            created_seq: number(self.created_seq),
            modified_seq: number(self.modified_seq),
            changed_seq: number(self.changed_seq),
            last_activity: Timestamp(number(self.last_activity)),
            present: text(self.present),
            succeeded: text(self.succeeded),
            failed,
            acknowledged,
            old: text(self.old),
            transient: text(self.transient),
            skipped: text(self.skipped),
            stale: text(self.stale),
            running: text(self.running),
        }
    }
}

/// One batch as the index sees it; multi-valued fields sorted. The sboi service's
/// `/v1/document` answers with it, so `explain` works the same against either adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IndexedBatch {
    pub id: String,
    pub batch_type: String,
    pub priority: i64,
    pub created_seq: i64,
    pub modified_seq: i64,
    pub changed_seq: i64,
    pub last_activity: Timestamp,
    pub present: Vec<String>,
    pub succeeded: Vec<String>,
    pub failed: Vec<String>,
    /// The failed types an operator acknowledged (each also in `failed`).
    #[serde(default)]
    pub acknowledged: Vec<String>,
    pub old: Vec<String>,
    pub transient: Vec<String>,
    #[serde(default)]
    pub skipped: Vec<String>,
    #[serde(default)]
    pub stale: Vec<String>,
    pub running: Vec<String>,
}
