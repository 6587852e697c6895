//! A batch with a long log in the web monitor (a real embedded pipeline, called through its
//! router): its page shows the newest events with a link to the older ones, page after page
//! to the first, with the header, states and open runs of the whole batch; the batch list
//! shows every batch's states as the whole batches give them.

use crate::support;

use std::sync::Arc;

use autocomp_model::{Agent, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use serde_json::json;
use support::{id, temp_pipeline};

const HOST: &str = "monitor.test:7072";

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    monitor: Monitor,
    _dir: tempfile::TempDir,
}

/// `probe` records Probed after Data_Received; B1 has a log of `notes` events more.
async fn fixture(notes: usize) -> Fixture {
    let (operator, store, dir) = temp_pipeline(None).await;
    let trigger = Trigger::builder().requires("Data_Received").build();
    autocomp_framework::testing::register_component(store.as_ref(), "probe", "Probed", trigger).await;
    let agent = Agent::new("test").unwrap();
    for batch in ["B1", "B2"] {
        store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent.clone());
        store.append_event(&id(batch), received).await.unwrap();
    }
    for n in 0..notes {
        let note = NewEvent::new(EventType::new("Note_Made").unwrap(), Outcome::Success, agent.clone())
            .with_details(json!({"summary": format!("note number {n}")}));
        store.append_event(&id("B1"), note).await.unwrap();
    }
    let monitor = Monitor::new(operator, Settings::default());
    let options = WebOptions { host_names: vec![HOST.into()], ..WebOptions::default() };
    Fixture { router: web::router(monitor.clone(), options), store, monitor, _dir: dir }
}

impl Fixture {
    async fn get(&self, uri: &str) -> (StatusCode, String) {
        support::get_as(&self.router, HOST, [127, 0, 0, 1], uri).await
    }
}

/// The seqs of the log rows on a batch page, in page order.
fn listed_seqs(page: &str) -> Vec<i64> {
    page.split("<th scope=\"row\">").skip(1).filter_map(|cell| cell.split('<').next()?.parse().ok()).collect()
}

/// The `before=` of the page's "Older events" link.
fn older_link(page: &str) -> Option<i64> {
    let (_, rest) = page.split_once("?before=")?;
    rest.split('#').next()?.parse().ok()
}

#[tokio::test]
async fn a_long_log_is_shown_a_page_at_a_time_newest_first_page_then_older_ones() {
    let f = fixture(120).await;
    let whole: Vec<i64> = f.store.get_batch(&id("B1")).await.unwrap().events.iter().map(|e| e.seq.0).collect();
    let (status, page) = f.get("/batches/B1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(listed_seqs(&page), whole[whole.len() - 50..], "the newest 50 events, oldest first");
    assert!(page.contains("of 121, oldest first"), "says which events of how many");
    assert!(page.contains("121 events"), "the header counts the whole log");
    assert!(page.contains("note number 119") && !page.contains("note number 69<"), "only this page's reports");

    // Following "Older events" walks back to the first event, each event on one page only.
    let (mut seen, mut next) = (listed_seqs(&page), older_link(&page));
    while let Some(before) = next {
        let (status, older) = f.get(&format!("/batches/B1?before={before}")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(older.contains("Newest events"), "a way back to the newest page");
        let mut rows = listed_seqs(&older);
        assert!(rows.iter().all(|seq| *seq < before));
        rows.extend(seen);
        seen = rows;
        next = older_link(&older);
    }
    assert_eq!(seen, whole, "every event once, in order");

    // What the page says of the batch is the whole batch's, not this page's.
    let (_, oldest) = f.get(&format!("/batches/B1?before={}", whole[5])).await;
    assert_eq!(listed_seqs(&oldest), whole[..5]);
    for page in [&page, &oldest] {
        assert!(page.contains("Batch <code>B1</code>") && page.contains("121 events"));
        assert!(page.contains("ready: every clause holds in the store"), "the probe's verdict");
    }
    // Effective events are marked wherever their page is: Data_Received on the oldest,
    // the newest note on the newest.
    assert_eq!(page.matches("<tr class=\"effective\">").count(), 1);
    assert_eq!(oldest.matches("<tr class=\"effective\">").count(), 1);
    assert!(oldest.contains("<code>Data_Received</code> <span class=\"effective-mark\">"));
    let (status, bad) = f.get("/batches/B1?before=soon").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    assert!(bad.contains("before") && bad.contains("soon"), "names the field and the value");
}

#[tokio::test]
async fn the_batch_list_shows_the_states_whole_batches_give() {
    let f = fixture(3).await;
    let holder = RunHolder {
        agent: Agent::new("probe/1@h#1").unwrap(),
        host: "h".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    };
    f.store.claim(&id("B2"), &ComponentName::new("probe").unwrap(), &holder).await.unwrap();
    let matrix = f.monitor.matrix(&Default::default(), None).await.unwrap();
    let pipeline = f.monitor.pipeline().await.unwrap();
    let mut compared = 0;
    for row in &matrix.rows {
        let whole = f.store.get_batch(&row.batch.id).await.unwrap();
        assert_eq!((row.batch.batch_type.clone(), row.batch.created_at), (whole.batch_type.clone(), whole.created_at));
        for (step, cell) in pipeline.iter().zip(&row.cells) {
            assert_eq!(cell.state, step.state_of(&whole), "{} for {}", whole.id, step.name());
            compared += 1;
        }
    }
    assert_eq!(compared, 2);
    let (status, page) = f.get("/batches").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("working") && page.contains("ready"), "{page}");
}

#[tokio::test]
async fn an_event_with_large_details_is_summarized_on_the_page_with_a_link_to_it_whole() {
    let f = fixture(2).await;
    // 40 events of 1 MB each: the page would have held 40 MB of details.
    let blob = "x".repeat(1_000_000);
    let mut seqs = Vec::new();
    for n in 0..40 {
        let big = NewEvent::new(EventType::new("Dump_Made").unwrap(), Outcome::Success, Agent::new("test").unwrap())
            .with_details(json!({"n": n, "dump": blob}));
        seqs.push(f.store.append_event(&id("B1"), big).await.unwrap().seq.0);
    }
    let small = NewEvent::new(EventType::new("Note_Made").unwrap(), Outcome::Success, Agent::new("test").unwrap())
        .with_details(json!({"summary": "a small note, shown whole"}));
    f.store.append_event(&id("B1"), small).await.unwrap();
    let (status, page) = f.get("/batches/B1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.len() < 1_000_000, "the page holds no dump: {} bytes", page.len());
    assert!(page.contains("a small note, shown whole"), "small details are shown");
    let link = format!("href=\"/batches/B1/events/{}\"", seqs[39]);
    assert!(page.contains(&link), "a link to the whole event: {link}");
    assert!(page.contains("976.6 KiB, are too large to show here"), "says its size");
    assert_eq!(listed_seqs(&page).len(), 44, "every event is listed, large ones too");

    let (status, whole) = f.get(&format!("/batches/B1/events/{}", seqs[39])).await;
    assert_eq!(status, StatusCode::OK);
    let event: serde_json::Value = serde_json::from_str(&whole).unwrap();
    assert_eq!((event["seq"].as_i64(), event["details"]["n"].as_i64()), (Some(seqs[39]), Some(39)));
    assert_eq!(event["details"]["dump"].as_str().map(str::len), Some(1_000_000));
    let (status, missing) = f.get(&format!("/batches/B1/events/{}", seqs[39] + 100)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    let (status, bad) = f.get("/batches/B1/events/soon").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(bad.contains("seq") && bad.contains("soon"), "names the field and the value");
}
