//! The contract of the bounded reads and the batch size cap, run by the shared suite
//! (`operations.rs`) against every backend: a run's state, a batch's head and a page of its
//! log each say what the whole batch says, and a batch's stored bytes never pass the cap
//! of the store it is written through.

use std::sync::Arc;

use autocomp_model::*;
use autocomp_store::*;
use serde_json::{Map, Value, json};

use super::{Fixture, agent, cancelled_failure, component, holder, id, record, register, ty};

/// The store of `f` opened again with `options` added to its URL.
async fn reopened(f: &Fixture, options: &str) -> Arc<dyn ObjectStore> {
    let separator = if f.url.contains('?') { '&' } else { '?' };
    open_store(&format!("{}{separator}{options}", f.url)).await.unwrap()
}

pub async fn run_state_tells_a_holder_whether_its_generation_is_still_the_open_one(f: Fixture) {
    register(&f.store, "B1").await;
    let (b1, archiver) = (id("B1"), component("archiver"));
    let state = async |c: &ComponentName| {
        let run = f.store.run_state(&b1, c).await.unwrap();
        run.map(|run| (run.generation, run.state))
    };
    assert_eq!(state(&archiver).await, None, "never claimed");

    let first = f.store.claim(&b1, &archiver, &holder("a")).await.unwrap();
    assert_eq!(state(&archiver).await, Some((first.generation(), RunState::Open)), "still mine");
    let full = f.store.run_state(&b1, &archiver).await.unwrap().unwrap();
    assert_eq!(full, first.run, "the whole run, holder included");

    // Taken over: the newest generation is another holder's; the first is fenced.
    let second = f.store.claim(&b1, &archiver, &holder("b")).await.unwrap();
    assert_eq!(state(&archiver).await, Some((second.generation(), RunState::Open)));
    assert_ne!(second.generation(), first.generation());
    let late =
        NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("a")).in_run(archiver.clone(), first.generation());
    assert!(f.store.append_event(&b1, late).await.unwrap_err().is_fenced());

    // Its result closes it.
    let result =
        NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("b")).in_run(archiver.clone(), second.generation());
    f.store.append_event(&b1, result).await.unwrap();
    assert_eq!(state(&archiver).await, Some((second.generation(), RunState::Recorded)));

    // Cancelled by an operator: the same generation, no longer open.
    let third = f.store.claim(&b1, &archiver, &holder("c")).await.unwrap();
    f.store.cancel_run(&b1, &archiver, cancelled_failure("Data_Archived")).await.unwrap();
    assert_eq!(state(&archiver).await, Some((third.generation(), RunState::Cancelled)));

    // Released; and claimed again after a cancel, with a generation past the fence.
    let fourth = f.store.claim(&b1, &archiver, &holder("d")).await.unwrap();
    assert!(fourth.generation() > third.generation() + 1, "the cancel moved the fence");
    f.store.release(&b1, &archiver, fourth.generation()).await.unwrap();
    assert_eq!(state(&archiver).await, Some((fourth.generation(), RunState::Released)));

    // Per component; an unknown batch is not found.
    assert_eq!(state(&component("checker")).await, None);
    let err = f.store.run_state(&id("B-missing"), &archiver).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
}

