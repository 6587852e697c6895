//! The Prometheus text of a fixed pipeline, pinned whole (ages masked), from a real SQLite
//! store and local index.

use std::time::Duration;

use autocomp_framework::config::Backends;
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentDescriptor, ComponentName, EventType, NewBatch, NewEvent, Outcome, PassOutcome,
    PassPhase, PassRecord, RunHolder, Schedule, Trigger, WorkDone,
};

use super::*;

/// Registers `name` as having ended a pass that reported `work`.
async fn register(
    store: &dyn autocomp_store::ObjectStore,
    name: &str,
    event_type: &str,
    requires: &str,
    tune: impl FnOnce(&mut ComponentDescriptor),
    work: Vec<WorkDone>,
) {
    let own = EventType::new(event_type).unwrap();
    let trigger = Trigger::builder().requires(requires).blocked_by(event_type).build();
    let mut descriptor = ComponentDescriptor::new(ComponentName::new(name).unwrap(), "1.0.0", own.clone(), trigger);
    tune(&mut descriptor);
    let phase = PassPhase::Ended { outcome: PassOutcome::Ok, summary: String::new(), duration_ms: 1, work };
    store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
}

fn done(result: WorkResult, duration_ms: u64) -> WorkDone {
    WorkDone { result, duration_ms }
}

/// The value of each series that depends on the wall clock, replaced.
fn without_ages(text: &str) -> String {
    let lines = text.lines().map(|line| match line.rsplit_once(' ') {
        Some((series, _)) if !line.starts_with('#') && series.contains("_age_seconds") => format!("{series} AGE"),
        _ => line.to_owned(),
    });
    lines.map(|line| line + "\n").collect()
}

/// Every family, each kind of sample and label, both silence rules, sources
/// without results: the text for one fixed registry and set of batches.
#[tokio::test]
async fn the_text_for_a_fixed_pipeline_is_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite://{}", dir.path().join("store.db").display());
    let index_url = format!("local:{}", dir.path().join("index").display());
    let backends = Backends { store: Some(store_url), index: Some(index_url), locks: None };
    let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
    let store = operator.store().await.unwrap();
    let silent = |d: &mut ComponentDescriptor| {
        d.source = true;
        d.silent_after = Some(Duration::from_secs(600));
    };
    register(store.as_ref(), "trigger", "Data_Received", "Delivered", silent, vec![]).await;
    let yearly = |d: &mut ComponentDescriptor| {
        d.schedule = Some(Schedule::parse("0 0 1 1 *").unwrap());
        d.max_runtime = Duration::from_millis(1500);
    };
    let work = vec![
        done(WorkResult::Success, 3),
        done(WorkResult::Success, 40),
        done(WorkResult::Failure, 700),
        done(WorkResult::Transient, 5_000_000),
    ];
    register(store.as_ref(), "checker", "Checked", "Data_Received", yearly, work).await;
    register(store.as_ref(), "auditor", "Audited", "Checked", |_| {}, vec![]).await;

    let agent = Agent::new("test").unwrap();
    for (batch, events) in [
        ("B1", &[("Data_Received", Outcome::Success)][..]),
        ("B2", &[("Data_Received", Outcome::Success), ("Checked", Outcome::Failure)]),
        ("B3", &[("Data_Received", Outcome::Success), ("Checked", Outcome::Success)]),
        ("B4", &[("Data_Received", Outcome::Success)]),
    ] {
        let batch = BatchId::new(batch).unwrap();
        store.create_batch(NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome) in events {
            let event = NewEvent::new(EventType::new(*event_type).unwrap(), *outcome, agent.clone());
            store.append_event(&batch, event).await.unwrap();
        }
    }
    let holder = RunHolder {
        agent: Agent::new("checker").unwrap(),
        host: "host1".into(),
        pid: 7,
        claim_key: None,
        liveness: None,
    };
    store.claim(&BatchId::new("B4").unwrap(), &ComponentName::new("checker").unwrap(), &holder).await.unwrap();

    let text = operator.metrics(&AlertDefaults::default()).await.unwrap();
    assert_eq!(without_ages(&text), PINNED, "{text}");
}

