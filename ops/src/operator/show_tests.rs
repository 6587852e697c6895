//! `show`, `status` and `explain` against a real SQLite store, read without whole logs: a
//! long log shows its newest page and says how to reach the rest, `--all` streams all of it
//! in order, and states and explanations read from summaries and heads are those the whole
//! batches give.

use std::sync::Arc;

use autocomp_model::{
    Agent, Batch, BatchId, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder,
};
use autocomp_store::ObjectStore;
use serde_json::{Value, json};

use crate::operator::three_steps_tests::{ThreeSteps, three_steps};
use crate::operator::{Format, LogSpan, Operator, SHOW_EVENTS, TableFormat};

struct Fixture {
    operator: Operator,
    store: Arc<dyn ObjectStore>,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let ThreeSteps { operator, store, dir } = three_steps().await;
    Fixture { operator, store, _dir: dir }
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn event(kind: &str, outcome: Outcome, details: Value) -> NewEvent {
    NewEvent::new(EventType::new(kind).unwrap(), outcome, Agent::new("test").unwrap()).with_details(details)
}

async fn batch(store: &Arc<dyn ObjectStore>, name: &str, events: Vec<NewEvent>) -> Batch {
    store.create_batch(NewBatch::new(id(name), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    for new in events {
        store.append_event(&id(name), new).await.unwrap();
    }
    store.get_batch(&id(name)).await.unwrap()
}

/// A batch with a long log: `Data_Received`, then `n` progress notes.
async fn long_batch(store: &Arc<dyn ObjectStore>, name: &str, n: usize) -> Batch {
    let mut events = vec![event("Data_Received", Outcome::Success, json!({}))];
    events.extend((0..n).map(|i| event("Note_Made", Outcome::Success, json!({"summary": format!("note {i}")}))));
    batch(store, name, events).await
}

fn seqs(events: &Value) -> Vec<i64> {
    events.as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect()
}

#[tokio::test]
async fn show_lists_the_newest_page_and_says_how_to_see_older_events() {
    let f = fixture().await;
    let whole = long_batch(&f.store, "B1", 119).await;
    let all: Vec<i64> = whole.events.iter().map(|e| e.seq.0).collect();

    let shown = f.operator.show(&id("B1")).await.unwrap().to_json();
    assert_eq!(seqs(&shown["events"]), all[all.len() - SHOW_EVENTS..], "the newest page, oldest first");
    assert_eq!((shown["log"]["total"].as_u64(), shown["log"]["shown"].as_u64()), (Some(120), Some(50)));
    let older = shown["log"]["older_before"].as_i64().unwrap();
    assert_eq!(older, all[70]);
    assert_eq!(shown["log"]["older_command"], format!("autocomp show B1 --before {older}"));
    assert_eq!(shown["effective"]["Note_Made"]["seq"], all[119], "the effective view is the whole log's");
    assert_eq!(shown["components"]["verifier"], "ready");

    let text = f.operator.show(&id("B1")).await.unwrap().render(Format::Text);
    assert!(text.contains("log (120 events; the newest 50, oldest first):"), "{text}");
    assert!(text.contains(&format!("older events: autocomp show B1 --before {older}")), "{text}");
    assert!(text.contains("note 118") && !text.contains("note 68\n"), "{text}");

    // Paging back: the events before, in pages of the size asked, to the first.
    let b1 = id("B1");
    let page = f.operator.show_page(&b1, LogSpan::Page { before: Some(autocomp_model::Seq(older)), limit: 60 });
    let page = page.await.unwrap();
    let json = page.to_json();
    assert_eq!(seqs(&json["events"]), all[10..70]);
    assert_eq!(json["log"]["older_command"], format!("autocomp show B1 --before {} --limit 60", all[10]));
    let text = page.render(Format::Text);
    assert!(text.contains(&format!("the 60 before seq {older}")), "{text}");
    assert!(text.contains("newer events: autocomp show B1 --limit 60"), "{text}");
    let first = f.operator.show_page(&b1, LogSpan::Page { before: Some(autocomp_model::Seq(all[10])), limit: 60 });
    let first = first.await.unwrap().to_json();
    assert_eq!((seqs(&first["events"]), first["log"]["older_before"].clone()), (all[..10].to_vec(), Value::Null));

    // A short log is shown whole, and says nothing of older events.
    batch(&f.store, "B2", vec![event("Data_Received", Outcome::Success, json!({}))]).await;
    let text = f.operator.show(&id("B2")).await.unwrap().render(Format::Text);
    assert!(text.contains("log (1 events, oldest first):") && !text.contains("older events"), "{text}");
}

#[tokio::test]
async fn show_all_writes_every_event_oldest_first_a_page_at_a_time() {
    let f = fixture().await;
    let whole = long_batch(&f.store, "B1", 2_345).await;
    let all: Vec<i64> = whole.events.iter().map(|e| e.seq.0).collect();

    let mut json_out = Vec::new();
    f.operator.show_all(&id("B1"), Format::Json, &mut json_out).await.unwrap();
    let shown: Value = serde_json::from_slice(&json_out).expect("one JSON document");
    assert_eq!(seqs(&shown["events"]), all);
    assert_eq!(shown["events"][5]["details"]["summary"], "note 4");
    assert_eq!((shown["log"]["total"].as_u64(), shown["log"]["shown"].as_u64()), (Some(2_346), Some(2_346)));
    assert_eq!(shown["id"], "B1");

    let mut text_out = Vec::new();
    f.operator.show_all(&id("B1"), Format::Text, &mut text_out).await.unwrap();
    let text = String::from_utf8(text_out).unwrap();
    assert!(text.contains("log (2346 events, oldest first):"), "{}", &text[..2_000]);
    let (log, reports) = text.split_once("\nreports:\n").unwrap();
    let listed: Vec<i64> = log
        .lines()
        .skip_while(|line| !line.starts_with("log ("))
        .skip(2)
        .map(|line| line.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(listed, all, "every event once, in order");
    assert_eq!(reports.matches("  seq ").count(), all.len(), "every report");
}

/// Batches in every state: new, received, verified and being checked, failed, reset,
/// skipped, a long log, and one re-delivered after its check (stale); read back whole.
async fn batches_in_every_state(f: &Fixture) -> Vec<Batch> {
    let ok = |kind| event(kind, Outcome::Success, json!({}));
    let mut batches = vec![
        batch(&f.store, "B-new", vec![]).await,
        batch(&f.store, "B-received", vec![ok("Data_Received")]).await,
        batch(&f.store, "B-verified", vec![ok("Data_Received"), ok("Verified")]).await,
        batch(
            &f.store,
            "B-failed",
            vec![ok("Data_Received"), event("Verified", Outcome::Failure, json!({"summary": "2 files differ"}))],
        )
        .await,
        batch(
            &f.store,
            "B-reset",
            vec![ok("Data_Received"), event("Verified", Outcome::Failure, json!({"summary": "2 files differ"}))],
        )
        .await,
        batch(
            &f.store,
            "B-skipped",
            vec![ok("Data_Received"), event("Verified", Outcome::Success, json!({"skipped": true}))],
        )
        .await,
        long_batch(&f.store, "B-long", 1_500).await,
    ];
    // One is being worked on, one was re-delivered after its check (stale), one reset.
    let holder = RunHolder {
        agent: Agent::new("checker/1@h#1").unwrap(),
        host: "h".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    };
    f.store.claim(&id("B-verified"), &ComponentName::new("checker").unwrap(), &holder).await.unwrap();
    let modified = batches[1].modified_seq.0;
    let stale = event("Verified", Outcome::Success, json!({"content_seq": modified}));
    f.store.append_event(&id("B-received"), stale).await.unwrap();
    f.store.record_content_change(&id("B-received"), serde_json::Map::new()).await.unwrap();
    let reset =
        NewEvent::reset(vec![EventType::new("Verified").unwrap()], Agent::new("operator:x").unwrap(), json!({}));
    f.store.append_event(&id("B-reset"), reset).await.unwrap();
    for b in &mut batches {
        *b = f.store.get_batch(&b.id).await.unwrap();
    }
    batches
}

#[tokio::test]
async fn status_and_explain_read_summaries_and_heads_yet_answer_as_whole_batches_do() {
    let f = fixture().await;
    let mut batches = batches_in_every_state(&f).await;
    let status = f.operator.status(None, None).await.unwrap();
    let pipeline = f.operator.pipeline(f.store.as_ref()).await.unwrap();
    batches.sort_by(|a, b| a.id.cmp(&b.id));
    let expected: Vec<(BatchId, Vec<_>)> =
        batches.iter().map(|b| (b.id.clone(), pipeline.iter().map(|step| step.state_of(b)).collect())).collect();
    assert_eq!(status.rows, expected);
    let states: Vec<&str> = status.rows.iter().flat_map(|(_, s)| s.iter().map(|s| s.as_str())).collect();
    for state in ["ready", "waiting", "working", "failed", "stale", "skipped", "success"] {
        assert!(states.contains(&state), "{state} is among {states:?}");
    }
    let failed = f
        .operator
        .status(Some(&ComponentName::new("verifier").unwrap()), Some(autocomp_model::ComponentState::Stale))
        .await
        .unwrap();
    assert_eq!(failed.rows, [(id("B-received"), vec![autocomp_model::ComponentState::Stale])]);
    assert!(status.render(TableFormat::Csv).starts_with("id,verifier,checker,archiver\n"));

    for whole in &batches {
        for step in &pipeline {
            explains_as_the_whole_batch(&f, whole, step).await;
        }
    }
    let held = f.operator.explain(&id("B-reset"), &ComponentName::new("archiver").unwrap()).await.unwrap().held_up_by;
    assert_eq!(
        held,
        [
            "archiver waits for Checked: checker is waiting",
            "checker waits for Verified: verifier is ready and waits for its next pass"
        ]
    );
}

/// `explain` of `step` on `whole` from its head says what the whole batch says.
async fn explains_as_the_whole_batch(f: &Fixture, whole: &Batch, step: &crate::operator::Step) {
    let explained = f.operator.explain(&whole.id, step.name()).await.unwrap();
    let what = format!("{} for {}", whole.id, step.name());
    assert_eq!(explained.state, step.state_of(whole), "{what}");
    assert_eq!(explained.refusal, step.ready_in_store(whole).err(), "{what}");
    assert_eq!(explained.result.as_ref(), whole.effective().get(step.event_type()), "{what}");
    assert_eq!(explained.open_run.as_ref(), whole.open_run(step.name()), "{what}");
    let clauses: Vec<bool> = step.trigger().explain(whole, whole.as_of).into_iter().map(|(_, s)| s).collect();
    assert_eq!(explained.clauses.iter().map(|c| c.store).collect::<Vec<_>>(), clauses, "{what}");
}

/// `status` writes its rows straight into the output; what it writes is the document (and
/// the table) the views write from values and cells.
#[test]
fn status_renders_row_by_row_exactly_as_from_values() {
    use autocomp_model::ComponentState::{Failed, Ready, Success, Waiting};
    let names = |list: &[&str]| list.iter().map(|n| ComponentName::new(*n).unwrap()).collect::<Vec<_>>();
    let rows =
        vec![(id("B1"), vec![Ready, Waiting, Failed]), (id("B-with-a-long-id"), vec![Success, Success, Waiting])];
    for (components, rows) in [
        (names(&["verifier", "archiver", "checker-of-structure"]), rows.clone()),
        (names(&[]), vec![(id("B1"), vec![])]),
        (names(&["verifier"]), vec![]),
    ] {
        let view = crate::operator::StatusView {
            components: components.clone(),
            rows: rows.clone(),
            held: Vec::new(),
            refused: Vec::new(),
        };
        let values: Vec<Value> = rows
            .iter()
            .map(|(id, states)| {
                let map: serde_json::Map<String, Value> =
                    components.iter().zip(states).map(|(c, s)| (c.to_string(), json!(s.as_str()))).collect();
                json!({"id": id, "components": map})
            })
            .collect();
        assert_eq!(view.render(TableFormat::Json), crate::operator::views::json_document(&Value::Array(values)));
        let mut header = vec!["batch"];
        header.extend(components.iter().map(|c| c.as_str()));
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|(id, states)| std::iter::once(id.to_string()).chain(states.iter().map(|s| s.to_string())).collect())
            .collect();
        assert_eq!(view.render(TableFormat::Table), crate::operator::columns::table(&header, &cells));
    }
}
