//! The web monitor against a real embedded pipeline (SQLite store, local index and locks in
//! a temp dir), called through its router: caching (ETag/304), escaping, accounts and
//! their roles, server-side sessions, the sign-in rate limit, the Host check, the trusted
//! proxy, reads behind sign-in, preview-then-confirm writing exactly one event as the
//! signed-in account, bad input naming the field, and the CSV export.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use autocomp_test_servers::wait_for_async;

use autocomp_framework::config::Backends;
use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome, Seq, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::accounts::{Accounts, Users, hash_password};
use autocomp_monitor::web::sessions::SessionLimits;
use autocomp_monitor::web::{self, WebOptions};
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::json;
use tower::ServiceExt;

/// Every account's password in these tests.
const PASSWORD: &str = "correct horse battery staple";
const HOST: &str = "monitor.test:7072";
const REASON: &str = "the disk was full";
/// The reverse proxy's address, and a client's.
const PROXY: &str = "10.0.0.1";
const CLIENT: &str = "10.9.9.9";

/// Form fields, as a browser posts them.
type Fields<'a> = &'a [(&'a str, &'a str)];
/// A batch of the fixture: id, metadata, events.
type Story<'a> = (&'a str, serde_json::Value, &'a [(&'a str, Outcome)]);

struct Fixture {
    router: axum::Router,
    store: Arc<dyn ObjectStore>,
    monitor: Monitor,
    /// The users file the accounts were read from.
    users: std::path::PathBuf,
    accounts: Option<Arc<Accounts>>,
    _dir: tempfile::TempDir,
}

/// PASSWORD's hash (argon2 is slow in a debug build: made once).
fn password_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| hash_password(PASSWORD).unwrap())
}

/// tester and Åsa operate, vera views, root administers; alice is known to the proxy only.
fn users_file() -> String {
    let hash = password_hash();
    format!(
        "# the test's accounts\ntester operator {hash}\nÅsa operator {hash}\nvera viewer {hash}\nroot admin {hash}\nalice operator -\n"
    )
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

fn peer(address: &str) -> ConnectInfo<SocketAddr> {
    ConnectInfo(SocketAddr::new(address.parse::<IpAddr>().unwrap(), 40_000))
}

fn ty(name: &str) -> EventType {
    EventType::new(name).unwrap()
}

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

/// `probe` records Probed after Data_Received, `checker` records Checked after Probed. B1:
/// the checker failed; B2: probed, ready for the checker; B3: hostile metadata, waiting.
async fn fixture_with(mut options: WebOptions) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let users = root.join("users");
    std::fs::write(&users, users_file()).unwrap();
    if options.accounts.is_some() {
        options.accounts = Some(Arc::new(Accounts::load(&users).unwrap()));
    }
    let accounts = options.accounts.clone();
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
    Fixture { router, store, monitor, users, accounts, _dir: dir }
}

/// Accounts (read from the users file), the proxy's user header, the Host check.
fn options() -> WebOptions {
    WebOptions {
        accounts: Some(Arc::new(Accounts::fixed(Users::default()))),
        trusted_user_header: Some(header::HeaderName::from_static("x-remote-user")),
        trusted_proxies: vec![PROXY.parse().unwrap()],
        host_names: vec![HOST.into()],
        ..WebOptions::default()
    }
}

async fn fixture() -> Fixture {
    fixture_with(options()).await
}

impl Fixture {
    async fn send(&self, request: Request<Body>) -> Answer {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        Answer { status: parts.status, headers: parts.headers, body: String::from_utf8(bytes.to_vec()).unwrap() }
    }

    async fn get(&self, uri: &str, extra: &[(&str, &str)]) -> Answer {
        self.get_from(CLIENT, uri, extra).await
    }

