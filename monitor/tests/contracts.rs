//! The results the steps publish and what reads them, under the pipeline graph (`/graph`)
//! and in `autocomp pipeline`: a producer's result schema shown as escaped JSON, a reader's
//! expectation checked against it, a broken contract named in words (field and both
//! versions), and the overview naming which versions run where while hosts are upgraded.

use crate::support;

use autocomp_framework::config::ComponentConfig;
use autocomp_model::{ComponentName, EventType, PassOutcome, PassPhase, PassRecord, ResultRead, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Format;
use autocomp_store::ObjectStore;
use axum::http::StatusCode;
use serde_json::{Value, json};
use support::temp_pipeline;

/// A pass of `name` recording `event_type`, requiring `requires`, publishing `schema` and
/// reading `reads`.
async fn register(
    store: &dyn ObjectStore,
    (name, version): (&str, &str),
    (event_type, requires): (&str, &str),
    schema: Option<Value>,
    reads: Vec<ResultRead>,
) {
    let trigger = Trigger::builder().requires(requires).blocked_by(event_type).build();
    let own = EventType::new(event_type).unwrap();
    let mut descriptor =
        ComponentConfig::default().descriptor(ComponentName::new(name).unwrap(), version, own, trigger, false);
    descriptor.result_schema = schema;
    descriptor.reads = reads;
    let phase = PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
    store.record_pass(PassRecord { descriptor, host: "host1".into(), phase }).await.unwrap();
}

/// The archiver's result, its description holding markup that must be shown as text.
fn archived(path_field: &str) -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Archived",
        "description": "Where the <b>archive</b> & its size",
        "type": "object",
        "properties": {path_field: {"type": "string"}, "size": {"type": "integer", "minimum": 0}},
        "required": [path_field, "size"]
    })
}

fn expects_archive_path() -> Vec<ResultRead> {
    let schema = json!({
        "type": "object",
        "properties": {"archive_path": {"type": "string"}},
        "required": ["archive_path"]
    });
    vec![ResultRead { event_type: EventType::new("Data_Archived").unwrap(), schema }]
}

#[tokio::test]
async fn the_graph_page_shows_each_published_schema_escaped_and_flags_a_broken_contract() {
    let (operator, store, _dir) = temp_pipeline(Some("tester")).await;
    let s = store.as_ref();
    register(s, ("archiver", "0.2.0"), ("Data_Archived", "Data_Received"), Some(archived("archive_path")), vec![])
        .await;
    register(s, ("access-copy", "0.1.0"), ("Access_Copied", "Data_Archived"), None, expects_archive_path()).await;
    let monitor = Monitor::new(operator.clone(), Settings::default());
    let router = web::router(monitor, WebOptions::default());

    let (status, page) = support::get(&router, "/graph").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<h2>Results and what reads them</h2>"), "{page}");
    assert!(page.contains("<pre class=\"json\" tabindex=\"0\">"), "{page}");
    // The schema as pretty JSON, escaped: its markup is text, not elements.
    assert!(page.contains("Where the &lt;b&gt;archive&lt;/b&gt; &amp; its size"), "{page}");
    assert!(!page.contains("<b>archive</b>"), "{page}");
    assert!(page.contains("&quot;archive_path&quot;: {"), "{page}");
    assert!(page.contains("publishes Data_Archived: archive_path: string, size: integer"), "{page}");
    assert!(page.contains("Reads Data_Archived's result, requiring archive_path: string: compatible with what archiver 0.2.0 publishes."), "{page}");
    assert!(!page.contains("Broken contracts"), "{page}");
    let text = operator.pipeline_view().await.unwrap().render(Format::Text);
    assert!(text.contains("archiver Data_Archived result: archive_path: string, size: integer"), "{text}");
    assert!(
        text.contains("access-copy reads Data_Archived: archive_path: string (compatible with archiver 0.2.0)"),
        "{text}"
    );

    // A new archiver renames the field: the page and `autocomp pipeline` say whose pass
    // will not start, on which field, between which versions.
    register(s, ("archiver", "0.3.0"), ("Data_Archived", "Data_Received"), Some(archived("path")), vec![]).await;
    let (_, page) = support::get(&router, "/graph").await;
    let broken = "access-copy 0.1.0 reads Data_Archived's result expecting archive_path (string, required), but \
                  archiver 0.3.0 publishes no archive_path (renamed or removed?)";
    assert!(page.contains("<strong>Broken contracts</strong>"), "{page}");
    assert!(page.contains(&format!("<li>{}</li>", broken.replace('\'', "&#39;"))), "{page}");
    assert!(page.contains("<details open><summary><strong>access-copy</strong>"), "{page}");
    // The graph's arrow into the reader is drawn broken.
    assert!(page.contains("<g class=\"edge broken\"><title>Data_Archived: recorded by archiver, required by access-copy; contract broken"), "{page}");
    // The overview's "Needs a person" and the alerts page say so first.
    let (_, overview) = support::get(&router, "/").await;
    let needs = format!(
        "<strong>access-copy</strong>: every pass stops before any work, contract broken: {}",
        broken.replace('\'', "&#39;")
    );
    assert!(overview.contains(&needs), "{overview}");
    assert!(overview.contains("href=\"/graph#contracts\">the results and what reads them</a>"), "{overview}");
    let (_, alerts) = support::get(&router, "/alerts").await;
    assert!(alerts.contains("contract broken") && alerts.contains("/graph#contracts"), "{alerts}");
    let view = operator.pipeline_view().await.unwrap();
    let text = view.render(Format::Text);
    assert!(text.contains("broken contracts (the reader's passes do not start, exit 2):"), "{text}");
    assert!(text.contains(broken), "{text}");
    let json = serde_json::to_value(view.json()).unwrap();
    let contract = &json["contracts"][0];
    assert_eq!((contract["reader"].as_str(), contract["compatible"].as_bool()), (Some("access-copy"), Some(false)));
    assert_eq!(contract["requires"], json!(["archive_path: string"]));
    let archiver = json["components"].as_array().unwrap().iter().find(|c| c["descriptor"]["name"] == "archiver");
    assert_eq!(archiver.unwrap()["descriptor"]["result_schema"], archived("path"));

    // Nothing published or read: no section at all.
    let (plain, plain_store, _plain_dir) = temp_pipeline(Some("tester")).await;
    register(plain_store.as_ref(), ("probe", "1.0.0"), ("Probed", "Data_Received"), None, vec![]).await;
    let router = web::router(Monitor::new(plain, Settings::default()), WebOptions::default());
    let (_, page) = support::get(&router, "/graph").await;
    assert!(page.contains("<svg") && !page.contains("Results and what reads them"), "{page}");
}

