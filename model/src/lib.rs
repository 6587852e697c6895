//! The data model shared by every part of autocomp: validated names, batches, events, runs,
//! reports, the effective view of a log and the trigger predicate over it.
//! Everything here is plain data and pure functions; no I/O.

mod batch;
mod contract;
pub mod duration_text;
mod effective;
#[cfg(test)]
mod fixtures;
mod interest;
mod names;
mod output;
mod registry;
mod report;
mod schedule;
#[cfg(feature = "json-schema")]
pub mod schema;
mod schema_digest;
mod selection;
mod steering;
mod summary;
mod time;
mod trigger;
mod work;

pub use batch::check_object;
pub use batch::{Batch, CONTENT_SEQ_KEY, Event, NewBatch, NewEvent, Outcome, Run, RunHolder, RunRef, RunState};
pub use contract::{
    CONTRACT_FIX, Incompatibility, ReadCheck, broken_contract, check_read, check_reads, published_fields,
    required_fields,
};
pub use effective::EffectiveView;
pub use interest::{ChangeConcern, ChangeInterest, MAX_CONCERN_PAYLOAD};
pub use names::{
    Agent, BatchId, BatchType, ComponentName, EventType, IdempotencyKey, InvalidInput, PoolName, is_concealing,
};
pub use output::{DEFAULT_OUTPUT_BYTES, MAX_OUTPUT_BYTES, MAX_OUTPUT_STREAMS, OutputCapture, OutputStream, RunOutput};
pub use registry::{
    ComponentDescriptor, ComponentState, HostRecord, NOT_STARTED, NotReady, PassOutcome, PassPhase, PassRecord,
    RegisteredComponent, ResultRead, Retirement,
};
pub use report::{Failure, OUTPUT_KEY, RESULT_KEY, RESULT_SCHEMA_KEY, Report};
pub use schedule::Schedule;
pub use schema_digest::{schema_digest, short_digest};
pub use selection::Selection;
pub use steering::{
    Applied, Breaker, Hold, HoldKind, MAX_BREAKER_BATCHES, MAX_POOL_SIZE, Pool, Steering, SteeringChange,
    SteeringEntry, SteeringRefusal, SteeringRequest,
};
pub use summary::{BatchFacts, BatchSummary, EventSummary, SummaryAt, SummaryHeader, SummaryState};
pub use time::{Seq, Timestamp};
pub use trigger::{Clause, PRUNED, Trigger, TriggerBuilder, TypeNames, order_key};
pub use work::{
    BacklogSample, DURATION_BOUNDS_MS, DURATION_BUCKETS, MAX_BACKLOG_SAMPLES, MAX_WORK_PER_PASS, SeriesStep,
    WORK_HOURS_KEPT, WORK_MINUTES_IN_HOUR, WORK_MINUTES_KEPT, WorkDone, WorkHistory, WorkPoint, WorkResult,
    WorkTallies, WorkTally,
};

/// The largest `details` or `metadata` document the store accepts, serialized.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