    /// A GET from the client address `from` (as the server's connection sees it).
    async fn get_from(&self, from: &str, uri: &str, extra: &[(&str, &str)]) -> Answer {
        let mut request = Request::get(uri).header(header::HOST, HOST);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Body::empty()).unwrap();
        request.extensions_mut().insert(peer(from));
        self.send(request).await
    }

    async fn post(&self, uri: &str, form: &[(&str, &str)], extra: &[(&str, &str)]) -> Answer {
        self.post_from(CLIENT, uri, form, extra).await
    }

    async fn post_from(&self, from: &str, uri: &str, form: &[(&str, &str)], extra: &[(&str, &str)]) -> Answer {
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
        let mut request = request.body(Body::from(body.join("&"))).unwrap();
        request.extensions_mut().insert(peer(from));
        self.send(request).await
    }

    /// Signs in as `name` through the form; the `Cookie` header the browser would send.
    async fn sign_in(&self, name: &str) -> String {
        let answer = self.post("/login", &[("name", name), ("password", PASSWORD), ("next", "/batches")], &[]).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let cookies: Vec<String> = answer.cookies().iter().map(|c| c.split(';').next().unwrap().to_owned()).collect();
        assert_eq!(cookies.len(), 1, "one session cookie: {cookies:?}");
        cookies.join("; ")
    }

    /// Replaces the users file and has the monitor read it again.
    fn rewrite_users(&self, text: &str) {
        std::fs::write(&self.users, text).unwrap();
        assert!(self.accounts.as_ref().unwrap().reload_if_changed());
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
async fn writes_need_an_operators_session_and_change_nothing_without_one() {
    let f = fixture().await;
    let head = f.head().await;
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")];
    let anonymous = f.post("/batches/B1/act", &form, &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{}", anonymous.body);
    // Cookies a client makes up: the old name cookie, a well-formed id never issued.
    let forged_id = "ab".repeat(32);
    for cookie in
        ["autocomp_token=x; autocomp_operator=the-director".to_owned(), format!("autocomp_session={forged_id}")]
    {
        let forged = f.post("/batches/B1/act", &form, &[("cookie", &cookie)]).await;
        assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{cookie}: {}", forged.body);
    }
    let bulk =
        f.post("/bulk", &[("q", ""), ("action", "prioritize"), ("priority", "5"), ("reason", REASON)], &[]).await;
    assert_eq!(bulk.status, StatusCode::UNAUTHORIZED);
    assert_eq!(f.head().await, head, "nothing written");
    // Signed out, the pages offer a way to sign in instead of the forms.
    let page = f.get("/batches/B1", &[]).await.body;
    assert!(page.contains("Sign in</a> to act") && !page.contains("name=\"reason\""), "{page}");

    // A viewer reads, is shown no forms, and is refused a POST.
    let viewer = f.sign_in("vera").await;
    let page = f.get("/batches/B1", &[("cookie", &viewer)]).await.body;
    assert!(page.contains("Signed in as <strong>vera</strong> (viewer)"), "{page}");
    assert!(page.contains("is a viewer: it may read but not act") && !page.contains("name=\"reason\""), "{page}");
    let matrix = f.get("/batches", &[("cookie", &viewer)]).await.body;
    assert!(!matrix.contains("name=\"action\""), "{matrix}");
    for (uri, form) in [
        ("/batches/B1/act", &form[..]),
        ("/bulk", &[("q", ""), ("action", "prioritize"), ("priority", "5"), ("reason", REASON)][..]),
    ] {
        let refused = f.post(uri, form, &[("cookie", &viewer)]).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{uri}: {}", refused.body);
        assert!(refused.body.contains("needs the operator role; the account vera is a viewer"), "{}", refused.body);
    }
    assert_eq!(f.head().await, head, "nothing written");
    // An admin may do what an operator may.
    let admin = f.sign_in("root").await;
    let done = f
        .post(
            "/batches/B2/act",
            &[("action", "prioritize"), ("priority", "2"), ("reason", REASON), ("confirm", "1")],
            &[("cookie", &admin)],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(f.events("B2").await.last().unwrap().agent.as_str(), "operator:root");

    let read_only = fixture_with(WebOptions::default()).await;
    let head = read_only.head().await;
    let refused = read_only.post("/batches/B1/act", &form, &[]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("read only"), "{}", refused.body);
    let login = read_only.post("/login", &[("name", "tester"), ("password", PASSWORD)], &[]).await;
    assert_eq!(login.status, StatusCode::FORBIDDEN);
    assert!(login.cookies().is_empty());
    assert_eq!(read_only.head().await, head);
}

#[tokio::test]
async fn cross_site_posts_are_refused_even_signed_in() {
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
        let login = f.post("/login", &[("name", "tester"), ("password", PASSWORD)], &extra).await;
        assert_eq!(login.status, StatusCode::FORBIDDEN);
        assert!(login.cookies().is_empty());
    }
    assert_eq!(f.head().await, head, "nothing written");
    // The same form from the monitor's own page goes through.
    let own = [("cookie", cookie.as_str()), ("origin", "http://monitor.test:7072"), ("sec-fetch-site", "same-origin")];
    assert_eq!(f.post("/batches/B1/act", &form, &own).await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sign_in_opens_a_server_side_session_that_sign_out_ends() {
    let f = fixture().await;
    let wrong = f.post("/login", &[("name", "tester"), ("password", "not the password")], &[]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.cookies().is_empty());
    assert!(!wrong.body.contains("not the password"));
    let unknown = f.post("/login", &[("name", "nobody"), ("password", PASSWORD)], &[]).await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED, "the same answer as a wrong password");
    assert!(unknown.body.contains("Wrong account name or password"), "{}", unknown.body);
    let proxy_only = f.post("/login", &[("name", "alice"), ("password", PASSWORD)], &[]).await;
    assert_eq!(proxy_only.status, StatusCode::UNAUTHORIZED, "alice has no password");

    let right = f.post("/login", &[("name", "tester"), ("password", PASSWORD), ("next", "//evil.example/")], &[]).await;
    assert_eq!(right.status, StatusCode::SEE_OTHER);
    assert_eq!(right.header(header::LOCATION), "/", "never an open redirect");
    let cookies = right.cookies();
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let set = &cookies[0];
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let id = cookie.strip_prefix("autocomp_session=").expect("the session cookie");
    assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()), "256 random bits: {id}");
    assert!(!cookie.contains("tester") && !set.contains(PASSWORD));
    let page = f.get("/batches/B1", &[("cookie", &cookie)]).await.body;
    assert!(
        page.contains("Signed in as <strong>tester</strong> (operator)") && page.contains("name=\"reason\""),
        "{page}"
    );
    // Each sign-in is a new session.
    assert_ne!(f.sign_in("tester").await, cookie);

    let out = f.post("/logout", &[], &[("cookie", &cookie)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.cookies().iter().all(|c| c.contains("Max-Age=0")), "{:?}", out.cookies());
    // The browser's copy, kept anyway, is worthless: the session is gone server-side.
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")];
    let replayed = f.post("/batches/B1/act", &form, &[("cookie", &cookie)]).await;
    assert_eq!(replayed.status, StatusCode::UNAUTHORIZED, "{}", replayed.body);
    assert!(f.get("/batches/B1", &[("cookie", &cookie)]).await.body.contains("Sign in</a> to act"));
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
async fn the_proxys_user_header_counts_from_the_proxys_address_only() {
    let f = fixture().await;
    let head = f.head().await;
    let form = [("action", "prioritize"), ("priority", "7"), ("reason", REASON), ("confirm", "1")];
    // From anyone else the header is ignored: not signed in.
    let direct = f.post_from(CLIENT, "/batches/B2/act", &form, &[("x-remote-user", "alice")]).await;
    assert_eq!(direct.status, StatusCode::UNAUTHORIZED, "{}", direct.body);
    let page = f.get_from(CLIENT, "/", &[("x-remote-user", "alice")]).await.body;
    assert!(!page.contains("Signed in as"), "{page}");
    // The proxy naming someone without an account, or a name that disguises itself.
    for name in ["mallory", "tes\u{200B}ter"] {
        let request = f.post_from(PROXY, "/batches/B2/act", &form, &[("x-remote-user", name)]).await;
        assert_eq!(request.status, StatusCode::UNAUTHORIZED, "{name:?}: {}", request.body);
    }
    // A viewer named by the proxy is still a viewer.
    let viewer = f.post_from(PROXY, "/batches/B2/act", &form, &[("x-remote-user", "vera")]).await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN, "{}", viewer.body);
    assert_eq!(f.head().await, head, "nothing written");

    let done = f.post_from(PROXY, "/batches/B2/act", &form, &[("x-remote-user", "alice")]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let batch = f.store.get_batch(&id("B2")).await.unwrap();
    assert_eq!(batch.priority, 7);
    assert_eq!(batch.events.last().unwrap().agent.as_str(), "operator:alice");
    // Behind TLS at the proxy, cookies are Secure.
    let flash = done.cookies().into_iter().find(|c| c.starts_with("autocomp_flash=")).unwrap();
    assert!(!flash.contains("Secure"), "{flash}");
    let tls = f
        .post_from(PROXY, "/login", &[("name", "tester"), ("password", PASSWORD)], &[("x-forwarded-proto", "https")])
        .await;
    assert!(tls.cookies()[0].contains("; Secure"), "{:?}", tls.cookies());
    let spoofed = f
        .post_from(CLIENT, "/login", &[("name", "tester"), ("password", PASSWORD)], &[("x-forwarded-proto", "https")])
        .await;
    assert!(!spoofed.cookies()[0].contains("Secure"), "not from the proxy: {:?}", spoofed.cookies());
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

#[tokio::test]
async fn sign_in_failures_are_limited_per_address_and_per_account() {
    let f = fixture().await;
    let wrong = [("name", "tester"), ("password", "wrong password!")];
    for _ in 0..5 {
        assert_eq!(f.post_from("10.1.0.1", "/login", &wrong, &[]).await.status, StatusCode::UNAUTHORIZED);
    }
    // The sixth is refused before any hashing, the right password too, with a wait.
    for form in [&wrong[..], &[("name", "tester"), ("password", PASSWORD)][..]] {
        let limited = f.post_from("10.1.0.1", "/login", form, &[]).await;
        assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS, "{}", limited.body);
        let wait: u64 = limited.header(header::RETRY_AFTER).parse().expect("Retry-After in seconds");
        assert!((1..=60).contains(&wait), "{wait}");
        assert!(limited.cookies().is_empty());
    }
    // tester's account is limited from any address; other accounts are not.
    let elsewhere = f.post_from("10.1.0.2", "/login", &[("name", "tester"), ("password", PASSWORD)], &[]).await;
    assert_eq!(elsewhere.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(elsewhere.body.contains("for this account"), "{}", elsewhere.body);
    let other = f.post_from("10.1.0.2", "/login", &[("name", "vera"), ("password", PASSWORD)], &[]).await;
    assert_eq!(other.status, StatusCode::SEE_OTHER, "{}", other.body);
    // Guessing names from one address is limited by the address.
    for i in 0..5 {
        let name = format!("guess{i}");
        assert_eq!(
            f.post_from("10.1.0.3", "/login", &[("name", &name), ("password", PASSWORD)], &[]).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    let limited = f.post_from("10.1.0.3", "/login", &[("name", "root"), ("password", PASSWORD)], &[]).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.body.contains("from your address"), "{}", limited.body);
}

#[tokio::test]
async fn guesses_sent_all_at_once_are_limited_too() {
    let f = fixture().await;
    let wrong = [("name", "tester"), ("password", "wrong password!")];
    let answers = futures_util::future::join_all((0..20).map(|_| f.post_from("10.2.0.1", "/login", &wrong, &[]))).await;
    let checked = answers.iter().filter(|a| a.status == StatusCode::UNAUTHORIZED).count();
    let limited = answers.iter().filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!(checked + limited, 20);
    // Two are checked at a time, so at most one pair overshoots the five.
    assert!((5..=6).contains(&checked), "{checked} passwords checked of 20 sent at once");
}

#[tokio::test]
async fn names_in_any_script_sign_in_and_disguised_ones_are_refused_by_name() {
    let f = fixture().await;
    // Typed decomposed (A + combining ring), it is the same account.
    let answer = f.post("/login", &[("name", "A\u{30A}sa"), ("password", PASSWORD)], &[]).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let cookie = answer.cookies()[0].split(';').next().unwrap().to_owned();
    let page = f.get("/", &[("cookie", &cookie)]).await.body;
    assert!(page.contains("Signed in as <strong>Åsa</strong> (operator)"), "{page}");
    // Acting records exactly the account's name.
    let page = f.get("/batches/B2", &[("cookie", &cookie)]).await.body;
    assert!(page.contains("name=\"reason\""), "the actions are offered: {page}");
    let form = [("action", "prioritize"), ("priority", "9"), ("reason", REASON), ("confirm", "1")];
    let acted = f.post("/batches/B2/act", &form, &[("cookie", &cookie)]).await;
    assert_eq!(acted.status, StatusCode::SEE_OTHER, "{}", acted.body);
    assert_eq!(f.events("B2").await.last().unwrap().agent.as_str(), "operator:Åsa");
    let bidi = f.post("/login", &[("name", "ev\u{202E}e"), ("password", PASSWORD)], &[]).await;
    assert_eq!(bidi.status, StatusCode::BAD_REQUEST, "{}", bidi.body);
    assert!(bidi.body.contains("<code>name</code>") && bidi.body.contains("ev⟨U+202E⟩e"), "{}", bidi.body);
    assert!(bidi.body.contains("contains U+202E"), "{}", bidi.body);
    assert!(!bidi.body.contains('\u{202E}'), "the override itself never reaches the page");
}

#[tokio::test]
async fn a_changed_password_or_a_removed_account_ends_its_sessions() {
    let f = fixture().await;
    let tester = f.sign_in("tester").await;
    let vera = f.sign_in("vera").await;
    let new_hash = hash_password("another long secret").unwrap();
    let text =
        users_file().replace(&format!("tester operator {}", password_hash()), &format!("tester operator {new_hash}"));
    f.rewrite_users(&text.replace(&format!("vera viewer {}\n", password_hash()), ""));
    for (who, cookie) in [("tester", &tester), ("vera", &vera)] {
        let page = f.get("/", &[("cookie", cookie)]).await.body;
        assert!(!page.contains("Signed in as"), "{who}: {page}");
    }
    let old = f.post("/login", &[("name", "tester"), ("password", PASSWORD)], &[]).await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED);
    let new = f.post("/login", &[("name", "tester"), ("password", "another long secret")], &[]).await;
    assert_eq!(new.status, StatusCode::SEE_OTHER, "{}", new.body);
    // Promoted in the file, a signed-in viewer may act at once.
    let others = f.sign_in("Åsa").await;
    f.rewrite_users(
        &text.replace(&format!("Åsa operator {}", password_hash()), &format!("Åsa viewer {}", password_hash())),
    );
    let page = f.get("/batches/B1", &[("cookie", &others)]).await.body;
    assert!(page.contains("Signed in as <strong>Åsa</strong> (viewer)"), "{page}");
}

#[tokio::test]
async fn a_session_past_its_age_is_refused() {
    let mut options = options();
    options.sessions = SessionLimits { absolute: Duration::from_millis(300), ..SessionLimits::default() };
    let f = fixture_with(options).await;
    let cookie = f.sign_in("tester").await;
    assert!(f.get("/", &[("cookie", &cookie)]).await.body.contains("Signed in as"));
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_for_async(deadline, "the session to end after its 300 ms", async || {
        !f.get("/", &[("cookie", &cookie)]).await.body.contains("Signed in as")
    })
    .await;
    let form = [("action", "rerun"), ("component", "checker"), ("reason", REASON), ("confirm", "1")];
    assert_eq!(f.post("/batches/B1/act", &form, &[("cookie", &cookie)]).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn with_reads_behind_sign_in_only_health_sign_in_and_assets_are_open() {
    let mut options = options();
    options.reads_need_sign_in = true;
    let f = fixture_with(options).await;
    let html = [("accept", "text/html,application/xhtml+xml")];
    let page = f.get("/batches?q=B1", &html).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.header(header::LOCATION), "/login?next=%2Fbatches%3Fq%3DB1");
    for uri in ["/", "/batches/B1", "/batches.csv", "/batches.ndjson", "/metrics"] {
        let refused = f.get(uri, &[]).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(!refused.body.contains("B1,") && !refused.body.contains("autocomp_batches"), "{uri}: {}", refused.body);
    }
    assert_eq!(f.get("/health", &[]).await.body, "ok");
    assert_eq!(f.get("/login", &[]).await.status, StatusCode::OK);
    let viewer = f.sign_in("vera").await;
    for uri in ["/", "/batches/B1", "/batches.csv", "/metrics"] {
        assert_eq!(f.get(uri, &[("cookie", &viewer)]).await.status, StatusCode::OK, "{uri}");
    }
    // On loopback by default, reads are open (the fixture's default options).
    assert_eq!(fixture().await.get("/batches.csv", &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_host_name_that_is_not_the_monitors_is_refused() {
    let f = fixture().await;
    for host in ["evil.example", "evil.example:7072", "monitor.test.evil.example:7072"] {
        let request = Request::get("/batches.csv").header(header::HOST, host).body(Body::empty()).unwrap();
        let answer = f.send(request).await;
        assert_eq!(answer.status, StatusCode::MISDIRECTED_REQUEST, "{host}");
        assert!(!answer.body.contains("B1"), "{}", answer.body);
    }
    let health =
        f.send(Request::get("/health").header(header::HOST, "evil.example").body(Body::empty()).unwrap()).await;
    assert_eq!(health.body, "ok", "probes reach /health by any name");
    assert_eq!(f.get("/batches.csv", &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn bidi_overrides_in_the_stores_data_are_shown_as_markers() {
    let f = fixture().await;
    let mut new = NewBatch::new(id("B4"), BatchType::new("RoundTrip").unwrap());
    new.metadata = json!({"owner": "gpj.exe\u{202E}cod.txt", "note": "zero\u{200B}width and bell\u{7}"});
    f.store.create_batch(new).await.unwrap();
    let page = f.get("/batches/B4", &[]).await.body;
    assert!(page.contains("gpj.exe⟨U+202E⟩cod.txt"), "{page}");
    assert!(page.contains("zero⟨U+200B⟩width"), "{page}");
    assert!(!page.contains('\u{202E}') && !page.contains('\u{200B}'), "{page}");
    // A reason with an override is shown marked in the preview and posted back unchanged by
    // its confirm form: what is recorded is what was typed.
    let cookie = f.sign_in("tester").await;
    let reason = "typo\u{202E}fixed";
    let form = [("action", "prioritize"), ("priority", "4"), ("reason", reason)];
    let preview = f.post("/batches/B4/act", &form, &[("cookie", &cookie)]).await.body;
    assert!(preview.contains("<dd>typo⟨U+202E⟩fixed</dd>"), "{preview}");
    assert!(preview.contains("value=\"typo&#x202E;fixed\""), "{preview}");
    let mut confirm = form.to_vec();
    confirm.push(("confirm", "1"));
    assert_eq!(f.post("/batches/B4/act", &confirm, &[("cookie", &cookie)]).await.status, StatusCode::SEE_OTHER);
    assert_eq!(f.events("B4").await.last().unwrap().details["reason"], reason);
}

#[tokio::test]
async fn a_batch_page_follows_what_holds_a_step_up_back_to_its_root() {
    let f = fixture().await;
    let page = f.get("/batches/B3", &[]).await.body;
    assert!(page.contains("<li>because checker waits for Probed: probe is waiting</li>"), "{page}");
    assert!(
        page.contains("<li>because probe waits for Data_Received, which no component of the pipeline records</li>"),
        "{page}"
    );
}
