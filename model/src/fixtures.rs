//! Hand-built batches, events and a descriptor for the model's unit tests (one copy for
//! every module's tests).

use serde_json::Map;

use super::{
    Agent, Batch, BatchId, BatchType, ComponentDescriptor, ComponentName, Event, EventType, Outcome, Run, RunHolder,
    RunRef, RunState, Seq, Timestamp, Trigger,
};

pub(crate) fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

pub(crate) fn descriptor() -> ComponentDescriptor {
    let trigger = Trigger::builder().requires("Checksums_Verified").blocked_by("Pages_Counted").build();
    ComponentDescriptor::new(ComponentName::new("page-counter").unwrap(), "1.0.0", ty("Pages_Counted"), trigger)
}

pub(crate) fn event(seq: i64, kind: &str, outcome: Outcome, details: serde_json::Value, at: i64) -> Event {
    Event {
        seq: Seq(seq),
        batch_id: BatchId::new("B1").unwrap(),
        event_type: ty(kind),
        outcome,
        agent: Agent::new("test").unwrap(),
        at: Timestamp(at),
        details,
        run: None::<RunRef>,
        resets: Vec::new(),
    }
}

pub(crate) fn batch(events: Vec<Event>, now: i64) -> Batch {
    Batch {
        id: BatchId::new("B1").unwrap(),
        batch_type: BatchType::new("RoundTrip").unwrap(),
        priority: 0,
        metadata: Map::new(),
        created_seq: Seq(1),
        modified_seq: Seq(1),
        changed_seq: Seq(1),
        created_at: Timestamp(0),
        modified_at: Timestamp(0),
        events,
        open_runs: Vec::new(),
        as_of: Timestamp(now),
    }
}

/// An open run of `component` on `batch()`'s batch.
pub(crate) fn open_run(component: &str) -> Run {
    Run {
        batch_id: BatchId::new("B1").unwrap(),
        component: ComponentName::new(component).unwrap(),
        generation: 1,
        holder: RunHolder {
            agent: Agent::new("test").unwrap(),
            host: "h".into(),
            pid: 1,
            claim_key: None,
            liveness: Some("local:h:1:a".into()),
        },
        started_at: Timestamp(0),
        claim_seq: Seq(2),
        state: RunState::Open,
        ended_at: None,
        transient: false,
    }
}
