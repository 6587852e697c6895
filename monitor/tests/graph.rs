//! The pipeline graph (`/graph`, and on the overview) against a real embedded pipeline
//! (SQLite store, local index and locks in a temp dir), called through the router: every
//! component a node, a type from outside an input node, the counts those of the overview
//! (and of `autocomp status`), each a link to exactly its list; sources, human steps and
//! held components marked; the SVG well-formed; twenty components drawn without overlap.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use autocomp_framework::config::ComponentConfig;
use autocomp_model::{
    Agent, BatchId, BatchType, ComponentName, ComponentState, EventType, NewBatch, NewEvent, Outcome, PassOutcome,
    PassPhase, PassRecord, Trigger,
};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::{Operator, Scope, SteerAction};
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use support::temp_pipeline;

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    monitor: Monitor,
    operator: Operator,
    _dir: tempfile::TempDir,
}

/// A component as its pass registers it: `source` and `manual` as given.
async fn register(store: &dyn ObjectStore, name: &str, event_type: &str, requires: &[&str], kind: (bool, bool)) {
    let own = EventType::new(event_type).unwrap();
    let mut builder = Trigger::builder();
    for t in requires {
        builder = builder.requires(*t);
    }
    let trigger = builder.blocked_by(event_type).build();
    let mut descriptor =
        ComponentConfig::default().descriptor(ComponentName::new(name).unwrap(), "1.0.0", own, trigger, false);
    (descriptor.source, descriptor.manual) = kind;
    let phase = PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
    store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
}

const PLAIN: (bool, bool) = (false, false);
const SOURCE: (bool, bool) = (true, false);
const HUMAN: (bool, bool) = (false, true);

/// An empty pipeline in a temp dir, read by an operator named tester.
async fn empty() -> (Operator, Arc<dyn ObjectStore>, tempfile::TempDir) {
    temp_pipeline(Some("tester")).await
}

fn fixture_of(operator: Operator, store: Arc<dyn ObjectStore>, dir: tempfile::TempDir) -> Fixture {
    let monitor = Monitor::new(operator.clone(), Settings::default());
    let router = web::router(monitor.clone(), WebOptions::default());
    Fixture { router, store, monitor, operator, _dir: dir }
}

/// intake (a source) records Data_Received; probe requires it; checker requires Probed and
/// is paused; review (a human step) requires Checked; archiver requires Reviewed and
/// Catalogued, which no component records. B1 failed at the checker, B2 is ready for it, B3
/// waits for a person at review, B4 has no event.
async fn fixture() -> Fixture {
    let (operator, store, dir) = empty().await;
    let s = store.as_ref();
    register(s, "intake", "Data_Received", &[], SOURCE).await;
    register(s, "probe", "Probed", &["Data_Received"], PLAIN).await;
    register(s, "checker", "Checked", &["Probed"], PLAIN).await;
    register(s, "review", "Reviewed", &["Checked"], HUMAN).await;
    register(s, "archiver", "Archived", &["Reviewed", "Catalogued"], PLAIN).await;
    let agent = Agent::new("test").unwrap();
    let ok = Outcome::Success;
    let stories: [(&str, &[(&str, Outcome)]); 4] = [
        ("B1", &[("Data_Received", ok), ("Probed", ok), ("Checked", Outcome::Failure)]),
        ("B2", &[("Data_Received", ok), ("Probed", ok)]),
        ("B3", &[("Data_Received", ok), ("Probed", ok), ("Checked", ok)]),
        ("B4", &[]),
    ];
    for (id, events) in stories {
        let id = BatchId::new(id).unwrap();
        store.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome) in events {
            let event = NewEvent::new(EventType::new(*event_type).unwrap(), *outcome, agent.clone());
            store.append_event(&id, event).await.unwrap();
        }
    }
    let pause = SteerAction::Pause { scope: Scope::Component("checker".into()) };
    operator.steer(&pause, "the disk was full", None).await.unwrap();
    fixture_of(operator, store, dir)
}

impl Fixture {
    async fn get(&self, uri: &str) -> (StatusCode, String) {
        support::get_as(&self.router, "monitor.test", [127, 0, 0, 1], uri).await
    }
}

/// The `<svg>...</svg>` of a page.
fn svg_of(page: &str) -> &str {
    let start = page.find("<svg").unwrap_or_else(|| panic!("no svg in {page}"));
    let end = page[start..].find("</svg>").expect("the svg ends") + start + "</svg>".len();
    &page[start..end]
}