/// A batch with a bit of everything a head reports: effective events of every kind, Resets
/// covering some types twice, a content change, open and closed runs.
async fn eventful_batch(store: &Arc<dyn ObjectStore>, name: &str) -> BatchId {
    let batch = id(name);
    let new = NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())
        .with_location(format!("/incoming/{name}"))
        .with_priority(4);
    store.create_batch(new).await.unwrap();
    let event =
        |kind: &str, outcome, details: Value| NewEvent::new(ty(kind), outcome, agent("test")).with_details(details);
    let reset =
        |types: &[&str]| NewEvent::reset(types.iter().map(|t| ty(t)).collect(), agent("operator:bob"), json!({}));
    let modified = store.get_batch(&batch).await.unwrap().modified_seq;
    for new in [
        event("Data_Received", Outcome::Success, json!({"files": 3})),
        event("Checksums_Verified", Outcome::Failure, json!({"transient": true, "summary": "busy"})),
        reset(&["Checksums_Verified", "Never_Recorded"]),
        event("Checksums_Verified", Outcome::Success, json!({"content_seq": modified.0})),
        event("Structure_Checked", Outcome::Success, json!({"skipped": true, "reason": "by hand"})),
        event("Page_Counted", Outcome::Failure, json!({"failures_total": 1, "failures": [{"reference": "p1"}]})),
        reset(&["Page_Counted"]),
        event("Page_Counted", Outcome::Success, json!({"result": {"pages": 12}})),
    ] {
        store.append_event(&batch, new).await.unwrap();
    }
    let mut patch = Map::new();
    patch.insert("pages".into(), json!(12));
    store.record_content_change(&batch, patch).await.unwrap();
    store.claim(&batch, &component("archiver"), &holder("a")).await.unwrap();
    let checker = store.claim(&batch, &component("checker"), &holder("c")).await.unwrap();
    store.release(&batch, &component("checker"), checker.generation()).await.unwrap();
    store.claim(&batch, &component("indexer"), &holder("i")).await.unwrap();
    batch
}

pub async fn batch_head_says_what_the_whole_batch_says(f: Fixture) {
    let batch = eventful_batch(&f.store, "B1").await;
    register(&f.store, "B2").await;
    record(&f.store, "B2", "Data_Received", Outcome::Success).await;
    for id in [batch, id("B2")] {
        let head = f.store.batch_head(&id).await.unwrap();
        let whole = f.store.get_batch(&id).await.unwrap();
        assert_eq!(head.summary, BatchSummary::of(&whole), "{id}: the summary");
        let effective: Vec<Event> = whole.effective().iter().cloned().collect();
        assert_eq!(head.effective, effective, "{id}: the effective events in full");
        for kind in ["Data_Received", "Checksums_Verified", "Never_Recorded", "Page_Counted", "Structure_Checked"] {
            assert_eq!(head.last_reset_of(&ty(kind)), whole.last_reset_of(&ty(kind)), "{id}: last reset of {kind}");
        }
        assert_eq!(head.open_runs, whole.open_runs, "{id}: open runs");
        assert_eq!(
            (&head.metadata, head.created_at, head.modified_at, head.location()),
            (&whole.metadata, whole.created_at, whole.modified_at, whole.location()),
            "{id}: the header"
        );
        assert_eq!(head.event_count, whole.events.len() as u64, "{id}");
        // The store measures the JSON text it holds; compactly written it is no shorter.
        let compact: usize = whole.events.iter().map(|e| e.details.to_string().len()).sum::<usize>()
            + Value::Object(whole.metadata.clone()).to_string().len();
        assert!(
            (compact as u64..=2 * compact as u64).contains(&head.stored_bytes),
            "{id}: {} stored bytes for {compact} bytes of compact JSON",
            head.stored_bytes
        );
        assert!(head.as_of >= whole.created_at);
        let expected = BatchHead { stored_bytes: head.stored_bytes, as_of: head.as_of, ..BatchHead::of(&whole) };
        assert_eq!(head, expected, "{id}: all of it as the whole batch's head");
    }
    let head = f.store.batch_head(&id("B1")).await.unwrap();
    assert_eq!(head.last_reset_of(&ty("Page_Counted")), head.last_resets[&ty("Page_Counted")]);
    assert_eq!(head.last_reset_of(&ty("Data_Received")), Seq::ZERO);
    assert_eq!(head.open_runs.iter().map(|r| r.component.as_str()).collect::<Vec<_>>(), ["archiver", "indexer"]);
    let err = f.store.batch_head(&id("B-missing")).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
}

