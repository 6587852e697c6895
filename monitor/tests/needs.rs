//! The overview's "Needs a person" section, over HTTP against a real embedded pipeline (SQLite
//! store, local index and locks in a temp dir), as an operator reads it: right under the
//! heading, a component's failures with their most frequent reasons and a link to exactly
//! those batches, a paused component with a link to where admins act, overdue work with its
//! list, one line when nothing needs a person; and the batch list's time-in-pipeline column.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{Agent, BatchType, EventType, NewBatch, NewEvent, Outcome, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::{Operator, Scope, SteerAction};
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use serde_json::json;
use support::{id, temp_pipeline};

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    operator: Operator,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// `probe` records Probed after Data_Received, `checker` records Checked after Probed.
    async fn new(settings: Settings) -> Fixture {
        let (operator, store, dir) = temp_pipeline(Some("tester")).await;
        for (name, event_type, requires) in [("probe", "Probed", "Data_Received"), ("checker", "Checked", "Probed")] {
            let trigger = Trigger::builder().requires(requires).build();
            autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
        }
        let router = web::router(Monitor::new(operator.clone(), settings), WebOptions::default());
        Fixture { router, store, operator, _dir: dir }
    }

    /// A batch with the events `(type, outcome, failure summary)`, in order.
    async fn batch(&self, batch: &str, events: &[(&str, Outcome, Option<&str>)]) {
        let agent = Agent::new("test").unwrap();
        self.store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome, summary) in events {
            let mut event = NewEvent::new(EventType::new(*event_type).unwrap(), *outcome, agent.clone());
            if let Some(summary) = summary {
                event = event.with_details(json!({ "summary": summary }));
            }
            self.store.append_event(&id(batch), event).await.unwrap();
        }
    }

    async fn get(&self, uri: &str) -> (StatusCode, String) {
        support::get_as(&self.router, "monitor.test", [127, 0, 0, 1], uri).await
    }

    /// The overview's "Needs a person" section, checked to come right after the heading.
    async fn needs(&self) -> (String, String) {
        let (status, page) = self.get("/").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let start = page.find("<section class=\"needs\"").unwrap_or_else(|| panic!("no section: {page}"));
        let h1 = page.find("<h1>Overview</h1>").expect("the heading");
        assert!(page[h1..start].trim() == "<h1>Overview</h1>", "right after the heading: {page}");
        let end = start + page[start..].find("</section>").expect("the section ends");
        assert!(page[start..end].contains("<h2 id=\"needs\">Needs a person</h2>"), "{page}");
        (page[start..end].to_owned(), page)
    }

    /// The `href` of the link whose text is `text`, as the browser follows it.
    fn href_of(html: &str, text: &str) -> String {
        let at = html.find(&format!(">{text}</a>")).unwrap_or_else(|| panic!("no link {text:?} in {html}"));
        let start = html[..at].rfind("href=\"").expect("a link") + "href=\"".len();
        html[start..start + html[start..].find('"').unwrap()].replace("&amp;", "&")
    }
}

const OK: Outcome = Outcome::Success;
const FAILED: Outcome = Outcome::Failure;

/// Twenty-two batches failed at the checker: the first twenty (the ones read) ten with "disk
/// full", five "timeout", three "checksum <mismatch>", two without a summary; the last two
/// "late", never read. The probe is paused by an operator.
#[tokio::test]
async fn failures_lead_the_overview_with_their_most_frequent_reasons_and_a_link_to_them() {
    let f = Fixture::new(Settings::default()).await;
    for i in 1..=22 {
        let summary = match i {
            1..=10 => Some("disk full"),
            11..=15 => Some("timeout"),
            16..=18 => Some("checksum <mismatch>"),
            19..=20 => None,
            _ => Some("late"),
        };
        let events = [("Data_Received", OK, None), ("Probed", OK, None), ("Checked", FAILED, summary)];
        f.batch(&format!("B{i:02}"), &events).await;
    }
    let pause = SteerAction::Pause { scope: Scope::Component("probe".into()) };
    f.operator.steer(&pause, "the tape robot is serviced", None).await.unwrap();

    let (needs, page) = f.needs().await;
    assert!(!needs.contains("Nothing needs a person"), "{needs}");
    let line = needs.lines().find(|l| l.contains("checker: 22 failed")).unwrap_or_else(|| panic!("{needs}"));
    assert!(
        line.contains(
            "<q class=\"failure-summary\">disk full</q> ×10, <q class=\"failure-summary\">timeout</q> ×5, \
             <q class=\"failure-summary\">checksum &lt;mismatch&gt;</q> ×3"
        ),
        "the top three, most frequent first, escaped: {line}"
    );
    assert!(line.contains("(2 with other reasons, among the first 20 read)"), "{line}");
    assert!(!needs.contains("late"), "only twenty failures are read: {needs}");
    let failed = Fixture::href_of(line, "checker: 22 failed");
    assert_eq!(failed, "/batches?q=component%3Achecker+state%3Afailed");
    let (status, list) = f.get(&failed).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(list.contains("<strong>22</strong> batches match <code>component:checker state:failed</code>"), "{list}");
    assert!(list.contains("href=\"/batches/B22\""), "{list}");

    let paused = needs.lines().find(|l| l.contains("<strong>probe</strong> is ")).unwrap_or_else(|| panic!("{needs}"));
    assert!(paused.contains("paused") && paused.contains("the tape robot is serviced"), "{paused}");
    assert_eq!(Fixture::href_of(paused, "steering"), "#steering");
    assert!(page.contains("id=\"steering\""), "the link's target is on the page: {page}");
    // The counts that the section was drawn from still follow it.
    assert!(page.find("batches in the store").unwrap() > page.find("</section>").unwrap(), "{page}");
}