/// Checks `xml` is well-formed as far as the SVG needs: every tag closed in order, attribute
/// values quoted, no stray `<` or `&` in text, only the entities `esc` writes.
fn assert_well_formed(xml: &str) {
    let mut open: Vec<&str> = Vec::new();
    let mut rest = xml;
    let check_text = |text: &str| {
        assert!(!text.contains('>'), "a stray > in {text:?}");
        let mut parts = text.split('&');
        parts.next();
        for part in parts {
            assert!(
                ["amp;", "lt;", "gt;", "quot;", "#39;"].iter().any(|e| part.starts_with(e)),
                "an entity XML does not know: &{part}"
            );
        }
    };
    while let Some(at) = rest.find('<') {
        check_text(&rest[..at]);
        let end = rest[at..].find('>').expect("a tag ends") + at;
        let tag = &rest[at + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name), "</{name}> closes something else; open: {open:?}");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let (name, attributes) = tag.split_once(' ').unwrap_or((tag, ""));
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "tag name {name:?}");
        // name="value" pairs, each value quoted and free of < and raw quotes.
        let mut attrs = attributes.trim();
        while !attrs.is_empty() {
            let (key, after) = attrs.split_once("=\"").unwrap_or_else(|| panic!("an unquoted attribute in <{tag}>"));
            assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':'), "attribute {key:?}");
            let close = after.find('"').expect("the value ends");
            check_text(&after[..close]);
            assert!(!after[..close].contains('<'), "< in an attribute of <{tag}>");
            attrs = after[close + 1..].trim_start();
        }
        if !self_closing {
            open.push(name);
        }
    }
    check_text(rest);
    assert!(open.is_empty(), "left open: {open:?}");
}

/// Every count link of the graph: (component, state) -> (count, href).
fn count_links(svg: &str) -> BTreeMap<(String, String), (u64, String)> {
    let mut links = BTreeMap::new();
    for piece in svg.split("<a href=\"").skip(1) {
        let (href, rest) = piece.split_once('"').unwrap();
        let label = rest.split_once("aria-label=\"").unwrap().1.split_once('"').unwrap().0;
        // "3 failed at checker": the link's text ("3 failed") and where.
        let words: Vec<&str> = label.split(' ').collect();
        assert_eq!((words.len(), words[2]), (4, "at"), "{label}");
        let count: u64 = words[0].parse().unwrap();
        let text = rest.split_once('>').unwrap().1.split_once("</a>").unwrap().0;
        assert!(text.contains(&format!(">{count} {}</text>", words[1])), "the link says its count: {text}");
        let key = (words[3].to_owned(), words[1].to_owned());
        assert!(links.insert(key, (count, href.replace("&amp;", "&"))).is_none(), "two links for {label}");
    }
    links
}

/// The `<g>` of a component's node.
fn node<'a>(svg: &'a str, name: &str) -> &'a str {
    let at = svg.find(&format!("data-component=\"{name}\"")).unwrap_or_else(|| panic!("no node for {name}"));
    let start = svg[..at].rfind("<g ").unwrap();
    let end = svg[at..].find("</g>").unwrap() + at;
    &svg[start..end]
}