pub async fn log_pages_walk_the_log_both_ways_without_skipping_or_repeating(f: Fixture) {
    register(&f.store, "B1").await;
    register(&f.store, "B2").await;
    register(&f.store, "B-empty").await;
    // Interleaved with another batch's, so the log's seqs are not contiguous.
    for n in 0..25 {
        let event = NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(json!({"n": n}));
        f.store.append_event(&id("B1"), event).await.unwrap();
        if n % 3 == 0 {
            record(&f.store, "B2", "Other_Done", Outcome::Failure).await;
        }
    }
    let whole = f.store.get_batch(&id("B1")).await.unwrap().events;
    let b1 = id("B1");

    let newest = f.store.log_page(&b1, LogCursor::Newest, 10).await.unwrap();
    assert_eq!(newest.events, whole[15..], "the newest ten, oldest first");
    assert_eq!((newest.total, newest.older, newest.newer), (25, Some(whole[15].seq), None));
    let before = f.store.log_page(&b1, LogCursor::Before(newest.older.unwrap()), 10).await.unwrap();
    assert_eq!(before.events, whole[5..15]);
    assert_eq!((before.older, before.newer), (Some(whole[5].seq), Some(whole[14].seq)));
    let first = f.store.log_page(&b1, LogCursor::Before(before.older.unwrap()), 10).await.unwrap();
    assert_eq!(first.events, whole[..5], "a short first page");
    assert_eq!((first.older, first.newer), (None, Some(whole[4].seq)));

    // Forward, from the start, to the end: every event once, in order.
    let (mut streamed, mut cursor) = (Vec::new(), Seq::ZERO);
    loop {
        let page = f.store.log_page(&b1, LogCursor::After(cursor), 7).await.unwrap();
        streamed.extend(page.events.iter().cloned());
        let Some(next) = page.newer else { break };
        assert_eq!(Some(next), page.events.last().map(|e| e.seq));
        cursor = next;
    }
    assert_eq!(streamed, whole);
    let past = f.store.log_page(&b1, LogCursor::After(whole[24].seq), 7).await.unwrap();
    assert_eq!((past.events.len(), past.older, past.newer, past.total), (0, None, None, 25));
    let all = f.store.log_page(&b1, LogCursor::Newest, MAX_LOG_PAGE).await.unwrap();
    assert_eq!((all.events, all.older, all.newer), (whole.clone(), None, None));

    // Every cursor answers as the page of the whole batch would (`LogPage::of`).
    let batch = f.store.get_batch(&b1).await.unwrap();
    for cursor in [
        LogCursor::Newest,
        LogCursor::Before(whole[0].seq),
        LogCursor::Before(whole[7].seq),
        LogCursor::Before(Seq(whole[7].seq.0 + 1)),
        LogCursor::After(Seq::ZERO),
        LogCursor::After(whole[20].seq),
        LogCursor::After(whole[24].seq),
    ] {
        for limit in [1, 4, 25, 30] {
            let page = f.store.log_page(&b1, cursor, limit).await.unwrap();
            assert_eq!(page, LogPage::of(&batch, cursor, limit), "{cursor:?}, {limit}");
        }
    }
    let empty = f.store.log_page(&id("B-empty"), LogCursor::Newest, 50).await.unwrap();
    assert_eq!((empty.events.len(), empty.total, empty.older, empty.newer), (0, 0, None, None));
    for bad in [0, MAX_LOG_PAGE + 1] {
        let err = f.store.log_page(&b1, LogCursor::Newest, bad).await.unwrap_err();
        assert!(matches!(&err, StoreError::Invalid(e) if e.field == "limit"), "{bad}: {err}");
    }
    let err = f.store.log_page(&id("B-missing"), LogCursor::Newest, 10).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
}

/// Details of about `bytes` bytes of JSON.
fn details_of(bytes: usize) -> Value {
    json!({"blob": "x".repeat(bytes)})
}

fn refusal_of(err: &StoreError) -> &InvalidInput {
    match err {
        StoreError::Invalid(input) => input,
        other => panic!("expected a refusal as bad input, got {other}"),
    }
}

