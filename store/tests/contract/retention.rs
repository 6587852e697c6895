//! The contract of pruning and restoring batch histories, run by the shared suite
//! (`operations.rs`) against every backend: a pruned batch keeps its effective events and a
//! `History_Pruned` event, loses everything else, is ready for nothing (not even forced), and
//! its export put back restores its log and runs exactly; a batch that moved since its export
//! is not pruned.

use autocomp_model::*;
use autocomp_store::*;
use serde_json::json;

use super::{Fixture, agent, component, holder, id, register, ty};

fn marker(export: &str) -> NewEvent {
    NewEvent::new(EventType::history_pruned(), Outcome::Success, agent("autocomp-prune"))
        .with_details(json!({"export": export}))
}

async fn worked(f: &Fixture, batch: &str) {
    let b = id(batch);
    let c = component("archiver");
    // A failure, a Reset and a success: only the success stays effective.
    let first = f.store.claim(&b, &c, &holder("a")).await.unwrap();
    let failed = NewEvent::new(ty("Data_Archived"), Outcome::Failure, agent("a"))
        .with_details(json!({"reason": "disk full \u{0}"}))
        .in_run(c.clone(), first.generation());
    f.store.append_event(&b, failed).await.unwrap();
    let reset = NewEvent::reset(vec![ty("Data_Archived")], agent("operator:alice"), json!({"reason": "rerun"}));
    f.store.append_event(&b, reset).await.unwrap();
    let second = f.store.claim(&b, &c, &holder("b")).await.unwrap();
    let done = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("b")).in_run(c.clone(), second.generation());
    f.store.append_event(&b, done).await.unwrap();
}