#[tokio::test]
async fn overdue_work_is_listed_with_a_link_to_exactly_those_batches() {
    let f = Fixture::new(Settings { ready_overdue_after: Duration::ZERO, ..Settings::default() }).await;
    f.batch("B1", &[("Data_Received", OK, None), ("Probed", OK, None)]).await;
    let (needs, _) = f.needs().await;
    let overdue = Fixture::href_of(&needs, "checker: 1 overdue");
    assert_eq!(overdue, "/batches?q=component%3Achecker+state%3Aoverdue");
    let (status, list) = f.get(&overdue).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(list.contains("<strong>1</strong> batches match") && list.contains("href=\"/batches/B1\""), "{list}");
}

#[tokio::test]
async fn nothing_needs_a_person_in_an_empty_or_a_healthy_pipeline() {
    let (operator, _store, _dir) = temp_pipeline(Some("tester")).await;
    let router = web::router(Monitor::new(operator.clone(), Settings::default()), WebOptions::default());
    let empty = Fixture { router, store: _store, operator, _dir };
    let (needs, page) = empty.needs().await;
    assert!(needs.contains("<p class=\"verdict\" id=\"nothing-needed\">Nothing needs a person.</p>"), "{needs}");
    assert!(page.contains("the pipeline is empty"), "{page}");

    let healthy = Fixture::new(Settings::default()).await;
    healthy.batch("B1", &[("Data_Received", OK, None), ("Probed", OK, None), ("Checked", OK, None)]).await;
    let (needs, _) = healthy.needs().await;
    assert!(needs.contains("Nothing needs a person."), "{needs}");
    assert!(!needs.contains("<li"), "{needs}");
}

/// Each row of the list says how long its batch has been in the pipeline (creation to last
/// activity, or to now while a step works on it or waits, as a batch ready since its
/// creation does), the exact times in its title.
#[tokio::test]
async fn the_batch_list_shows_how_long_each_batch_has_been_in_the_pipeline() {
    let f = Fixture::new(Settings::default()).await;
    f.batch("B1", &[("Data_Received", OK, None)]).await;
    // Ready at the probe since it came, with no activity since: still in the pipeline.
    f.batch("B2", &[("Data_Received", OK, None)]).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    f.store
        .append_event(&id("B1"), NewEvent::new(EventType::new("Probed").unwrap(), OK, Agent::new("test").unwrap()))
        .await
        .unwrap();
    let (status, list) = f.get("/batches").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(list.contains(">In pipeline</th>"), "a column header: {list}");
    let at = list.find("<td class=\"num duration\" title=\"created ").unwrap_or_else(|| panic!("a cell: {list}"));
    let cell = &list[at..at + list[at..].find("</td>").unwrap()];
    assert!(cell.contains(", last activity "), "{cell}");
    // A second and a bit apart: whole seconds, the same short and exact (one unit only).
    let (exact, shown) = cell.split_once(" (UTC): ").unwrap().1.split_once("\">").unwrap();
    assert!(exact == shown && exact.ends_with('s') && exact != "0s", "{cell}");
    let at = list.find(">B2</a>").unwrap_or_else(|| panic!("B2: {list}"));
    let cell = &list[at..at + list[at..].find("</tr>").unwrap()];
    assert!(!cell.contains("\">0s</td>"), "a waiting batch's time runs on: {cell}");
    // The NDJSON export carries it too, in whole seconds.
    let (_, ndjson) = f.get("/batches.ndjson").await;
    let row: serde_json::Value = serde_json::from_str(ndjson.lines().next().unwrap()).unwrap();
    assert!(row["in_pipeline_seconds"].as_u64().is_some_and(|s| s >= 1), "{row}");
    assert!(row["last_activity"].is_string(), "{row}");
}

/// "Needs a person" can be emptied: failures an operator acknowledged (one through the
/// operator module, as the CLI and the monitor's forms do) leave the section and the failed
/// count for their own state, listed by `state:acknowledged`; the others stay.
#[tokio::test]
async fn acknowledged_failures_leave_needs_a_person_for_their_own_state() {
    let f = Fixture::new(Settings::default()).await;
    for i in 1..=3 {
        let events = [("Data_Received", OK, None), ("Probed", OK, None), ("Checked", FAILED, Some("disk full"))];
        f.batch(&format!("B{i}"), &events).await;
    }
    let (needs, page) = f.needs().await;
    assert!(needs.contains("checker: 3 failed"), "{needs}");
    assert!(
        page.contains("<td class=\"num count-failed\"><a href=\"/batches?q=component%3Achecker+state%3Afailed\""),
        "a failed count is coloured: {page}"
    );
    let close = autocomp_ops::operator::Action::Acknowledge { component: "checker".into() };
    let ids = [id("B1"), id("B2")];
    let done = f.operator.perform_many(&ids, &close, "disk replaced, batches re-delivered").await.unwrap();
    assert_eq!((done.performed.len(), done.refused.len()), (2, 0), "{done:?}");
    let (needs, page) = f.needs().await;
    assert!(needs.contains("checker: 1 failed"), "{needs}");
    let (status, list) = f.get("/batches?q=state:acknowledged").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(list.contains("<strong>2</strong> batches match"), "{list}");
    assert!(list.contains("state-acknowledged"), "its own state, drawn as such: {list}");
    assert!(page.contains("acknowledged"), "the overview counts the state: {page}");

    f.operator.perform_many(&[id("B3")], &close, "the last one too").await.unwrap();
    let (needs, _) = f.needs().await;
    assert!(needs.contains("Nothing needs a person"), "emptied: {needs}");
}