/// A result recorded under the schema its producer published then, after the producer
/// renamed the field a reader reads: the batch page and `show` mark it as made under an older
/// schema, say it does not fit the one published now and that the reader refuses it, with
/// the restart that records it afresh; a result made under the current schema is not marked.
#[tokio::test]
async fn a_result_made_under_an_older_schema_is_marked_with_the_restart_that_refreshes_it() {
    use autocomp_model::{Agent, BatchId, BatchType, NewBatch, NewEvent, Outcome, schema_digest};
    let (operator, store, _dir) = temp_pipeline(Some("tester")).await;
    let s = store.as_ref();
    let (old, new) = (archived("archive_path"), archived("path"));
    register(s, ("archiver", "0.2.0"), ("Data_Archived", "Data_Received"), Some(old.clone()), vec![]).await;
    let agent = Agent::new("archiver/0.2.0@host1#1").unwrap();
    let archive = |id: &str, result: Value, schema: &Value| {
        let event = NewEvent::new(EventType::new("Data_Archived").unwrap(), Outcome::Success, agent.clone())
            .with_details(json!({"result": result, "result_schema": schema_digest(schema)}));
        (BatchId::new(id).unwrap(), event)
    };
    for (id, event) in [
        archive("B1", json!({"archive_path": "/a/B1", "size": 1}), &old),
        archive("B2", json!({"path": "/a/B2", "size": 2}), &new),
    ] {
        s.create_batch(NewBatch::new(id.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        s.append_event(&id, event).await.unwrap();
    }
    // The archiver renames its field; the reader still reads archive_path.
    register(s, ("archiver", "0.3.0"), ("Data_Archived", "Data_Received"), Some(new.clone()), vec![]).await;
    register(s, ("access-copy", "0.1.0"), ("Access_Copied", "Data_Archived"), None, expects_archive_path()).await;

    let router = web::router(Monitor::new(operator.clone(), Settings::default()), WebOptions::default());
    let (status, page) = support::get(&router, "/batches/B1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<h2 id=\"older-results-heading\">Results made under an older schema</h2>"), "{page}");
    let (old_digest, new_digest) = (schema_digest(&old), schema_digest(&new));
    let marked = format!(
        "Data_Archived seq 2 was made under schema {} of archiver (now {}, archiver 0.3.0); it does not fit it at the \
         result itself: &quot;path&quot; is a required property. Records it afresh: <code>autocomp restart B1 --from \
         Data_Archived --reason ...</code>",
        &old_digest[..19],
        &new_digest[..19]
    );
    assert!(page.contains(&marked), "{page}");
    let (_, fresh) = support::get(&router, "/batches/B2").await;
    assert!(!fresh.contains("older-results"), "made under the current schema: {fresh}");

    // show says the same; the reader reads archive_path, which B1's result still gives.
    let shown = operator.show(&BatchId::new("B1").unwrap()).await.unwrap();
    let text = shown.render(Format::Text);
    assert!(
        text.contains("\nresults made under an older schema:\n  Data_Archived seq 2 was made under schema"),
        "{text}"
    );
    assert!(text.contains("; records it afresh: autocomp restart B1 --from Data_Archived --reason ..."), "{text}");
    let json = shown.to_json();
    assert_eq!(json["older_results"][0]["made_under"], old_digest);
    assert_eq!(json["older_results"][0]["published_now"], new_digest);
    assert_eq!(json["older_results"][0]["refused_by"], json!([]));
}

/// Hosts upgraded one at a time: the overview says which version runs where.
#[tokio::test]
async fn the_overview_says_which_versions_run_where_while_hosts_are_upgraded() {
    let (operator, store, _dir) = temp_pipeline(Some("tester")).await;
    let s = store.as_ref();
    register(s, ("archiver", "0.1.0"), ("Data_Archived", "Data_Received"), None, vec![]).await;
    let trigger = Trigger::builder().requires("Data_Received").blocked_by("Data_Archived").build();
    let own = EventType::new("Data_Archived").unwrap();
    let descriptor =
        ComponentConfig::default().descriptor(ComponentName::new("archiver").unwrap(), "0.2.0", own, trigger, false);
    let phase = PassPhase::Ended { outcome: PassOutcome::Idle, summary: String::new(), duration_ms: 1, work: vec![] };
    store.record_pass(PassRecord { descriptor, host: "host2".into(), phase }).await.unwrap();
    let monitor = Monitor::new(operator.clone(), Settings::default());
    let router = web::router(monitor, WebOptions::default());
    let (status, page) = support::get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("mixed versions: 0.2.0 on host2; 0.1.0 on host1"), "{page}");
    let text = operator.pipeline_view().await.unwrap().render(Format::Text);
    assert!(text.contains("archiver: 0.2.0 on host2; 0.1.0 on host1"), "{text}");
}