pub(crate) async fn a_pruned_history_keeps_the_final_state_and_comes_back_whole_from_its_export(f: Fixture) {
    register(&f.store, "B1").await;
    worked(&f, "B1").await;
    let b = id("B1");
    let exported = f.store.histories(&[id("NOPE"), b.clone(), b.clone()]).await.unwrap();
    assert_eq!(exported.len(), 1, "unknown ids left out, each once");
    let exported = exported.into_iter().next().unwrap();
    assert_eq!(exported.batch.events.len(), 3, "{:?}", exported.batch.events);
    assert_eq!(exported.runs.len(), 2, "closed runs too: {:?}", exported.runs);
    let before = f.store.get_batch(&b).await.unwrap();

    // A ticket read before the batch last changed is refused: the batch moved.
    let stale = PruneTicket { id: b.clone(), changed_seq: Seq(exported.batch.changed_seq.0 - 1), marker: marker("x") };
    let answers = f.store.prune_histories(vec![stale]).await.unwrap();
    assert_eq!(answers, [PruneAnswer::Moved { changed_seq: exported.batch.changed_seq }]);
    assert_eq!(f.store.get_batch(&b).await.unwrap().events, before.events, "nothing removed");

    let ticket =
        PruneTicket { id: b.clone(), changed_seq: exported.batch.changed_seq, marker: marker("2026-11.jsonl.zst") };
    let missing = PruneTicket { id: id("NOPE"), changed_seq: Seq(1), marker: marker("x") };
    let answers = f.store.prune_histories(vec![ticket.clone(), missing]).await.unwrap();
    let PruneAnswer::Pruned { events, runs, marker_seq } = answers[0].clone() else { panic!("{answers:?}") };
    assert_eq!((events, runs), (2, 2), "the failure, the Reset and the runs went");
    assert_eq!(answers[1], PruneAnswer::NotFound);

    // What stays: the effective success and the marker naming the export.
    let pruned = f.store.get_batch(&b).await.unwrap();
    let kept: Vec<(&str, Outcome)> = pruned.events.iter().map(|e| (e.event_type.as_str(), e.outcome)).collect();
    assert_eq!(kept, [("Data_Archived", Outcome::Success), ("History_Pruned", Outcome::Success)]);
    assert_eq!(pruned.events[1].seq, marker_seq);
    assert_eq!(pruned.events[1].details["export"], "2026-11.jsonl.zst");
    assert_eq!(pruned.events[0], before.events[2], "the final state is the event it was");
    let summary = f.store.get_summaries(std::slice::from_ref(&b)).await.unwrap().remove(0);
    assert_eq!(summary, BatchSummary::of(&pruned), "the kept summary is the pruned batch's");
    assert!(summary.pruned().is_some());
    let head = f.store.batch_head(&b).await.unwrap();
    assert_eq!(head.event_count, 2, "the log's length follows what was removed");

    // Ready for nothing, not even forced.
    let reader: ComponentDescriptor = serde_json::from_value(json!({
        "name": "reader", "version": "1.0.0", "event_type": "Data_Read",
        "trigger": {"requires": ["Data_Archived"]},
        "max_attempts": 3, "retry_backoff": "5m", "queue_size": 10, "max_runtime": "1h",
    }))
    .unwrap();
    let not_ready = reader.readiness(&pruned).unwrap_err();
    assert_eq!(not_ready.clause, "pruned", "{}", not_ready.reason);
    let request = ReadyClaimRequest {
        batches: vec![b.clone()],
        descriptor: reader.clone(),
        holder: holder("r"),
        force: true,
        known_steering: None,
        exclusive: false,
        takeovers: Vec::new(),
    };
    let claims = f.store.claim_ready(&request).await.unwrap();
    let answer = claims.answers.into_iter().next().unwrap().unwrap();
    assert!(answer.claim.is_none(), "a forced claim takes no pruned batch: {answer:?}");
    let refused = f.store.append_event(&b, marker("again")).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "type"), "{refused}");

    // Pruning twice does nothing.
    let answers = f.store.prune_histories(vec![ticket]).await.unwrap();
    assert_eq!(answers, [PruneAnswer::AlreadyPruned]);

    // The export put back: the same log and runs, the marker gone, ready as before.
    let answers = f.store.restore_histories(vec![exported.clone()]).await.unwrap();
    assert_eq!(answers, [RestoreAnswer::Restored { events: 2, runs: 2 }]);
    let restored = f.store.histories(std::slice::from_ref(&b)).await.unwrap().remove(0);
    assert_eq!(restored.batch.events, exported.batch.events, "every event as it was, at its seq");
    assert_eq!(restored.runs, exported.runs, "every run as it was");
    assert!(restored.batch.changed_seq > pruned.changed_seq, "the index sees the batch change");
    let summary = f.store.get_summaries(std::slice::from_ref(&b)).await.unwrap().remove(0);
    assert_eq!(summary, BatchSummary::of(&restored.batch));
    assert!(summary.pruned().is_none());
    assert_eq!(f.store.batch_head(&b).await.unwrap().event_count, 3);
    assert!(reader.readiness(&restored.batch).is_ok(), "ready for its reader again");

    // Importing twice does nothing; a batch the store never had is not made up.
    assert_eq!(f.store.restore_histories(vec![exported.clone()]).await.unwrap(), [RestoreAnswer::NotPruned]);
    let mut stranger = exported;
    stranger.batch.id = id("B9");
    stranger.batch.events.iter_mut().for_each(|event| event.batch_id = id("B9"));
    stranger.runs.iter_mut().for_each(|run| run.batch_id = id("B9"));
    assert_eq!(f.store.restore_histories(vec![stranger]).await.unwrap(), [RestoreAnswer::NotFound]);
}

pub(crate) async fn a_batch_with_an_open_run_or_bad_tickets_is_not_pruned(f: Fixture) {
    register(&f.store, "B1").await;
    let b = id("B1");
    f.store.claim(&b, &component("archiver"), &holder("a")).await.unwrap();
    let read = f.store.histories(std::slice::from_ref(&b)).await.unwrap().remove(0);
    let ticket = PruneTicket { id: b.clone(), changed_seq: read.batch.changed_seq, marker: marker("x") };
    let answers = f.store.prune_histories(vec![ticket.clone()]).await.unwrap();
    assert!(matches!(answers[0], PruneAnswer::Moved { .. }), "an open run: {answers:?}");

    let not_a_marker =
        PruneTicket { marker: NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("x")), ..ticket };
    let refused = f.store.prune_histories(vec![not_a_marker]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "marker"), "{refused}");
    let too_many =
        vec![PruneTicket { id: b.clone(), changed_seq: Seq(1), marker: marker("x") }; MAX_RETENTION_PAGE + 1];
    let refused = f.store.prune_histories(too_many).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "tickets"), "{refused}");
    assert_eq!(f.store.get_batch(&b).await.unwrap().events.len(), 0, "nothing written");
}
