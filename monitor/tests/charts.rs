//! The charts (`/charts`) and the backlog sampler against a real embedded pipeline (SQLite
//! store, local index and locks in a temp dir), called through the router: each component
//! listed, the tables behind its charts holding the results, durations and backlog
//! recorded, every range drawn, bad input a 400 naming the field and value; and the sampler
//! recording each (not retired) component's ready count.

use crate::support;

use std::sync::Arc;

use autocomp_framework::config::ComponentConfig;
use autocomp_model::{
    Agent, BatchType, ComponentName, EventType, NewBatch, NewEvent, Outcome, PassOutcome, PassPhase, PassRecord,
    SeriesStep, Timestamp, Trigger, WorkDone, WorkResult,
};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::sampler;
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use support::{id, temp_pipeline};

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    operator: Operator,
    _dir: tempfile::TempDir,
}

/// A pass of `name` (recording `event_type` after `requires`) that did `work`.
fn pass(name: &str, event_type: &str, requires: &str, work: &[(WorkResult, u64)]) -> PassRecord {
    let own = EventType::new(event_type).unwrap();
    let trigger = Trigger::builder().requires(requires).blocked_by(event_type).build();
    let descriptor =
        ComponentConfig::default().descriptor(ComponentName::new(name).unwrap(), "1.0.0", own, trigger, false);
    let work: Vec<WorkDone> =
        work.iter().map(|(result, duration_ms)| WorkDone { result: *result, duration_ms: *duration_ms }).collect();
    let outcome = if work.is_empty() { PassOutcome::Idle } else { PassOutcome::Ok };
    PassRecord {
        descriptor,
        host: "host1".into(),
        phase: PassPhase::Ended { outcome, summary: "worked".into(), duration_ms: 50, work },
    }
}

/// `probe` (Probed after Data_Received) and `checker` (Checked after Probed). B1 and B3 are
/// ready for the probe, B2 for the checker. The probe's pass did 3 successes (7-9 ms) and a
/// failure (2 s).
async fn fixture() -> Fixture {
    let (operator, store, dir) = temp_pipeline(None).await;
    use WorkResult::{Failure, Success};
    let work = [(Success, 8), (Success, 9), (Success, 7), (Failure, 2_000)];
    store.record_pass(pass("probe", "Probed", "Data_Received", &work)).await.unwrap();
    store.record_pass(pass("checker", "Checked", "Probed", &[])).await.unwrap();
    let agent = Agent::new("test").unwrap();
    for (batch, events) in
        [("B1", &["Data_Received"][..]), ("B2", &["Data_Received", "Probed"][..]), ("B3", &["Data_Received"][..])]
    {
        store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for event_type in events {
            let event = NewEvent::new(EventType::new(*event_type).unwrap(), Outcome::Success, agent.clone());
            store.append_event(&id(batch), event).await.unwrap();
        }
    }
    let router = web::router(Monitor::new(operator.clone(), Settings::default()), WebOptions::default());
    Fixture { router, store, operator, _dir: dir }
}

impl Fixture {
    async fn get(&self, uri: &str) -> (StatusCode, String) {
        support::get_as(&self.router, "monitor.test", [127, 0, 0, 1], uri).await
    }
}

/// The `<table>` whose caption starts with `caption`.
fn table<'a>(page: &'a str, caption: &str) -> &'a str {
    let at = page.find(&format!("\">{caption}")).unwrap_or_else(|| panic!("no table captioned {caption:?} in {page}"));
    let start = page[..at].rfind("<table").unwrap();
    let end = page[at..].find("</table>").unwrap() + at;
    &page[start..end]
}

