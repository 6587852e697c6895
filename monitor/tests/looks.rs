//! How the monitor looks and whom it reaches, over HTTP against a real embedded pipeline
//! (SQLite store, local index and locks in a temp dir): the alerts page lists what
//! `autocomp alerts` says (a component whose circuit is open, batches ready too long), each
//! with a link to look into it, and says so when nothing needs a person; every page names
//! its one time convention (UTC) and writes its times in it; the stylesheet follows the
//! system's dark mode and keeps narrow screens from scrolling sideways.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use autocomp_model::{
    Agent, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, SteeringChange, SteeringRequest, Trigger,
};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use support::{id, temp_pipeline};

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    _dir: tempfile::TempDir,
}

/// `probe` records Probed after Data_Received, `checker` records Checked after Probed. B1:
/// probed, so ready for the checker; B2: nothing yet. The monitor counts a batch overdue
/// after `ready_overdue_after`.
async fn fixture(ready_overdue_after: Duration) -> Fixture {
    let (operator, store, dir) = temp_pipeline(None).await;
    for (name, event_type, requires) in [("probe", "Probed", "Data_Received"), ("checker", "Checked", "Probed")] {
        let trigger = Trigger::builder().requires(requires).build();
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    let agent = Agent::new("test").unwrap();
    for (batch, events) in [("B1", &["Data_Received", "Probed"][..]), ("B2", &[][..])] {
        store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for event_type in events {
            let event = NewEvent::new(EventType::new(*event_type).unwrap(), Outcome::Success, agent.clone());
            store.append_event(&id(batch), event).await.unwrap();
        }
    }
    let settings = Settings { ready_overdue_after, ..Settings::default() };
    let router = web::router(Monitor::new(operator, settings), WebOptions::default());
    Fixture { router, store, _dir: dir }
}

impl Fixture {
    async fn get(&self, uri: &str) -> (StatusCode, String) {
        support::get_as(&self.router, "monitor.test", [10, 9, 9, 9], uri).await
    }

    /// The checker's circuit opens after one failure, as a worker's breaker records it.
    async fn open_the_checkers_circuit(&self) {
        self.store
            .steer(SteeringRequest {
                change: SteeringChange::Outcome {
                    component: ComponentName::new("checker").unwrap(),
                    batch: id("B1"),
                    failed: true,
                    break_after: 1,
                    summary: "B1: the disk was full".into(),
                },
                by: Agent::new("checker/1.0@host1#9").unwrap(),
                reason: "breaker".into(),
                expect_version: None,
            })
            .await
            .unwrap();
    }
}

/// The rows of the alerts table, as (kind, message, link) with the HTML left in.
fn alert_rows(page: &str) -> Vec<(String, String, String)> {
    let Some(start) = page.find("<tbody>") else { return Vec::new() };
    let body = &page[start..page[start..].find("</tbody>").map_or(page.len(), |end| start + end)];
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            let cell = |open: &str, close: &str| {
                let from = row.find(open).map(|at| at + open.len()).unwrap_or(0);
                row[from..].split(close).next().unwrap_or_default().to_owned()
            };
            (cell("<th scope=\"row\">", "</th>"), cell("<td class=\"message\">", "</td>"), cell("<a href=\"", "\""))
        })
        .collect()
}

#[tokio::test]
async fn the_alerts_page_lists_an_open_circuit_and_batches_ready_too_long_with_where_to_look() {
    let f = fixture(Duration::ZERO).await;
    f.open_the_checkers_circuit().await;
    let (status, page) = f.get("/alerts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<a href=\"/alerts\" aria-current=\"page\">Alerts</a>"), "in the nav, current: {page}");
    assert!(!page.contains("Nothing needs a person"), "{page}");
    let rows = alert_rows(&page);
    let circuit = rows.iter().find(|(kind, _, _)| kind == "circuit open").unwrap_or_else(|| panic!("{rows:?}"));
    assert!(circuit.1.starts_with("checker: circuit open for "), "{circuit:?}");
    assert!(circuit.1.contains("B1: the disk was full"), "{circuit:?}");
    assert_eq!(circuit.2, "/#steering", "a hold links to the overview's steering");
    let ready = rows.iter().find(|(kind, _, _)| kind == "ready too long").unwrap_or_else(|| panic!("{rows:?}"));
    assert!(ready.1.starts_with("checker: 1 batch ready for longer than 0s"), "{ready:?}");
    assert_eq!(ready.2, "/batches?q=component%3Achecker+state%3Aready", "{ready:?}");
    // The link lists exactly the overdue batch.
    let (status, list) = f.get(&ready.2.replace("&amp;", "&")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(list.contains("<strong>1</strong> batches match") && list.contains("href=\"/batches/B1\""), "{list}");
    // The overview has the section the hold's link points at.
    let (_, overview) = f.get("/").await;
    assert!(overview.contains("id=\"steering\""), "{overview}");
}

