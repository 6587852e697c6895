//! The batch page's timeline (a real embedded pipeline, called through the router): a step
//! that failed transiently and then succeeded is drawn as two bars, one per attempt, each
//! labelled, and the table beside the drawing gives the same numbers the operator's
//! `Timeline` computes.

use crate::support;

use std::sync::Arc;

use autocomp_model::{Agent, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, RunHolder, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::duration_text;
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use serde_json::json;
use support::{id, temp_pipeline};

const HOST: &str = "monitor.test:7072";

/// `probe` records Probed after Data_Received; on B1 it failed transiently (ran 1.5 s),
/// then succeeded (ran 250 ms).
async fn fixture() -> (axum::Router, Arc<dyn ObjectStore>, Monitor, tempfile::TempDir) {
    let (operator, store, dir) = temp_pipeline(None).await;
    let trigger = Trigger::builder().requires("Data_Received").build();
    autocomp_framework::testing::register_component(store.as_ref(), "probe", "Probed", trigger).await;
    let agent = Agent::new("test").unwrap();
    store.create_batch(NewBatch::new(id("B1"), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    let received = NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, agent.clone());
    store.append_event(&id("B1"), received).await.unwrap();
    let probe = ComponentName::new("probe").unwrap();
    let holder = RunHolder { agent: agent.clone(), host: "h".into(), pid: 1, claim_key: None, liveness: None };
    for (outcome, details) in [
        (Outcome::Failure, json!({"duration_ms": 1_500, "transient": true, "summary": "mount not ready"})),
        (Outcome::Success, json!({"duration_ms": 250})),
    ] {
        let generation = store.claim(&id("B1"), &probe, &holder).await.unwrap().generation();
        let result = NewEvent::new(EventType::new("Probed").unwrap(), outcome, agent.clone())
            .with_details(details)
            .in_run(probe.clone(), generation);
        store.append_event(&id("B1"), result).await.unwrap();
    }
    let monitor = Monitor::new(operator, Settings::default());
    let options = WebOptions { host_names: vec![HOST.into()], ..WebOptions::default() };
    (web::router(monitor.clone(), options), store, monitor, dir)
}

async fn get(router: &axum::Router, uri: &str) -> (StatusCode, String) {
    support::get_as(router, HOST, [127, 0, 0, 1], uri).await
}

/// The table row whose header cell is `label`: its cells' text, tags removed.
fn row_cells(page: &str, label: &str) -> Vec<String> {
    let start = page.find(&format!("<tr><th scope=\"row\">{label}</th>")).unwrap_or_else(|| panic!("no row {label}"));
    let row = &page[start..start + page[start..].find("</tr>").unwrap()];
    row.split("<td").skip(1).map(|cell| text_of(&cell[cell.find('>').unwrap() + 1..])).collect()
}

fn text_of(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

#[tokio::test]
async fn the_batch_page_draws_one_bar_per_attempt_and_tables_the_same_numbers() {
    let (router, store, monitor, _dir) = fixture().await;
    let (status, page) = get(&router, "/batches/B1").await;
    assert_eq!(status, StatusCode::OK, "{page}");

    let (_, svg) = page.split_once("<svg").expect("an inline SVG");
    let svg = &svg[..svg.find("</svg>").unwrap()];
    assert!(svg.contains("class=\"timeline-chart\" role=\"img\""), "{svg}");
    assert!(svg.contains("<title id=\"timeline-title\">Timeline: 2 attempts of 1 step"), "{svg}");
    assert_eq!(svg.matches("<rect class=\"bar ").count(), 2, "one bar per attempt: {svg}");
    assert!(svg.contains("<rect class=\"bar state-retrying\""), "{svg}");
    assert!(svg.contains("<rect class=\"bar state-success\""), "{svg}");
    assert!(svg.contains(">failure (transient), ran 1.5s</text>"), "the bar's words: {svg}");
    assert!(svg.contains(">success, ran 250ms</text>"), "{svg}");
    let section = &page[page.find("<h2 id=\"timeline\">").unwrap()..page.find("<h2 id=\"log\">").unwrap()];
    assert!(!section.contains("<script") && !section.contains("style=\""), "no script, no inline style: {section}");
    assert!(!section.contains("http://"), "no external URL (an inline SVG needs no xmlns): {section}");

    // The table says what the operator's timeline says, attempt by attempt.
    let head = store.batch_head(&id("B1")).await.unwrap();
    let timeline = monitor.operator().timeline(&head).await.unwrap();
    let attempts = &timeline.steps[0].attempts;
    assert_eq!(attempts.len(), 2);
    for (n, attempt) in attempts.iter().enumerate() {
        let cells = row_cells(&page, &format!("probe #{}", n + 1));
        let waited = attempt.waited.map(duration_text).unwrap();
        let expected = [
            attempt.ready_at.unwrap().to_string(),
            attempt.start.to_string(),
            attempt.end.unwrap().to_string(),
            waited,
            duration_text(attempt.ran),
            attempt.outcome_text(),
        ];
        assert_eq!(cells, expected, "attempt {}", n + 1);
    }
    assert_eq!(row_cells(&page, "probe #1")[4], "1.5s");
    assert_eq!(row_cells(&page, "probe #2")[4], "250ms");
    let total = duration_text(timeline.total().unwrap());
    assert!(page.contains(&format!("{total} from the first event to the newest step result")), "{page}");
}