/// Checks a page's every `<svg>` is an image with its title and description, and holds no
/// inline style or script (the policy forbids them) and no external reference.
fn assert_images(page: &str, expected: usize) {
    let svgs: Vec<&str> = page.split("<svg").skip(1).map(|s| s.split_once("</svg>").expect("the svg ends").0).collect();
    assert_eq!(svgs.len(), expected, "{page}");
    for svg in svgs {
        let id = svg.split_once("aria-labelledby=\"").unwrap().1.split_once('-').unwrap().0;
        assert!(svg.contains("role=\"img\""), "{svg}");
        assert!(svg.contains("viewBox=\"0 0 420 200\""), "scales to its column: {svg}");
        assert!(svg.contains(&format!("<title id=\"{id}-")) && svg.contains("<desc id="), "{svg}");
        assert!(!svg.contains("style=") && !svg.contains("<script") && !svg.contains("http"), "{svg}");
        assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count(), "{svg}");
    }
    assert!(page.contains("times UTC"), "the time convention is named");
}

#[tokio::test]
async fn the_charts_list_each_component_with_the_numbers_recorded() {
    let f = fixture().await;
    let samples = sampler::sample_once(&f.operator).await.unwrap();
    assert_eq!(samples.len(), 2);
    let (status, page) = f.get("/charts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("charts.html"), &page).unwrap();
    assert!(page.contains("<a href=\"/charts\" aria-current=\"page\">Charts</a>"), "in the site navigation");
    for name in ["probe", "checker"] {
        assert!(
            page.contains(&format!("<a href=\"/charts?component={name}&amp;range=hour\">{name}</a></h2>")),
            "{name} listed with a link to its own charts"
        );
    }
    assert_images(&page, 6);
    // The probe's results: 3 successes and a failure in one minute.
    let results = table(&page, "Results by outcome of probe");
    assert!(results.contains("<td>3</td><td>1</td><td>0</td><td>4</td>"), "{results}");
    assert!(results.contains("<th scope=\"col\">success</th>") && results.contains("<th scope=\"row\">"), "{results}");
    // p50 among the quick ones (5-10 ms), p95 the failure's bucket (1-2.5 s).
    let durations = table(&page, "Work duration, p50 and p95 of probe");
    assert!(durations.contains("<td>4</td><td>8ms</td><td>2.2s</td>"), "{durations}");
    // The backlog as sampled: 2 ready for the probe, 1 for the checker.
    let backlog = table(&page, "Backlog (batches ready) of probe");
    assert!(backlog.contains("<td>2</td>") && backlog.contains("no sample"), "{backlog}");
    assert!(table(&page, "Backlog (batches ready) of checker").contains("<td>1</td>"));
    assert!(page.contains("4 results in the last hour: 3 success, 1 failure, 0 transient"), "{page}");
    // The checker did nothing: its charts say so.
    assert!(table(&page, "Results by outcome of checker").contains("<td>0</td><td>0</td><td>0</td><td>0</td>"));
    assert!(page.contains("no results in the last hour"), "{page}");
}

#[tokio::test]
async fn one_component_renders_over_a_day_and_thirty_days() {
    let f = fixture().await;
    sampler::sample_once(&f.operator).await.unwrap();
    let (status, hour) = f.get("/charts?component=probe").await;
    assert_eq!(status, StatusCode::OK, "{hour}");
    assert!(hour.contains("<h1>Charts: probe</h1>"));
    assert_images(&hour, 3);
    assert!(!hour.contains("of checker"), "only the probe");
    assert!(hour.contains("<a href=\"/charts?component=probe&amp;range=day\">Last 24 hours</a>"), "range links");
    assert!(hour.contains("<a href=\"/charts?component=checker&amp;range=hour\">checker</a>"), "component links");

    let (status, day) = f.get("/charts?component=probe&range=day").await;
    assert_eq!(status, StatusCode::OK, "{day}");
    assert_images(&day, 3);
    assert!(day.contains("Results per hour"));
    let results = table(&day, "Results by outcome of probe");
    // An hour a row, from the first hour with data (at least 12).
    assert_eq!(results.matches("<tr><th scope=\"row\">").count(), 12, "an hour a row");
    assert!(results.contains("<td>3</td><td>1</td><td>0</td><td>4</td>"), "{results}");
    assert!(table(&day, "Backlog (batches ready) of probe").contains("<td>2</td>"));

    let (status, month) = f.get("/charts?component=probe&range=month").await;
    assert_eq!(status, StatusCode::OK, "{month}");
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("charts-month.html"), &month).unwrap();
    assert_images(&month, 3);
    let results = table(&month, "Results by outcome of probe");
    assert!(results.contains("per day (UTC), summed from the hourly tallies"), "the caption says so: {results}");
    let days = results.matches("<tr><th scope=\"row\">").count();
    // A day a row, from the first with data: at least the last 7 days.
    assert!((7..=8).contains(&days), "a day a row: {days}");
    assert!(results.contains("<td>3</td><td>1</td><td>0</td><td>4</td>"), "{results}");
    assert!(table(&month, "Work duration, p50 and p95 of probe").contains("2.2s"));
    assert!(table(&month, "Backlog (batches ready) of probe").contains("<td>2</td>"));
}