#[tokio::test]
async fn the_alerts_page_says_when_nothing_needs_a_person() {
    let f = fixture(Duration::from_secs(3600)).await;
    let (status, page) = f.get("/alerts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Nothing needs a person."), "{page}");
    assert!(alert_rows(&page).is_empty(), "{page}");
}

#[tokio::test]
async fn every_page_names_utc_in_its_footer_and_writes_its_times_in_utc() {
    let f = fixture(Duration::from_secs(3600)).await;
    for path in ["/", "/batches", "/batches/B1", "/waiting", "/alerts", "/login"] {
        let (status, page) = f.get(path).await;
        assert!(status == StatusCode::OK || path == "/login", "{path}: {status}\n{page}");
        let footer = &page[page.find("<footer>").unwrap_or_else(|| panic!("{path}: a footer\n{page}"))..];
        assert!(
            footer.contains("Times are UTC, written <code>YYYY-MM-DDThh:mm:ss.sssZ</code>, by the store's clock."),
            "{path}: {footer}"
        );
        // Every <time> is UTC, in that one format.
        for time in page.split("<time datetime=\"").skip(1) {
            let value = time.split('"').next().unwrap();
            assert!(
                value.len() == 24
                    && value.ends_with('Z')
                    && value.as_bytes()[10] == b'T'
                    && value.as_bytes()[19] == b'.',
                "{path}: {value}"
            );
            assert!(time.contains(&format!(">{value}</time>")), "{path}: shown as written: {time}");
        }
    }
    let (_, batch) = f.get("/batches/B1").await;
    assert!(batch.contains("<time datetime=\""), "the batch page shows times: {batch}");
    // The script's "Updated at" line is UTC too, in the same format.
    let (_, js) = f.get(&script_url(&batch)).await;
    assert!(js.contains("new Date().toISOString()") && !js.contains("toLocaleTimeString"), "{js}");
}

fn script_url(page: &str) -> String {
    let at = page.find("<script src=\"").expect("a script") + "<script src=\"".len();
    page[at..].split('"').next().unwrap().replace("&amp;", "&")
}

#[tokio::test]
async fn the_stylesheet_follows_dark_mode_and_keeps_narrow_pages_from_scrolling_sideways() {
    let f = fixture(Duration::from_secs(3600)).await;
    let (_, page) = f.get("/").await;
    let at = page.find("<link rel=\"stylesheet\" href=\"").unwrap() + "<link rel=\"stylesheet\" href=\"".len();
    let url = page[at..].split('"').next().unwrap().replace("&amp;", "&");
    let (status, css) = f.get(&url).await;
    assert_eq!(status, StatusCode::OK);
    assert!(css.contains("color-scheme: light dark;"), "{css}");
    let dark = css.find("@media (prefers-color-scheme: dark)").expect("a dark-mode block");
    let marker = css.find("/* blocks added by views below */").expect("the marker for the views' blocks");
    assert!(dark < marker, "the dark theme is above the views' blocks");
    // The dark theme sets every colour the light one does.
    let light_vars = |block: &str| -> Vec<String> {
        block
            .lines()
            .filter_map(|l| l.trim().strip_prefix("--"))
            .map(|l| l.split(':').next().unwrap().to_owned())
            .collect()
    };
    let root = &css[css.find(":root {").unwrap()..dark];
    let dark_block = &css[dark..dark + css[dark..].find("\n}\n").unwrap()];
    let (light, dark) = (light_vars(root), light_vars(dark_block));
    assert!(light.len() > 20, "{light:?}");
    assert_eq!(light, dark, "the same custom properties in both themes");
    // Outside the custom properties, no rule names a colour of its own.
    let rules = &css[css.find("* { box-sizing").unwrap()..marker];
    assert!(!rules.contains('#'), "a literal colour outside the themes");
    assert!(css.contains("overflow-wrap: anywhere;") && css.contains(".scroll { overflow-x: auto;"), "{css}");
}
