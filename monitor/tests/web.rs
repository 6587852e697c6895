//! The web monitor against a real embedded pipeline (SQLite store, local index and locks in
//! a temp dir), called through its router: caching (ETag/304), escaping, who may write and
//! from where, preview-then-confirm writing exactly one event as the signed-in operator,
//! bad input naming the field, and the CSV export.

use std::sync::Arc;

use autocomp_framework::config::Backends;
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Seq, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::json;
use tower::ServiceExt;

const TOKEN: &str = "s3cret-t0ken";
const HOST: &str = "monitor.test:7072";
const REASON: &str = "the disk was full";

/// Form fields, as a browser posts them.
type Fields<'a> = &'a [(&'a str, &'a str)];
/// A batch of the fixture: id, metadata, events.
type Story<'a> = (&'a str, serde_json::Value, &'a [(&'a str, Outcome)]);

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    monitor: Monitor,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: header::HeaderName) -> &str {
        self.headers.get(&name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    fn cookies(&self) -> Vec<String> {
        self.headers.get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
    }
}

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

/// `probe` records Probed after Data_Received, `checker` records Checked after Probed. B1:
/// the checker failed; B2: probed, ready for the checker; B3: hostile metadata, waiting.
async fn fixture_with(options: WebOptions) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("config")).unwrap();
    let shared = format!(
        "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
        root.join("store.db").display(),
        root.join("index").display(),
        root.join("locks").display()
    );
    std::fs::write(root.join("config/autocomp.toml"), shared).unwrap();
    let operator = Operator::new(&root.join("config"), Backends::default(), None).unwrap();
    let store = operator.store().await.unwrap();
    for (name, event_type, requires) in [("probe", "Probed", "Data_Received"), ("checker", "Checked", "Probed")] {
        let trigger = Trigger::builder().requires(requires).build();
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    let agent = Agent::new("test").unwrap();
    let batches: [Story; 3] = [
        (
            "B1",
            json!({}),
            &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success), ("Checked", Outcome::Failure)],
        ),
        ("B2", json!({}), &[("Data_Received", Outcome::Success), ("Probed", Outcome::Success)]),
        ("B3", json!({"note": "<script>alert(1)</script>", "location": "/data/\"quoted\" & <b>"}), &[]),
    ];
    for (batch, metadata, events) in batches {
        let mut new = NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap());
        new.metadata = metadata;
        store.create_batch(new).await.unwrap();
        for (event_type, outcome) in events {
            store.append_event(&id(batch), NewEvent::new(ty(event_type), *outcome, agent.clone())).await.unwrap();
        }
    }
    let monitor = Monitor::new(operator, Settings::default());
    let router = web::router(monitor.clone(), options);
    Fixture { router, store, monitor, _dir: dir }
}

async fn fixture() -> Fixture {
    let options = WebOptions {
        token: Some(TOKEN.into()),
        trusted_user_header: Some(header::HeaderName::from_static("x-remote-user")),
    };
    fixture_with(options).await
}

impl Fixture {
    async fn send(&self, request: Request<Body>) -> Answer {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        Answer { status: parts.status, headers: parts.headers, body: String::from_utf8(bytes.to_vec()).unwrap() }
    }