#[tokio::test]
async fn the_graph_shows_every_component_with_the_overviews_counts_each_linked_to_its_list() {
    let f = fixture().await;
    let (status, page) = f.get("/graph").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("graph-5.html"), &page).unwrap();
    let svg = svg_of(&page);
    assert_well_formed(svg);
    assert!(svg.contains("role=\"group\" aria-labelledby=\"graph-title\""), "{svg}");
    assert!(svg.contains("<title id=\"graph-title\">Pipeline graph of 5 components</title>"), "{svg}");
    assert!(!svg.contains("style=") && !page.contains("<script>"), "no inline style or script: {svg}");
    // Inline in HTML, an <svg> needs no namespace (and the page names no external URL).
    assert!(!page.contains("http://") && !page.contains("https://"), "{page}");

    // Every component is a node; the type from outside is an input node.
    let overview = f.monitor.overview().await.unwrap();
    let names: Vec<String> = overview.rows.iter().map(|r| r.component.name().to_string()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    for name in &names {
        assert!(node(svg, name).contains(&format!(">{name}</text>")), "{name}: {svg}");
    }
    assert!(svg.contains("<g class=\"node input\"><title>Catalogued: recorded by no component"), "{svg}");
    // Each required type is an edge from its producer.
    for (from, to, t) in [
        ("intake", "probe", "Data_Received"),
        ("probe", "checker", "Probed"),
        ("checker", "review", "Checked"),
        ("review", "archiver", "Reviewed"),
        ("outside the pipeline", "archiver", "Catalogued"),
    ] {
        assert!(svg.contains(&format!("<title>{t}: recorded by {from}, required by {to}</title>")), "{t}: {svg}");
    }

    // Sources, human steps and held components are marked, in words as well as shapes.
    assert!(node(svg, "intake").starts_with("<g class=\"node component source\""), "{svg}");
    assert!(node(svg, "intake").contains(">source · records Data_Received</text>"), "{svg}");
    assert!(node(svg, "review").starts_with("<g class=\"node component human\""), "{svg}");
    assert!(node(svg, "review").contains(">human step · records Reviewed</text>"), "{svg}");
    assert!(node(svg, "checker").starts_with("<g class=\"node component held\""), "{svg}");
    assert!(node(svg, "checker").contains("hold-paused") && node(svg, "checker").contains("paused</text>"), "{svg}");
    assert!(!node(svg, "probe").contains("held"), "{svg}");

    // The counts are the overview's non-zero counts, and those of `autocomp status`.
    let links = count_links(svg);
    let mut expected = BTreeMap::new();
    for row in &overview.rows {
        for (state, count) in row.counts.iter().filter(|(_, n)| *n > 0) {
            expected.insert((row.component.name().to_string(), state.as_str().to_owned()), *count);
        }
    }
    let shown: BTreeMap<_, u64> = links.iter().map(|(k, (n, _))| (k.clone(), *n)).collect();
    assert_eq!(shown, expected);
    let cli = f.operator.status(None, None).await.unwrap();
    let mut tallies: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (_, states) in &cli.rows {
        for (component, state) in cli.components.iter().zip(states) {
            *tallies.entry((component.to_string(), state.as_str().to_owned())).or_default() += 1;
        }
    }
    let without_overdue: BTreeMap<_, u64> =
        shown.iter().filter(|((_, s), _)| s != "overdue").map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(without_overdue, tallies, "the graph's counts are autocomp status's");
    assert_eq!(shown.get(&("checker".into(), "failed".into())), Some(&1), "{shown:?}");
    assert_eq!(shown.get(&("review".into(), ComponentState::Person.as_str().into())), Some(&1), "{shown:?}");

    // Each count links to its list, which lists as many batches.
    for ((component, state), (count, href)) in &links {
        assert_eq!(href, &format!("/batches?q=component%3A{component}+state%3A{state}"));
        let (status, list) = f.get(href).await;
        assert_eq!(status, StatusCode::OK, "{href}: {list}");
        assert!(list.contains(&format!("<strong>{count}</strong> batches match")), "{href}: {list}");
    }

    // The overview carries the same graph.
    let (status, overview_page) = f.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(count_links(svg_of(&overview_page)), links);
    assert!(f.store.head().await.is_ok());
}

#[tokio::test]
async fn twenty_components_are_drawn_without_overlap_and_an_empty_pipeline_without_a_graph() {
    let (operator, store, dir) = empty().await;
    let f = fixture_of(operator, store, dir);
    let (status, page) = f.get("/graph").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<svg") && page.contains("the pipeline is empty"), "{page}");

    // A source, a chain of ten after it, and nine each requiring one step of the chain and
    // one type from outside: twenty nodes in eleven columns, and the input beside each of its consumers.
    let s = f.store.as_ref();
    register(s, "source-with-a-rather-long-name-indeed", "T0", &[], SOURCE).await;
    for i in 1..=10 {
        let before = format!("T{}", i - 1);
        register(s, &format!("step-{i:02}"), &format!("T{i}"), &[&before], PLAIN).await;
    }
    for i in 1..=9 {
        let at = format!("T{i}");
        register(
            s,
            &format!("side-{i:02}"),
            &format!("S{i}"),
            &[&at, "External_Type"],
            if i == 5 { HUMAN } else { PLAIN },
        )
        .await;
    }
    let (status, page) = f.get("/graph").await;
    assert_eq!(status, StatusCode::OK);
    // For a look: target/tmp/graph-20.html.
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("graph-20.html"), &page).unwrap();
    let svg = svg_of(&page);
    assert_well_formed(svg);
    let boxes: Vec<(u32, u32, u32, u32)> = svg
        .split("<rect class=\"box\" ")
        .skip(1)
        .map(|piece| {
            let number = |key: &str| -> u32 {
                piece.split_once(&format!("{key}=\"")).unwrap().1.split_once('"').unwrap().0.parse().unwrap()
            };
            (number("x"), number("y"), number("width"), number("height"))
        })
        .collect();
    assert_eq!(boxes.len(), 20, "{svg}");
    for (i, a) in boxes.iter().enumerate() {
        for b in &boxes[i + 1..] {
            let apart = a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
            assert!(apart, "{a:?} overlaps {b:?}");
        }
    }
    // The long name is cut, and whole in the node's title.
    let long = node(svg, "source-with-a-rather-long-name-indeed");
    assert!(long.contains("<title>source-with-a-rather-long-name-indeed: source · records T0</title>"), "{long}");
    assert!(long.contains(">source-with-a-rather-lo…</text>"), "{long}");
    assert!(svg.contains("viewBox=\"0 0 ") && svg.contains("class=\"wide\""), "{svg}");
    // An input node beside each column of its consumers.
    assert_eq!(svg.matches("<g class=\"node input\">").count(), 9, "{svg}");
}