#[tokio::test]
async fn a_bad_range_or_an_unknown_component_is_a_400_naming_it() {
    let f = fixture().await;
    for (uri, field, value) in [
        ("/charts?range=week", "range", "week"),
        ("/charts?component=probe&range=%3Cb%3E", "range", "&lt;b&gt;"),
        ("/charts?component=nobody", "component", "nobody"),
    ] {
        let (status, page) = f.get(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {page}");
        assert!(
            page.contains(&format!(
                "<dt>Field</dt><dd><code>{field}</code></dd><dt>Value</dt><dd><code>{value}</code>"
            )),
            "{uri}: {page}"
        );
        assert!(!page.contains("<b>"), "escaped");
    }
    let (status, _) = f.get("/charts?component=&range=").await;
    assert_eq!(status, StatusCode::OK, "empty means the defaults");
}

#[tokio::test]
async fn an_empty_pipeline_has_nothing_to_chart() {
    let (operator, _store, _dir) = temp_pipeline(None).await;
    let router = web::router(Monitor::new(operator.clone(), Settings::default()), WebOptions::default());
    let f = Fixture { router, store: _store, operator, _dir };
    let (status, page) = f.get("/charts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("nothing to chart"), "{page}");
    assert!(sampler::sample_once(&f.operator).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_sampler_records_each_components_ready_count() {
    let f = fixture().await;
    let since = Timestamp(Timestamp::now().millis() - 60_000);
    let samples = sampler::sample_once(&f.operator).await.unwrap();
    let mut counts: Vec<(String, u64)> = samples.iter().map(|s| (s.component.to_string(), s.ready)).collect();
    counts.sort();
    assert_eq!(counts, [("checker".to_owned(), 1), ("probe".to_owned(), 2)]);
    for step in [SeriesStep::Minute, SeriesStep::Hour] {
        let points = f.store.work_series(step, since, None).await.unwrap();
        let newest = |name: &str| points.iter().rev().find(|p| p.component.as_str() == name).and_then(|p| p.backlog);
        assert_eq!((newest("probe"), newest("checker")), (Some(2), Some(1)), "{step:?}: {points:?}");
    }
    // A batch more ready for the checker: the next sample of the minute replaces the first.
    let event = NewEvent::new(EventType::new("Probed").unwrap(), Outcome::Success, Agent::new("test").unwrap());
    f.store.append_event(&id("B1"), event).await.unwrap();
    sampler::sample_once(&f.operator).await.unwrap();
    let points =
        f.store.work_series(SeriesStep::Minute, since, Some(&ComponentName::new("checker").unwrap())).await.unwrap();
    assert_eq!(points.last().and_then(|p| p.backlog), Some(2), "{points:?}");
    // A retired component is no longer sampled.
    let checker = ComponentName::new("checker").unwrap();
    f.store.retire_component(&checker, &Agent::new("test").unwrap(), "gone").await.unwrap();
    let samples = sampler::sample_once(&f.operator).await.unwrap();
    assert_eq!(samples.iter().map(|s| s.component.as_str()).collect::<Vec<_>>(), ["probe"]);
}