    async fn get(&self, uri: &str, extra: &[(&str, &str)]) -> Answer {
        let mut request = Request::get(uri).header(header::HOST, HOST);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    async fn post(&self, uri: &str, form: &[(&str, &str)], extra: &[(&str, &str)]) -> Answer {
        let body: Vec<String> = form
            .iter()
            .map(|(k, v)| format!("{}={}", autocomp_monitor::filter::encode(k), autocomp_monitor::filter::encode(v)))
            .collect();
        let mut request = Request::post(uri)
            .header(header::HOST, HOST)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        self.send(request.body(Body::from(body.join("&"))).unwrap()).await
    }

    /// Signs in as `name` through the form; the `Cookie` header the browser would send.
    async fn sign_in(&self, name: &str) -> String {
        let answer = self.post("/login", &[("name", name), ("token", TOKEN), ("next", "/batches")], &[]).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let cookies: Vec<String> = answer.cookies().iter().map(|c| c.split(';').next().unwrap().to_owned()).collect();
        cookies.join("; ")
    }

    async fn head(&self) -> Seq {
        self.store.head().await.unwrap()
    }

    async fn events(&self, batch: &str) -> Vec<autocomp_model::Event> {
        self.store.get_batch(&id(batch)).await.unwrap().events
    }
}

#[tokio::test]
async fn pages_carry_an_etag_answer_304_while_unchanged_and_200_after_a_write() {
    let f = fixture().await;
    let first = f.get("/", &[]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let tag = first.header(header::ETAG).to_owned();
    assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag:?}");
    let again = f.get("/", &[("if-none-match", &tag)]).await;
    assert_eq!((again.status, again.body.as_str()), (StatusCode::NOT_MODIFIED, ""));
    assert_eq!(again.header(header::ETAG), tag);
    // Another page, another query, or someone signed in: another tag.
    let batches = f.get("/batches", &[]).await;
    let filtered = f.get("/batches?q=component:checker", &[]).await;
    let cookie = f.sign_in("tester").await;
    let signed_in = f.get("/", &[("cookie", &cookie)]).await;
    let tags = [&tag, batches.header(header::ETAG), filtered.header(header::ETAG), signed_in.header(header::ETAG)];
    for (i, a) in tags.iter().enumerate() {
        assert!(!a.is_empty());
        for b in &tags[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(f.get("/", &[("if-none-match", signed_in.header(header::ETAG))]).await.status, StatusCode::OK);
    // Any write moves the store's head, and with it every tag.
    let agent = Agent::new("test").unwrap();
    f.store.append_event(&id("B3"), NewEvent::new(ty("Data_Received"), Outcome::Success, agent)).await.unwrap();
    let after = f.get("/", &[("if-none-match", &tag)]).await;
    assert_eq!(after.status, StatusCode::OK);
    assert_ne!(after.header(header::ETAG), tag);
}

#[tokio::test]
async fn every_page_has_the_security_headers_landmarks_and_no_inline_code() {
    let f = fixture().await;
    for uri in ["/", "/batches", "/batches/B1", "/login", "/batches?q=colour:red", "/nowhere"] {
        let page = f.get(uri, &[]).await;
        assert!(page.header(header::CONTENT_SECURITY_POLICY).contains("default-src 'self'"), "{uri}");
        assert!(page.header(header::CONTENT_SECURITY_POLICY).contains("frame-ancestors 'none'"), "{uri}");
        assert_eq!(page.header(header::X_CONTENT_TYPE_OPTIONS), "nosniff", "{uri}");
        assert_eq!(page.header(header::REFERRER_POLICY), "same-origin", "{uri}");
        for needle in ["<html lang=\"en\">", "<title>", "<header>", "<nav", "<main id=\"main\"", "href=\"#main\""] {
            assert!(page.body.contains(needle), "{uri} lacks {needle}");
        }
        assert!(!page.body.contains("<script>") && !page.body.contains("style=\""), "{uri}: inline code");
        assert!(!page.body.contains("http://") && !page.body.contains("https://"), "{uri}: an external URL");
    }
    let overview = f.get("/", &[]).await.body;
    assert!(
        overview.contains("<caption")
            && overview.contains("<th scope=\"col\">")
            && overview.contains("<th scope=\"row\">")
    );
    assert!(overview.contains("/batches?q=component%3Achecker+state%3Afailed"), "{overview}");
    let matrix = f.get("/batches", &[]).await.body;
    assert!(matrix.contains("state-failed") && matrix.contains("aria-hidden=\"true\">✗</span> failed"), "{matrix}");
    let css_url = matrix.split("href=\"/assets/monitor.css?v=").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let css = f.get(&format!("/assets/monitor.css?v={css_url}"), &[]).await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.header(header::CACHE_CONTROL).contains("max-age=31536000"));
    assert_eq!(f.get("/health", &[]).await.body, "ok");
}

#[tokio::test]
async fn hostile_metadata_is_shown_as_text() {
    let f = fixture().await;
    let page = f.get("/batches/B3", &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{}", page.body);
    assert!(!page.body.contains("<script>alert"), "{}", page.body);
    assert!(!page.body.contains("<b>"));
    assert!(page.body.contains("&amp; &lt;b&gt;"));
}

#[tokio::test]
async fn writes_need_the_token_and_change_nothing_without_it() {
    let f = fixture().await;
    let head = f.head().await;
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")];
    let anonymous = f.post("/batches/B1/act", &form, &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{}", anonymous.body);
    let forged =
        f.post("/batches/B1/act", &form, &[("cookie", "autocomp_token=s3cret-t0ken; autocomp_operator=eve")]).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "the raw token is not the cookie's value");
    let bulk =
        f.post("/bulk", &[("q", ""), ("action", "prioritize"), ("priority", "5"), ("reason", REASON)], &[]).await;
    assert_eq!(bulk.status, StatusCode::UNAUTHORIZED);
    assert_eq!(f.head().await, head, "nothing written");
    // Signed out, the pages offer a way to sign in instead of the forms.
    let page = f.get("/batches/B1", &[]).await.body;
    assert!(page.contains("Sign in</a> to act") && !page.contains("name=\"reason\""), "{page}");

    let read_only = fixture_with(WebOptions::default()).await;
    let head = read_only.head().await;
    let refused = read_only.post("/batches/B1/act", &form, &[]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("read only"), "{}", refused.body);
    let login = read_only.post("/login", &[("name", "tester"), ("token", TOKEN)], &[]).await;
    assert_eq!(login.status, StatusCode::FORBIDDEN);
    assert_eq!(read_only.head().await, head);
}

#[tokio::test]
async fn cross_site_posts_are_refused_even_with_the_token() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let head = f.head().await;
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")];
    for extra in [
        vec![("origin", "http://evil.example")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "null")],
    ] {
        let mut headers = extra.clone();
        headers.push(("cookie", &cookie));
        let answer = f.post("/batches/B1/act", &form, &headers).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{extra:?}: {}", answer.body);
        // Refused before it could even sign anyone in.
        let login = f.post("/login", &[("name", "eve"), ("token", TOKEN)], &extra).await;
        assert_eq!(login.status, StatusCode::FORBIDDEN);
        assert!(login.cookies().is_empty());
    }
    assert_eq!(f.head().await, head, "nothing written");
    // The same form from the monitor's own page goes through.
    let own = [("cookie", cookie.as_str()), ("origin", "http://monitor.test:7072"), ("sec-fetch-site", "same-origin")];
    assert_eq!(f.post("/batches/B1/act", &form, &own).await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sign_in_sets_a_strict_http_only_cookie_and_a_wrong_token_sets_nothing() {
    let f = fixture().await;
    let wrong = f.post("/login", &[("name", "tester"), ("token", "guess")], &[]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.cookies().is_empty());
    assert!(!wrong.body.contains("guess"));
    let bad_name = f.post("/login", &[("name", "two words"), ("token", TOKEN)], &[]).await;
    assert_eq!(bad_name.status, StatusCode::BAD_REQUEST);
    assert!(bad_name.cookies().is_empty());

    let right = f.post("/login", &[("name", "tester"), ("token", TOKEN), ("next", "//evil.example/")], &[]).await;
    assert_eq!(right.status, StatusCode::SEE_OTHER);
    assert_eq!(right.header(header::LOCATION), "/", "never an open redirect");
    let cookies = right.cookies();
    let token = cookies.iter().find(|c| c.starts_with("autocomp_token=")).expect("the token cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(token.contains(attribute), "{token}");
    }
    assert!(!cookies.iter().any(|c| c.contains(TOKEN)), "the token itself is never in a cookie: {cookies:?}");
    let cookie: Vec<&str> = cookies.iter().map(|c| c.split(';').next().unwrap()).collect();
    let page = f.get("/batches/B1", &[("cookie", &cookie.join("; "))]).await.body;
    assert!(page.contains("Signed in as <strong>tester</strong>") && page.contains("name=\"reason\""), "{page}");
    assert!(!page.contains(TOKEN));

    let out = f.post("/logout", &[], &[("cookie", &cookie.join("; "))]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.cookies().iter().all(|c| c.contains("Max-Age=0")), "{:?}", out.cookies());
}

#[tokio::test]
async fn a_rerun_is_previewed_then_confirmed_and_records_one_reset_as_the_operator() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let before = f.events("B1").await;
    let head = f.head().await;
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON)];
    let preview = f.post("/batches/B1/act", &form, &[("cookie", &cookie)]).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(
        preview.body.contains("Will record Reset of Checked; checker: failed\u{a0}→\u{a0}ready."),
        "{}",
        preview.body
    );
    assert!(preview.body.contains("checker: failed\u{a0}→\u{a0}ready"), "{}", preview.body);
    assert!(preview.body.contains("name=\"confirm\" value=\"1\""));
    assert_eq!(f.head().await, head, "a preview writes nothing");

