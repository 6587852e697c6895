//! `autocomp demo`: a pipeline on the embedded SQLite store and index, with no servers. Until
//! the runner and the example components land (issue #4) it drives one simulated step
//! in-process, but through the real store, batch index, trigger semantics, claims and fencing.

use std::io::Write;
use std::path::Path;

use std::sync::Arc;

use autocomp_sboi::{BatchIndex, IndexEngine, IndexError, LocalIndex};
use autocomp_store::{
    Agent, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, ObjectStore, Outcome, RunHolder,
    SqliteStore, StoreError, StoreResult, Trigger,
};
use serde_json::json;

const DATA_RECEIVED: &str = "Data_Received";
const CHECKSUMS_VERIFIED: &str = "Checksums_Verified";

pub async fn run(dir: &Path, batches: usize) -> StoreResult<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::Unavailable(format!("cannot create demo directory {}: {e}", dir.display())))?;
    let store = Arc::new(SqliteStore::open(dir.join("store.db")).await?);
    let index = LocalIndex::new(IndexEngine::open(dir.join("index")).map_err(index_error)?, store.clone());
    let mut out = std::io::stdout().lock();
    let say = |out: &mut dyn Write, text: String| writeln!(out, "{text}").ok();

    let received = EventType::new(DATA_RECEIVED)?;
    let verified = EventType::new(CHECKSUMS_VERIFIED)?;
    let trigger_agent = Agent::new(format!("batch-trigger/{}@demo#{}", env!("CARGO_PKG_VERSION"), std::process::id()))?;
    for n in 0..batches {
        let id = BatchId::new(format!("B{:012}-RT1", 400_022_028_241u64 + n as u64))?;
        let location = dir.join("incoming").join(id.as_str());
        let created = store
            .create_batch(
                NewBatch::new(id.clone(), BatchType::new("RoundTrip")?).with_location(location.display().to_string()),
            )
            .await?;
        if created.batch().events.is_empty() {
            store.append_event(&id, NewEvent::new(received.clone(), Outcome::Success, trigger_agent.clone())).await?;
        }
    }
    say(&mut out, format!("registered {batches} batches in {}", store.path().display()));

    // The checksum step's trigger, exactly as a component would declare it.
    let trigger =
        Trigger { requires: vec![received.clone()], blocked_by: vec![verified.clone()], ..Trigger::default() };
    let component = ComponentName::new("checksum-verifier")?;
    let ready = index.query(&trigger).await.map_err(index_error)?;
    say(&mut out, format!("{} batches are ready for {component} (asked the batch index)", ready.len()));

    // A worker that stalls after claiming: a second one takes over, and the first is fenced.
    if let Some(first) = ready.first() {
        let stalled = holder(&component, 1)?;
        let stale = store.claim(first, &component, &stalled).await?;
        let successor = store.claim(first, &component, &holder(&component, 2)?).await?;
        let late = NewEvent::new(verified.clone(), Outcome::Success, stalled.agent.clone())
            .in_run(component.clone(), stale.generation());
        match store.append_event(first, late).await {
            Err(e) if e.is_fenced() => say(&mut out, format!("a stalled worker woke up and was refused: {e}")),
            other => return Err(StoreError::Conflict(format!("fencing did not hold: {other:?}"))),
        };
        store.release(first, &component, successor.generation()).await?;
    }

    let worker = holder(&component, 3)?;
    for (n, id) in ready.iter().enumerate() {
        let claim = store.claim(id, &component, &worker).await?;
        // Every seventh batch is "broken", so the table shows failures too.
        let (outcome, details) = if n % 7 == 3 {
            (
                Outcome::Failure,
                json!({"failures": [{"reference": "data/page-0001.jp2", "type": "checksum", "description": "md5 mismatch"}]}),
            )
        } else {
            (Outcome::Success, json!({}))
        };
        let event = NewEvent::new(verified.clone(), outcome, worker.agent.clone())
            .with_details(details)
            .in_run(component.clone(), claim.generation());
        store.append_event(id, event).await?;
    }

    let all = store.list_batches(None, batches.min(10_000)).await?;
    say(&mut out, String::new());
    say(&mut out, format!("{:<20} {:<16} {}", "batch", DATA_RECEIVED, CHECKSUMS_VERIFIED));
    for batch in &all {
        let state = |event_type: &EventType| match batch.effective().get(event_type) {
            Some(e) => e.outcome.as_str().to_owned(),
            None if trigger.matches(batch) => "ready".to_owned(),
            None => "waiting".to_owned(),
        };
        say(&mut out, format!("{:<20} {:<16} {}", batch.id, state(&received), state(&verified)));
    }
    let head = store.head().await?;
    say(&mut out, String::new());
    say(
        &mut out,
        format!(
            "store head seq {head}. This demo drives one simulated step in-process; the runner, \
             the BagIt components and cron-style rounds arrive with issue #4."
        ),
    );
    Ok(())
}

fn index_error(error: IndexError) -> StoreError {
    match error {
        IndexError::Store(e) => e,
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn holder(component: &ComponentName, worker: u32) -> StoreResult<RunHolder> {
    let (host, pid) = (format!("demo-worker-{worker}"), std::process::id());
    let agent = Agent::new(format!("{component}/{}@{host}#{pid}", env!("CARGO_PKG_VERSION")))?;
    Ok(RunHolder { agent, host, pid })
}

/// The exit code of a command that failed with this store error (README: exit codes).
pub fn exit_code(error: &StoreError) -> u8 {
    match error {
        StoreError::Invalid(_) | StoreError::NotFound(_) => 2,
        StoreError::Unavailable(_) => 5,
        StoreError::Conflict(_) | StoreError::Fenced { .. } => 1,
    }
}