pub async fn a_batch_at_its_byte_cap_refuses_more_and_writes_nothing(f: Fixture) {
    const CAP: u64 = 1 << 20;
    let capped = reopened(&f, "max_batch_bytes=1MiB").await;
    register(&capped, "B1").await;
    let b1 = id("B1");
    let append = |store: &Arc<dyn ObjectStore>, bytes: usize| {
        let (store, batch) = (Arc::clone(store), b1.clone());
        async move {
            let event = NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(details_of(bytes));
            store.append_event(&batch, event).await
        }
    };
    for _ in 0..3 {
        append(&capped, 300_000).await.unwrap();
    }
    let head = capped.head().await.unwrap();
    let err = append(&capped, 300_000).await.unwrap_err();
    let refusal = refusal_of(&err);
    assert_eq!((refusal.field.as_str(), refusal.value.as_str()), ("batch", "B1"), "{err}");
    assert!(refusal.reason.contains(&format!("{CAP} bytes")) && refusal.reason.contains("max_batch_bytes"), "{err}");
    let holds = capped.batch_head(&b1).await.unwrap().stored_bytes;
    assert!(refusal.reason.contains(&format!("it stores {holds} bytes")), "names what it stores: {err}");
    assert_eq!(capped.head().await.unwrap(), head, "nothing was written");
    assert_eq!(capped.batch_head(&b1).await.unwrap().event_count, 3);

    // What still fits is recorded; a content change that would not fit is refused, one
    // that shrinks the batch is not.
    append(&capped, 100_000).await.unwrap();
    let mut grow = Map::new();
    grow.insert("notes".into(), json!("n".repeat(200_000)));
    let err = capped.record_content_change(&b1, grow).await.unwrap_err();
    assert_eq!(refusal_of(&err).value, "B1", "{err}");
    assert!(refusal_of(&err).reason.starts_with("this content change"), "{err}");
    let mut shrink = Map::new();
    shrink.insert("location".into(), Value::Null);
    capped.record_content_change(&b1, shrink).await.unwrap();
    assert_eq!(capped.get_batch(&b1).await.unwrap().location(), None);

    // The operator's events are capped too; the claim it would cancel stays open.
    let run = capped.claim(&b1, &component("archiver"), &holder("a")).await.unwrap();
    let big = |event: NewEvent| event.with_details(json!({"cancelled": true, "reason": "r".repeat(200_000)}));
    let err = capped.cancel_run(&b1, &component("archiver"), big(cancelled_failure("Data_Archived"))).await;
    assert_eq!(refusal_of(&err.unwrap_err()).value, "B1");
    let state = capped.run_state(&b1, &component("archiver")).await.unwrap().unwrap();
    assert_eq!((state.generation, state.state), (run.generation(), RunState::Open), "not cancelled");
    let prioritized = NewEvent::new(ty("Prioritized"), Outcome::Success, agent("operator:bob"))
        .with_details(json!({"reason": "p".repeat(200_000)}));
    let err = capped.prioritize(&b1, 9, prioritized).await.unwrap_err();
    assert_eq!(refusal_of(&err).value, "B1", "{err}");
    assert_eq!(capped.get_batch(&b1).await.unwrap().priority, 0, "the priority stays");
    let whole = capped.batch_head(&b1).await.unwrap();
    assert!(whole.stored_bytes <= CAP, "{} bytes", whole.stored_bytes);

    // Another batch is not held up; the cap is the opener's (the default is 64 MiB).
    register(&capped, "B2").await;
    capped.append_event(&id("B2"), NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t"))).await.unwrap();
    append(&f.store, 300_000).await.expect("under the default cap");

    // Appends at once (group commits) count each other: exactly as many fit as would alone.
    register(&capped, "B3").await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&capped);
            tokio::spawn(async move {
                let event =
                    NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(details_of(200_000));
                store.append_event(&id("B3"), event).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 5, "{answers:?}");
    assert!(answers.iter().filter_map(|a| a.as_ref().err()).all(|e| refusal_of(e).value == "B3"));
    let b3 = capped.batch_head(&id("B3")).await.unwrap();
    assert_eq!(b3.event_count, 5);
    assert!(b3.stored_bytes <= CAP, "{} bytes", b3.stored_bytes);
}

pub async fn summaries_read_every_flag_as_the_whole_batch_does(f: Fixture) {
    register(&f.store, "B1").await;
    register(&f.store, "B2").await;
    let b1 = id("B1");
    let modified = f.store.get_batch(&b1).await.unwrap().modified_seq.0;
    // Flags only count as JSON true; content_seq only as a seq (an integer from 1 that fits).
    let cases = [
        ("Skipped_Done", Outcome::Success, json!({"skipped": true})),
        ("Skipped_Failure", Outcome::Failure, json!({"skipped": true, "transient": true})),
        ("Skipped_Text", Outcome::Success, json!({"skipped": "yes"})),
        ("Transient_Text", Outcome::Failure, json!({"transient": "true"})),
        ("Transient_Success", Outcome::Success, json!({"transient": true})),
        ("Content_Int", Outcome::Success, json!({"content_seq": modified})),
        ("Content_Float", Outcome::Success, json!({"content_seq": 5.0})),
        ("Content_Text", Outcome::Success, json!({"content_seq": "5"})),
        ("Content_Negative", Outcome::Success, json!({"content_seq": -3})),
        ("Content_Zero", Outcome::Success, json!({"content_seq": 0})),
        ("Content_Huge", Outcome::Success, json!({"content_seq": 18_446_744_073_709_551_615u64})),
        ("Content_Nested", Outcome::Success, json!({"result": {"content_seq": 4}})),
    ];
    for (kind, outcome, details) in cases {
        f.store.append_event(&b1, NewEvent::new(ty(kind), outcome, agent("t")).with_details(details)).await.unwrap();
    }
    // A content change makes Content_Int stale; a Reset takes two types out.
    f.store.record_content_change(&b1, Map::new()).await.unwrap();
    let reset = NewEvent::reset(vec![ty("Skipped_Text"), ty("Content_Text")], agent("operator:bob"), json!({}));
    f.store.append_event(&b1, reset).await.unwrap();
    let ids = [id("B2"), b1.clone()];
    let whole: Vec<BatchSummary> = f.store.get_batches(&ids).await.unwrap().iter().map(BatchSummary::of).collect();
    assert_eq!(f.store.get_summaries(&ids).await.unwrap(), whole);
    let mut listed = f.store.list_summaries(None, 10).await.unwrap();
    listed.reverse();
    assert_eq!(listed, whole);
    assert_eq!(f.store.batch_head(&b1).await.unwrap().summary, whole[1]);
    let summary = &whole[1];
    let event = |kind: &str| summary.effective_of(&ty(kind)).cloned().unwrap();
    assert!(event("Skipped_Done").skipped && !event("Skipped_Failure").skipped);
    assert!(event("Skipped_Failure").transient && !event("Transient_Text").transient);
    assert_eq!(event("Content_Int").content_seq, Some(Seq(modified)));
    assert!(summary.stale_of(&ty("Content_Int")).is_some(), "worked out from content the batch no longer has");
    for kind in ["Content_Float", "Content_Negative", "Content_Zero", "Content_Huge", "Content_Nested"] {
        assert_eq!(event(kind).content_seq, None, "{kind}");
    }
    assert!(summary.effective_of(&ty("Skipped_Text")).is_none(), "reset");
}

pub async fn listings_say_what_each_whole_batch_says(f: Fixture) {
    eventful_batch(&f.store, "B1").await;
    register(&f.store, "B2").await;
    record(&f.store, "B2", "Data_Received", Outcome::Success).await;
    let asked = [id("B2"), id("B-missing"), id("B1")];
    let listings = f.store.get_listings(&asked).await.unwrap();
    let whole = f.store.get_batches(&asked).await.unwrap();
    assert_eq!(listings.len(), 2, "unknown ids left out");
    for (listing, whole) in listings.iter().zip(&whole) {
        assert_eq!(listing.summary, BatchSummary::of(whole), "{}", whole.id);
        assert_eq!((listing.created_at, &listing.open_runs), (whole.created_at, &whole.open_runs), "{}", whole.id);
    }
    assert!(listings[1].open_run(&component("archiver")).is_some());
    assert!(f.store.get_listings(&[]).await.unwrap().is_empty());
    let err = f.store.get_listings(&vec![id("B1"); 10_001]).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(e) if e.field == "ids"), "{err}");
}