    let mut confirm = form.to_vec();
    confirm.push(("confirm", "1"));
    let done = f.post("/batches/B1/act", &confirm, &[("cookie", &cookie)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.header(header::LOCATION), "/batches/B1");
    let after = f.events("B1").await;
    assert_eq!(after.len(), before.len() + 1, "exactly one event appended");
    assert_eq!(&after[..before.len()], &before[..], "history only grows");
    let reset = after.last().unwrap();
    assert!(reset.event_type.is_reset());
    assert_eq!(reset.resets, vec![ty("Checked")]);
    assert_eq!(reset.agent.as_str(), "operator:tester");
    assert_eq!(reset.details["reason"], REASON);

    // The batch page shows the result once.
    let flash = done.cookies().into_iter().find(|c| c.starts_with("autocomp_flash=")).expect("a flash");
    let flash = flash.split(';').next().unwrap().to_owned();
    let page = f.get("/batches/B1", &[("cookie", &format!("{cookie}; {flash}"))]).await;
    assert!(page.body.contains("B1: recorded Reset of Checked"), "{}", page.body);
    assert!(page.cookies().iter().any(|c| c.starts_with("autocomp_flash=;")));

    // A refusal in the operator module's words, 409, nothing written.
    let head = f.head().await;
    let refused = f
        .post(
            "/batches/B2/act",
            &[("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")],
            &[("cookie", &cookie)],
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains("checker has no Checked result on B2 to rerun"), "{}", refused.body);
    assert_eq!(f.head().await, head);
}

#[tokio::test]
async fn a_trusted_proxy_header_signs_the_request_in() {
    let f = fixture().await;
    let form = [("action", "prioritize"), ("priority", "7"), ("reason", REASON), ("confirm", "1")];
    let done = f.post("/batches/B2/act", &form, &[("x-remote-user", "alice")]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let batch = f.store.get_batch(&id("B2")).await.unwrap();
    assert_eq!(batch.priority, 7);
    assert_eq!(batch.events.last().unwrap().agent.as_str(), "operator:alice");
}

#[tokio::test]
async fn a_bulk_action_previews_the_filter_then_acts_on_every_batch_of_it() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let head = f.head().await;
    let form =
        [("q", "type:RoundTrip"), ("order", "oldest"), ("action", "prioritize"), ("priority", "3"), ("reason", REASON)];
    let preview = f.post("/bulk", &form, &[("cookie", &cookie)]).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(preview.body.contains("3 selected: 3 would be acted on, 0 refused"), "{}", preview.body);
    assert!(preview.body.contains("name=\"expect\" value=\"3\""));
    assert_eq!(f.head().await, head);
    let mut confirm = form.to_vec();
    confirm.extend([("expect", "2"), ("confirm", "1")]);
    let stale = f.post("/bulk", &confirm, &[("cookie", &cookie)]).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "a count that moved is shown again, not acted on");
    assert_eq!(f.head().await, head);
    confirm[5] = ("expect", "3");
    let done = f.post("/bulk", &confirm, &[("cookie", &cookie)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.header(header::LOCATION), "/batches?q=type%3ARoundTrip");
    for batch in ["B1", "B2", "B3"] {
        assert_eq!(f.store.get_batch(&id(batch)).await.unwrap().priority, 3, "{batch}");
    }
    let flash = done.cookies().into_iter().find(|c| c.starts_with("autocomp_flash=")).unwrap();
    assert!(flash.contains("3+performed%2C+0+refused"), "{flash}");
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field_and_the_value() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let head = f.head().await;
    let gets = [
        ("/batches?q=colour:red", "q", "colour:red"),
        ("/batches?q=component:nosuch", "component", "nosuch"),
        ("/batches?after=12", "after", "12"),
        ("/batches?order=newest", "order", "newest"),
        ("/batches/NOSUCH", "batch id", "NOSUCH"),
        ("/batches.csv?q=state:failed", "q", "state:failed"),
    ];
    for (uri, field, value) in gets {
        let page = f.get(uri, &[]).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri}: {}", page.body);
        assert!(page.body.contains(value), "{uri}: {}", page.body);
    }
    let posts: [(&str, Fields, &str); 7] = [
        ("/batches/B1/act", &[("action", "rerun"), ("component", "checker"), ("reason", " ")], "--reason"),
        ("/batches/B1/act", &[("action", "prioritize"), ("priority", "high"), ("reason", REASON)], "priority"),
        ("/batches/B1/act", &[("action", "explode"), ("reason", REASON)], "action"),
        ("/batches/B1/act", &[("action", "rerun"), ("component", "nosuch"), ("reason", REASON)], "component"),
        (
            "/batches/B1/act",
            &[("action", "rerun"), ("component", "checker"), ("reason", REASON), ("colour", "red")],
            "colour",
        ),
        ("/batches/NOSUCH/act", &[("action", "rerun"), ("component", "checker"), ("reason", REASON)], "batch id"),
        ("/bulk", &[("q", "colour:red"), ("action", "rerun"), ("component", "checker"), ("reason", REASON)], "q"),
    ];
    for (uri, form, field) in posts {
        for confirm in [false, true] {
            let mut form = form.to_vec();
            if confirm {
                form.push(("confirm", "1"));
            }
            let page = f.post(uri, &form, &[("cookie", &cookie)]).await;
            assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri} {form:?}: {}", page.body);
            assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri} {form:?}: {}", page.body);
        }
    }
    assert_eq!(f.head().await, head, "nothing written");
}