const PINNED: &str = r#"# HELP autocomp_batches Batches per component and state.
# TYPE autocomp_batches gauge
autocomp_batches{component="trigger",state="ready"} 0
autocomp_batches{component="trigger",state="person"} 0
autocomp_batches{component="trigger",state="waiting"} 0
autocomp_batches{component="trigger",state="working"} 0
autocomp_batches{component="trigger",state="retrying"} 0
autocomp_batches{component="trigger",state="failed"} 0
autocomp_batches{component="trigger",state="acknowledged"} 0
autocomp_batches{component="trigger",state="stale"} 0
autocomp_batches{component="trigger",state="skipped"} 0
autocomp_batches{component="trigger",state="success"} 4
autocomp_batches{component="checker",state="ready"} 1
autocomp_batches{component="checker",state="person"} 0
autocomp_batches{component="checker",state="waiting"} 0
autocomp_batches{component="checker",state="working"} 1
autocomp_batches{component="checker",state="retrying"} 0
autocomp_batches{component="checker",state="failed"} 1
autocomp_batches{component="checker",state="acknowledged"} 0
autocomp_batches{component="checker",state="stale"} 0
autocomp_batches{component="checker",state="skipped"} 0
autocomp_batches{component="checker",state="success"} 1
autocomp_batches{component="auditor",state="ready"} 1
autocomp_batches{component="auditor",state="person"} 0
autocomp_batches{component="auditor",state="waiting"} 3
autocomp_batches{component="auditor",state="working"} 0
autocomp_batches{component="auditor",state="retrying"} 0
autocomp_batches{component="auditor",state="failed"} 0
autocomp_batches{component="auditor",state="acknowledged"} 0
autocomp_batches{component="auditor",state="stale"} 0
autocomp_batches{component="auditor",state="skipped"} 0
autocomp_batches{component="auditor",state="success"} 0
# HELP autocomp_batches_overdue Batches ready for a component longer than its overdue_after (monitor default otherwise).
# TYPE autocomp_batches_overdue gauge
autocomp_batches_overdue{component="trigger"} 0
autocomp_batches_overdue{component="checker"} 0
autocomp_batches_overdue{component="auditor"} 0
# HELP autocomp_oldest_ready_age_seconds How long the batch ready the longest has been ready (since its last activity); 0 when none is.
# TYPE autocomp_oldest_ready_age_seconds gauge
autocomp_oldest_ready_age_seconds{component="trigger"} AGE
autocomp_oldest_ready_age_seconds{component="checker"} AGE
autocomp_oldest_ready_age_seconds{component="auditor"} AGE
# HELP autocomp_oldest_working_age_seconds How long the oldest open run of a component has been running; 0 when none is.
# TYPE autocomp_oldest_working_age_seconds gauge
autocomp_oldest_working_age_seconds{component="trigger"} AGE
autocomp_oldest_working_age_seconds{component="checker"} AGE
autocomp_oldest_working_age_seconds{component="auditor"} AGE
# HELP autocomp_last_pass_age_seconds Seconds since any host last reported a pass of the component.
# TYPE autocomp_last_pass_age_seconds gauge
autocomp_last_pass_age_seconds{component="trigger"} AGE
autocomp_last_pass_age_seconds{component="checker"} AGE
autocomp_last_pass_age_seconds{component="auditor"} AGE
# HELP autocomp_silent_after_seconds No pass on any host for this long makes the component silent (components silent by time, not schedule).
# TYPE autocomp_silent_after_seconds gauge
autocomp_silent_after_seconds{component="trigger"} 600
autocomp_silent_after_seconds{component="auditor"} 3600
# HELP autocomp_missed_passes Passes of its crontab schedule since any host last ran the component (components silent by schedule).
# TYPE autocomp_missed_passes gauge
autocomp_missed_passes{component="checker"} 0
# HELP autocomp_results_total Results recorded by a component's passes since it was registered, by outcome.
# TYPE autocomp_results_total counter
autocomp_results_total{component="checker",outcome="success"} 2
autocomp_results_total{component="checker",outcome="failure"} 1
autocomp_results_total{component="checker",outcome="transient"} 1
autocomp_results_total{component="auditor",outcome="success"} 0
autocomp_results_total{component="auditor",outcome="failure"} 0
autocomp_results_total{component="auditor",outcome="transient"} 0
# HELP autocomp_results_last_hour Results recorded by a component's passes in the last hour of store time, by outcome.
# TYPE autocomp_results_last_hour gauge
autocomp_results_last_hour{component="checker",outcome="success"} 2
autocomp_results_last_hour{component="checker",outcome="failure"} 1
autocomp_results_last_hour{component="checker",outcome="transient"} 1
autocomp_results_last_hour{component="auditor",outcome="success"} 0
autocomp_results_last_hour{component="auditor",outcome="failure"} 0
autocomp_results_last_hour{component="auditor",outcome="transient"} 0
# HELP autocomp_work_duration_seconds How long a component's work on a batch took, every outcome, since it was registered.
# TYPE autocomp_work_duration_seconds histogram
autocomp_work_duration_seconds_bucket{component="checker",le="0.001"} 0
autocomp_work_duration_seconds_bucket{component="checker",le="0.002"} 0
autocomp_work_duration_seconds_bucket{component="checker",le="0.005"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.01"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.025"} 1
autocomp_work_duration_seconds_bucket{component="checker",le="0.05"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.1"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.25"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="0.5"} 2
autocomp_work_duration_seconds_bucket{component="checker",le="1"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="2.5"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="5"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="10"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="30"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="60"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="120"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="300"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="600"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="1800"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="3600"} 3
autocomp_work_duration_seconds_bucket{component="checker",le="+Inf"} 4
autocomp_work_duration_seconds_sum{component="checker"} 5000.743
autocomp_work_duration_seconds_count{component="checker"} 4
autocomp_work_duration_seconds_bucket{component="auditor",le="0.001"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.002"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.005"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.01"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.025"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.05"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.1"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.25"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="0.5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="1"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="2.5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="5"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="10"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="30"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="60"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="120"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="300"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="600"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="1800"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="3600"} 0
autocomp_work_duration_seconds_bucket{component="auditor",le="+Inf"} 0
autocomp_work_duration_seconds_sum{component="auditor"} 0
autocomp_work_duration_seconds_count{component="auditor"} 0
# HELP autocomp_work_duration_last_hour_seconds A component's work durations over the last hour of store time: p50 and p95 (estimated within their histogram bucket; absent without results), sum and count.
# TYPE autocomp_work_duration_last_hour_seconds summary
autocomp_work_duration_last_hour_seconds{component="checker",quantile="0.5"} 0.05
autocomp_work_duration_last_hour_seconds{component="checker",quantile="0.95"} 3600
autocomp_work_duration_last_hour_seconds_sum{component="checker"} 5000.743
autocomp_work_duration_last_hour_seconds_count{component="checker"} 4
autocomp_work_duration_last_hour_seconds_sum{component="auditor"} 0
autocomp_work_duration_last_hour_seconds_count{component="auditor"} 0
# HELP autocomp_max_runtime_seconds A component's max_runtime: a run older than this is overdue.
# TYPE autocomp_max_runtime_seconds gauge
autocomp_max_runtime_seconds{component="trigger"} 3600
autocomp_max_runtime_seconds{component="checker"} 1.5
autocomp_max_runtime_seconds{component="auditor"} 3600
# HELP autocomp_component_held 1 while the component claims no new work: paused, draining or its circuit open (its own hold or the whole pipeline's).
# TYPE autocomp_component_held gauge
autocomp_component_held{component="trigger"} 0
autocomp_component_held{component="checker"} 0
autocomp_component_held{component="auditor"} 0
# HELP autocomp_contract_broken 1 while every pass of the component stops before any work: a result it reads is no longer published as it expects.
# TYPE autocomp_contract_broken gauge
autocomp_contract_broken{component="trigger"} 0
autocomp_contract_broken{component="checker"} 0
autocomp_contract_broken{component="auditor"} 0
# HELP autocomp_circuit_open 1 while the component's circuit breaker holds it (components with break_after).
# TYPE autocomp_circuit_open gauge
# HELP autocomp_breaker_consecutive_failures Consecutive permanent failures on distinct batches the circuit breaker counts (components with break_after).
# TYPE autocomp_breaker_consecutive_failures gauge
# HELP autocomp_pool_size A resource pool's size: batches' work it takes at once.
# TYPE autocomp_pool_size gauge
# HELP autocomp_pool_slots_in_use Open runs of the components that declare the pool: each holds one of its slots.
# TYPE autocomp_pool_slots_in_use gauge
# HELP autocomp_pool_waiting Batches ready for the components that declare the pool: each waits for a pass and a free slot.
# TYPE autocomp_pool_waiting gauge
# HELP autocomp_store_head The store's newest change (seq).
# TYPE autocomp_store_head gauge
autocomp_store_head 11
# HELP autocomp_index_lag_changes Store changes the batch index is behind.
# TYPE autocomp_index_lag_changes gauge
autocomp_index_lag_changes 0
"#;