/// A read by ids names a batch as often as it likes; the store reads and answers it once,
/// at its first place (eight copies of one large batch used to answer eight copies).
pub async fn an_id_asked_twice_is_read_and_answered_once(f: Fixture) {
    eventful_batch(&f.store, "B1").await;
    register(&f.store, "B2").await;
    let asked = [id("B2"), id("B1"), id("B2"), id("B-missing"), id("B1"), id("B1")];
    let ids = |found: Vec<BatchId>| found.into_iter().map(|id| id.to_string()).collect::<Vec<_>>();
    let batches = f.store.get_batches(&asked).await.unwrap();
    assert_eq!(ids(batches.iter().map(|b| b.id.clone()).collect()), ["B2", "B1"]);
    let summaries = f.store.get_summaries(&asked).await.unwrap();
    assert_eq!(ids(summaries.iter().map(|s| s.id.clone()).collect()), ["B2", "B1"]);
    let listings = f.store.get_listings(&asked).await.unwrap();
    assert_eq!(ids(listings.iter().map(|l| l.summary.id.clone()).collect()), ["B2", "B1"]);
}

/// A page read by size holds every event it would hold whole, but an event whose details
/// pass the limit comes without them, listed with their size; `event_at` reads it whole.
pub async fn a_log_page_read_by_size_leaves_large_details_out_and_says_their_size(f: Fixture) {
    register(&f.store, "B1").await;
    let b1 = id("B1");
    let step = |details: Value| NewEvent::new(ty("Step_Done"), Outcome::Success, agent("t")).with_details(details);
    let large = json!({"blob": "x".repeat(40_000)});
    let mut seqs = Vec::new();
    for details in [json!({"n": 1}), large.clone(), json!({"n": 3}), large.clone(), json!({"n": 5})] {
        seqs.push(f.store.append_event(&b1, step(details)).await.unwrap().seq);
    }
    let compact = large.to_string().len() as u64;
    for (cursor, limit) in [(LogCursor::Newest, 10), (LogCursor::Newest, 2), (LogCursor::After(Seq::ZERO), 3)] {
        let whole = f.store.log_page(&b1, cursor, limit).await.unwrap();
        assert!(whole.details_left_out.is_empty(), "a plain page leaves nothing out");
        let sized = f.store.log_page_within(&b1, cursor, limit, port::DETAILS_SHOWN_BYTES).await.unwrap();
        assert_eq!((sized.total, sized.older, sized.newer), (whole.total, whole.older, whole.newer), "{cursor:?}");
        assert_eq!(sized.events.len(), whole.events.len());
        for (sized_event, whole_event) in sized.events.iter().zip(&whole.events) {
            match sized.left_out(sized_event.seq) {
                Some(bytes) => {
                    assert_eq!(sized_event.details, Value::Null, "left out");
                    assert_eq!(whole_event.details, large);
                    // As compact JSON text (SQLite) or as PostgreSQL renders jsonb: about it.
                    assert!(bytes >= compact && bytes < compact + 64, "{bytes} for {compact}");
                    let mut without = whole_event.clone();
                    without.details = Value::Null;
                    assert_eq!(sized_event, &without, "all but the details");
                }
                None => assert_eq!(sized_event, whole_event, "small details are shown"),
            }
        }
    }
    let page = f.store.log_page_within(&b1, LogCursor::Newest, 10, port::DETAILS_SHOWN_BYTES).await.unwrap();
    let left: Vec<Seq> = page.details_left_out.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(left, [seqs[1], seqs[3]], "in seq order");
    let full = port::event_at(f.store.as_ref(), &b1, seqs[3]).await.unwrap().expect("the event");
    assert_eq!((full.seq, &full.details), (seqs[3], &large));
    assert_eq!(port::event_at(f.store.as_ref(), &b1, Seq(seqs[4].0 + 1)).await.unwrap(), None, "no such event");
    let err = f.store.log_page_within(&id("B-missing"), LogCursor::Newest, 10, 1).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
}