#[tokio::test]
async fn the_csv_export_has_the_header_and_one_row_per_batch_of_the_filter() {
    let f = fixture().await;
    let csv = f.get("/batches.csv?q=type:RoundTrip", &[]).await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.body);
    assert!(csv.header(header::CONTENT_TYPE).starts_with("text/csv"));
    let lines: Vec<&str> = csv.body.lines().collect();
    assert_eq!(lines[0], "id,type,priority,created_at,probe,checker");
    assert_eq!(lines.len(), 4, "{}", csv.body);
    assert!(lines[1].starts_with("B1,RoundTrip,0,") && lines[1].ends_with(",success,failed"), "{}", lines[1]);
    let failed = f.get("/batches.csv?q=component:checker+state:failed", &[]).await;
    assert_eq!(failed.body.lines().count(), 2, "{}", failed.body);

    let ndjson = f.get("/batches.ndjson?q=B2", &[]).await;
    let rows: Vec<serde_json::Value> = ndjson.body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], "B2");
    assert_eq!(rows[0]["components"]["checker"], "ready");

    // More batches than a page: every one of them, once.
    let agent = Agent::new("test").unwrap();
    for i in 0..1_200 {
        let batch = id(&format!("X{i:05}"));
        f.store.create_batch(NewBatch::new(batch.clone(), BatchType::new("Bulk").unwrap())).await.unwrap();
        if i % 2 == 0 {
            f.store
                .append_event(&batch, NewEvent::new(ty("Data_Received"), Outcome::Success, agent.clone()))
                .await
                .unwrap();
        }
    }
    let all = f.get("/batches.csv?q=type:Bulk", &[]).await;
    let ids: std::collections::BTreeSet<&str> =
        all.body.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!((all.body.lines().count(), ids.len()), (1_201, 1_200));
    let _ = &f.monitor;
}

#[tokio::test]
async fn metrics_are_served_as_prometheus_text_from_the_index() {
    let f = fixture().await;
    let metrics = f.get("/metrics", &[]).await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.body);
    assert!(
        metrics.header(header::CONTENT_TYPE).starts_with("text/plain"),
        "{:?}",
        metrics.header(header::CONTENT_TYPE)
    );
    for line in [
        "autocomp_batches{component=\"checker\",state=\"failed\"} 1",
        "autocomp_batches{component=\"checker\",state=\"ready\"} 1",
        "autocomp_batches{component=\"probe\",state=\"success\"} 2",
        "# TYPE autocomp_last_pass_age_seconds gauge",
        "autocomp_index_lag_changes 0",
    ] {
        assert!(metrics.body.lines().any(|l| l == line), "{line} missing:\n{}", metrics.body);
    }
}
