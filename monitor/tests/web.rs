//! The web monitor against a real embedded pipeline (SQLite store, local index and locks in
//! a temp dir), called through its router: caching (ETag/304), escaping, accounts and
//! their roles, server-side sessions, the sign-in rate limit, the Host check, the trusted
//! proxy, reads behind sign-in, preview-then-confirm writing exactly one event as the
//! signed-in account, bad input naming the field, and the CSV export. Previews: asking for
//! one is answered 303 to its address, a GET with the form's fields and a fresh key, never
//! stored, checked like the form, shown only to operators coming from the monitor's own
//! pages, and once confirmed it says what was done instead of offering a confirm.
//! Confirms: a confirm posts back the preview's plan and key, acts only on the batch as
//! previewed (else a redirect to a fresh preview saying what changed) and once (a repeat
//! says already done); skip and cancel refuse unless forced. Steering (pause, drain, resume,
//! resume and rerun failed, pool sizes): admins only, previewed (what it records, what runs,
//! what it reruns) and confirmed once against the previewed version. Human steps: the
//! waiting list, `person` in counts, filters and exports, the decision beside its evidence,
//! approve and reject by operators.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use autocomp_test_servers::wait_for_async;

use autocomp_model::{Agent, BatchType, EventType, NewBatch, NewEvent, Outcome, Seq, Trigger};
use autocomp_monitor::data::{Monitor, Settings};
use autocomp_monitor::web::accounts::{Accounts, Users, hash_password};
use autocomp_monitor::web::sessions::SessionLimits;
use autocomp_monitor::web::{self, WebOptions};
use autocomp_store::ObjectStore;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::json;
use support::{id, temp_pipeline};
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

/// `probe` records Probed after Data_Received, `checker` records Checked after Probed. B1:
/// the checker failed; B2: probed, ready for the checker; B3: hostile metadata, waiting.
async fn fixture_with(mut options: WebOptions) -> Fixture {
    let (operator, store, dir) = temp_pipeline(None).await;
    let users = dir.path().join("users");
    std::fs::write(&users, users_file()).unwrap();
    if options.accounts.is_some() {
        options.accounts = Some(Arc::new(Accounts::load(&users).unwrap()));
    }
    let accounts = options.accounts.clone();
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

    /// Follows `answer`'s redirect as a browser would: a GET of its `Location` from `from`
    /// with `extra`, and the cookies the answer set added to the `cookie` header.
    async fn follow(&self, from: &str, answer: &Answer, extra: Fields<'_>) -> Answer {
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "a redirect: {}", answer.body);
        let set: Vec<String> = answer
            .cookies()
            .iter()
            .filter(|c| !c.contains("Max-Age=0"))
            .map(|c| c.split(';').next().unwrap().to_owned())
            .collect();
        let mut headers: Vec<(&str, String)> = extra.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
        match headers.iter_mut().find(|(n, _)| *n == "cookie") {
            Some((_, cookie)) => cookie.extend(set.iter().map(|c| format!("; {c}"))),
            None if !set.is_empty() => headers.push(("cookie", set.join("; "))),
            None => {}
        }
        // A browser's GET has no body, so no content type, and no Origin.
        headers.retain(|(n, _)| *n != "origin");
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.get_from(from, answer.header(header::LOCATION), &headers).await
    }

    /// Posts `form` to ask for a preview; the preview's page, reached by the redirect to its
    /// address as a browser reaches it (or the POST's own answer if it refused).
    async fn preview(&self, uri: &str, form: Fields<'_>, extra: Fields<'_>) -> Answer {
        self.preview_from(CLIENT, uri, form, extra).await
    }

    async fn preview_from(&self, from: &str, uri: &str, form: Fields<'_>, extra: Fields<'_>) -> Answer {
        let posted = self.post_from(from, uri, form, extra).await;
        if posted.status != StatusCode::SEE_OTHER {
            return posted;
        }
        assert!(
            posted.header(header::LOCATION).starts_with(&format!("{uri}?")),
            "to the preview's address: {}",
            posted.header(header::LOCATION)
        );
        self.follow(from, &posted, extra).await
    }

    /// Asks for a preview of `form`, then posts the preview's confirm form, as a browser
    /// would; the preview and the confirm's answer.
    async fn preview_and_confirm(&self, uri: &str, form: Fields<'_>, extra: Fields<'_>) -> (Answer, Answer) {
        self.preview_and_confirm_from(CLIENT, uri, form, extra).await
    }

    async fn preview_and_confirm_from(
        &self,
        from: &str,
        uri: &str,
        form: Fields<'_>,
        extra: Fields<'_>,
    ) -> (Answer, Answer) {
        let preview = self.preview_from(from, uri, form, extra).await;
        assert_eq!(preview.status, StatusCode::OK, "the preview of {form:?}: {}", preview.body);
        let done = self.confirm_from(from, uri, &preview, extra).await;
        (preview, done)
    }

    /// Posts the confirm form of `preview` (its hidden fields) to `uri`.
    async fn confirm_from(&self, from: &str, uri: &str, preview: &Answer, extra: Fields<'_>) -> Answer {
        let fields = confirm_fields(&preview.body);
        let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.post_from(from, uri, &fields, extra).await
    }
}

/// The hidden fields of the confirm form of a preview page, as the browser posts them.
fn confirm_fields(page: &str) -> Vec<(String, String)> {
    let form = page
        .split("<form method=\"post\"")
        .find(|form| form.contains("name=\"confirm\""))
        .unwrap_or_else(|| panic!("no confirm form in {page}"));
    let form = &form[..form.find("</form>").expect("the form's end")];
    let mut fields = Vec::new();
    for input in form.split("<input type=\"hidden\" ").skip(1) {
        let attribute = |name: &str| {
            let start = input.find(&format!("{name}=\"")).expect("the attribute") + name.len() + 2;
            unescape(&input[start..start + input[start..].find('"').expect("its end")])
        };
        fields.push((attribute("name"), attribute("value")));
    }
    for name in ["plan", "key", "confirm"] {
        assert!(fields.iter().any(|(n, _)| n == name), "no {name} in the confirm form: {fields:?}");
    }
    fields
}

/// An attribute's text as the browser reads it.
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let end = rest[at..].find(';').expect("a reference's end") + at;
        let reference = &rest[at + 1..end];
        out.push(match reference {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            other => {
                let code = match other.strip_prefix("#x") {
                    Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
                    None => other.strip_prefix('#').expect("a character reference").parse().unwrap(),
                };
                char::from_u32(code).unwrap()
            }
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The flash message a confirm's answer sets, decoded.
fn flash(answer: &Answer) -> String {
    let cookie = answer.cookies().into_iter().find(|c| c.starts_with("autocomp_flash=")).expect("a flash");
    let value = cookie.trim_start_matches("autocomp_flash=").split(';').next().unwrap().to_owned();
    let mut bytes = Vec::new();
    let mut rest = value.bytes();
    while let Some(byte) = rest.next() {
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex: Vec<u8> = rest.by_ref().take(2).collect();
                bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).unwrap(), 16).unwrap());
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).unwrap()
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
    let (_, done) = f
        .preview_and_confirm(
            "/batches/B2/act",
            &[("action", "prioritize"), ("priority", "2"), ("reason", REASON)],
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
    let (_, done) = f.preview_and_confirm("/batches/B1/act", &form[..3], &own).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
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
    let preview = f.preview("/batches/B1/act", &form, &[("cookie", &cookie)]).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(
        preview.body.contains("Will record Reset (success) superseding Checked; checker: failed\u{a0}→\u{a0}ready."),
        "{}",
        preview.body
    );
    assert!(preview.body.contains("checker: failed\u{a0}→\u{a0}ready"), "{}", preview.body);
    assert!(preview.body.contains("name=\"confirm\" value=\"1\""));
    let version = f.store.get_batch(&id("B1")).await.unwrap().changed_seq;
    assert!(preview.body.contains(&format!("the batch as of seq {version}")), "{}", preview.body);
    let fields = confirm_fields(&preview.body);
    assert!(fields.contains(&("plan".to_owned(), format!("{version}:Reset/success/Checked"))), "{fields:?}");
    assert_eq!(f.head().await, head, "a preview writes nothing");

    let done = f.confirm_from(CLIENT, "/batches/B1/act", &preview, &[("cookie", &cookie)]).await;
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
    assert!(
        page.body.contains(&format!("B1: recorded Reset (seq {}, success) superseding Checked", reset.seq)),
        "{}",
        page.body
    );
    assert!(page.cookies().iter().any(|c| c.starts_with("autocomp_flash=;")));

    // A refusal in the operator module's words, 409, nothing written.
    let head = f.head().await;
    let refused = f
        .preview(
            "/batches/B2/act",
            &[("action", "rerun"), ("component", "checker"), ("reason", REASON)],
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

    let (_, done) =
        f.preview_and_confirm_from(PROXY, "/batches/B2/act", &form[..3], &[("x-remote-user", "alice")]).await;
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
    let preview = f.preview("/bulk", &form, &[("cookie", &cookie)]).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(preview.body.contains("3 selected: 3 would be acted on, 0 refused"), "{}", preview.body);
    let plan = confirm_fields(&preview.body).into_iter().find(|(n, _)| n == "plan").unwrap().1;
    assert!(plan.starts_with("3:") && plan.len() == 66, "{plan}");
    assert_eq!(f.head().await, head);
    // One of the batches moves (a component records a result): shown again, not acted on.
    let agent = Agent::new("test").unwrap();
    f.store.append_event(&id("B3"), NewEvent::new(ty("Data_Received"), Outcome::Success, agent)).await.unwrap();
    let head = f.head().await;
    let stale = f.confirm_from(CLIENT, "/bulk", &preview, &[("cookie", &cookie)]).await;
    assert_eq!(stale.status, StatusCode::SEE_OTHER, "a batch that moved is shown again, not acted on");
    assert!(stale.header(header::LOCATION).starts_with("/bulk?"), "{}", stale.header(header::LOCATION));
    let stale = f.follow(CLIENT, &stale, &[("cookie", &cookie)]).await;
    assert_eq!(stale.status, StatusCode::OK, "{}", stale.body);
    assert_ne!(confirm_fields(&stale.body), confirm_fields(&preview.body), "a new plan and a new key");
    assert!(stale.body.contains("the batches changed since your preview (3 batches then, 3 now"), "{}", stale.body);
    assert!(stale.body.contains("nothing was done; review and confirm again"), "{}", stale.body);
    assert_eq!(f.head().await, head);
    let done = f.confirm_from(CLIENT, "/bulk", &stale, &[("cookie", &cookie)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.header(header::LOCATION), "/batches?q=type%3ARoundTrip");
    for batch in ["B1", "B2", "B3"] {
        assert_eq!(f.store.get_batch(&id(batch)).await.unwrap().priority, 3, "{batch}");
    }
    let flash = flash(&done);
    assert!(
        flash.starts_with("prioritize on 3 batches: 3 performed, 0 refused\n  B1: recorded Prioritized (seq "),
        "{flash}"
    );
    // The same confirm again (a double submit): already done, nothing written.
    let head = f.head().await;
    let again = f.confirm_from(CLIENT, "/bulk", &stale, &[("cookie", &cookie)]).await;
    assert_eq!(again.status, StatusCode::SEE_OTHER, "{}", again.body);
    assert_eq!(f.head().await, head);
    let again = self::flash(&again);
    assert!(again.starts_with("prioritize on 3 batches: 0 performed, 3 already done"), "{again}");
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
        ("/batches.csv?q=state:stuck", "state", "stuck"),
    ];
    for (uri, field, value) in gets {
        let page = f.get(uri, &[]).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri}: {}", page.body);
        assert!(page.body.contains(value), "{uri}: {}", page.body);
    }
    let posts: [(&str, Fields, &str); 7] = [
        // The form's field, not the CLI's flag.
        ("/batches/B1/act", &[("action", "rerun"), ("component", "checker"), ("reason", " ")], "reason"),
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
                let plan = if uri == "/bulk" {
                    "1:0000000000000000000000000000000000000000000000000000000000000000"
                } else {
                    "1:Reset/success/Checked"
                };
                form.extend([("confirm", "1"), ("plan", plan), ("key", "k1")]);
            }
            let page = f.preview(uri, &form, &[("cookie", &cookie)]).await;
            assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri} {form:?}: {}", page.body);
            assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri} {form:?}: {}", page.body);
        }
    }
    // A confirm without what a preview's confirm form posts, or with a checkbox out of place.
    let rerun = [("action", "rerun"), ("component", "checker"), ("reason", REASON)];
    let confirms: [(Fields, &str); 6] = [
        (&[("confirm", "1"), ("key", "k1")], "plan"),
        (&[("confirm", "1"), ("plan", "1:Reset/success/Checked")], "key"),
        (&[("confirm", "1"), ("plan", "1:Reset/success/Checked"), ("key", "-k")], "key"),
        (&[("confirm", "1"), ("plan", "soon"), ("key", "k1")], "plan"),
        (&[("force", "1")], "force"),
        (&[("record_anyway", "yes")], "record_anyway"),
    ];
    for (extra, field) in confirms {
        let form: Vec<(&str, &str)> = rerun.iter().chain(extra).copied().collect();
        let page = f.post("/batches/B1/act", &form, &[("cookie", &cookie)]).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{form:?}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{form:?}: {}", page.body);
    }
    // A body over the limit is 413 in plain words, not a 400 about buffering.
    let huge = "x".repeat(5 << 20);
    // (`/steer` refuses an operator before it reads a body: an admin's.)
    for uri in ["/batches/B1/act", "/bulk"] {
        let page = f.post(uri, &[("action", "rerun"), ("reason", &huge)], &[("cookie", &cookie)]).await;
        assert_eq!(page.status, StatusCode::PAYLOAD_TOO_LARGE, "{uri}: {}", page.body);
        assert!(page.body.contains("the form is larger than the 64 KiB a form may be"), "{uri}: {}", page.body);
        assert!(!page.body.contains("buffer"), "{uri}: {}", page.body);
    }
    assert_eq!(f.head().await, head, "nothing written");
}

/// The batch ids a matrix page lists, in its order.
fn listed(page: &str) -> Vec<String> {
    page.split("<tr><th scope=\"row\"><a href=\"/batches/")
        .skip(1)
        .map(|row| row[..row.find('"').unwrap()].to_owned())
        .collect()
}

#[tokio::test]
async fn a_bare_state_lists_the_batches_in_it_at_any_component() {
    let f = fixture().await;
    // B4 failed at the probe, B5 failed there before and succeeded since.
    let agent = Agent::new("test").unwrap();
    let stories: [(&str, &[(&str, Outcome)]); 2] = [
        ("B4", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Failure)]),
        ("B5", &[("Data_Received", Outcome::Success), ("Probed", Outcome::Failure), ("Probed", Outcome::Success)]),
    ];
    for (batch, events) in stories {
        f.store.create_batch(NewBatch::new(id(batch), BatchType::new("RoundTrip").unwrap())).await.unwrap();
        for (event_type, outcome) in events {
            f.store.append_event(&id(batch), NewEvent::new(ty(event_type), *outcome, agent.clone())).await.unwrap();
        }
    }
    let page = f.get("/batches?q=state:failed", &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(listed(&page.body), ["B1", "B4"], "failed at the checker, failed at the probe");
    assert!(page.body.contains("<strong>2</strong> batches match <code>state:failed</code>"), "{}", page.body);
    // With a component, still that component's state only.
    let at_probe = f.get("/batches?q=component:probe+state:failed", &[]).await;
    assert_eq!(listed(&at_probe.body), ["B4"]);
    // The exports list the same batches.
    let csv = f.get("/batches.csv?q=state:failed", &[]).await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.body);
    let ids: Vec<&str> = csv.body.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(ids, ["B1", "B4"]);
    // Any other state too: B2 and B5 are ready for the checker (B3 waits for its data).
    let ready = f.get("/batches?q=state:ready", &[]).await;
    assert_eq!(listed(&ready.body), ["B2", "B5"]);
    // The overview's state columns link to it.
    let overview = f.get("/", &[]).await;
    assert!(overview.body.contains("<a href=\"/batches?q=state%3Afailed\""), "{}", overview.body);
}

#[tokio::test]
async fn a_failed_cell_shows_its_failures_summary_cut_short_and_escaped() {
    let f = fixture().await;
    let agent = Agent::new("test").unwrap();
    let long = format!("<b>disk</b> full on /data & {}", "x".repeat(200));
    let batch = id("B4");
    f.store.create_batch(NewBatch::new(batch.clone(), BatchType::new("RoundTrip").unwrap())).await.unwrap();
    f.store.append_event(&batch, NewEvent::new(ty("Data_Received"), Outcome::Success, agent.clone())).await.unwrap();
    let failure = NewEvent::new(ty("Probed"), Outcome::Failure, agent.clone()).with_details(json!({"summary": long}));
    f.store.append_event(&batch, failure).await.unwrap();
    let page = f.get("/batches?q=state:failed", &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let row = &page.body[page.body.find("<a href=\"/batches/B4\">").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    let shown: String = long.chars().take(79).collect::<String>() + "…";
    let escaped = shown.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    assert!(row.contains(&format!("<small class=\"failure-summary\">{escaped}</small>")), "{row}");
    assert!(!row.contains("<b>"), "{row}");
    // B1's checker failed without a summary: its cell shows the state alone.
    let row = &page.body[page.body.find("<a href=\"/batches/B1\">").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("failed") && !row.contains("failure-summary"), "{row}");
}

#[tokio::test]
async fn a_batch_page_opens_with_its_failure_and_actions_on_the_failed_component() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let agent = Agent::new("test").unwrap();
    f.store
        .append_event(
            &id("B1"),
            NewEvent::new(ty("Checked"), Outcome::Failure, agent)
                .with_details(json!({"summary": "checksum <mismatch>"})),
        )
        .await
        .unwrap();
    let page = f.get("/batches/B1", &[("cookie", &cookie)]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    // The verdict right under the heading, with the failure's summary.
    let verdict = body.find("<p class=\"verdict\" id=\"failed-checker\">").expect("a verdict");
    assert!(verdict < body.find("<caption>Batch</caption>").unwrap(), "the verdict first");
    let line = &body[verdict..verdict + body[verdict..].find("</p>").unwrap()];
    assert!(line.contains("<a href=\"#explain-checker\">checker</a>") && line.contains("failed"), "{line}");
    assert!(line.contains("checksum &lt;mismatch&gt;") && line.contains("<a href=\"#actions\">"), "{line}");
    // The actions beside the states, before the log; the checker chosen, not the probe.
    let actions = body.find("<h2 id=\"actions\">").unwrap();
    assert!(body.find("<caption>Each component's state</caption>").unwrap() < actions, "after the states");
    assert!(actions < body.find("<h2 id=\"log\">").unwrap(), "before the log");
    for form in ["one-rerun", "one-cancel", "one-skip"] {
        let select = &body[body.find(&format!("<select id=\"{form}-component\"")).unwrap()..];
        let select = &select[..select.find("</select>").unwrap()];
        assert!(
            select.contains("<option value=\"checker\" selected>") && !select.contains("\"probe\" selected"),
            "{select}"
        );
    }
    // A batch with no failure: no verdict line, the first component chosen as before.
    let page = f.get("/batches/B2", &[("cookie", &cookie)]).await;
    assert!(!page.body.contains("id=\"failed-"), "{}", page.body);
    assert!(!page.body.contains("\" selected>"), "nothing preselected: {}", page.body);
}

#[tokio::test]
async fn a_bad_filter_is_shown_beside_the_box_that_still_holds_it() {
    let f = fixture().await;
    let cases = [
        ("/batches?q=colour:red+B1", "colour:red B1", "q", "<code>colour:</code>"),
        ("/batches?q=component:nosuch+state:failed", "component:nosuch state:failed", "component", "nosuch"),
        ("/batches?q=%3Cb%3E", "&lt;b&gt;", "id prefix", "&lt;b&gt;"),
    ];
    for (uri, typed, field, words) in cases {
        let page = f.get(uri, &[]).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.header(header::ETAG).is_empty(), "{uri}: a 400 is not cached");
        assert!(
            page.body.contains(&format!(
                "<input id=\"filter-q\" name=\"q\" value=\"{typed}\" size=\"50\" \
                 aria-describedby=\"filter-error filter-help\" aria-invalid=\"true\">"
            )),
            "{uri}: the box holds what was typed: {}",
            page.body
        );
        let error = &page.body[page.body.find("<p id=\"filter-error\"").expect("the error beside the box")..];
        let error = &error[..error.find("</p>").unwrap()];
        assert!(error.contains(&format!("<code>{field}</code>")) && error.contains(words), "{uri}: {error}");
        assert!(!page.body.contains('`'), "{uri}: no raw backticks: {}", page.body);
        assert!(!page.body.contains("<h1>Bad input</h1>") && page.body.contains("<h1>Batches</h1>"), "{uri}");
        assert!(!page.body.contains("<table class=\"grid matrix\">"), "{uri}: nothing listed");
    }
    // A bad order marks the order.
    let page = f.get("/batches?q=B1&order=newest", &[]).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    assert!(
        page.body.contains(
            "<select id=\"filter-order\" name=\"order\" aria-describedby=\"filter-error\" aria-invalid=\"true\">"
        ),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("value=\"B1\" size=\"50\" aria-describedby=\"filter-error filter-help\">"),
        "{}",
        page.body
    );
    // A good filter has neither.
    let page = f.get("/batches?q=B1", &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains("aria-invalid") && !page.body.contains("filter-error"), "{}", page.body);
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
async fn sign_in_failures_are_limited_per_address_and_never_per_account_alone() {
    let f = fixture().await;
    let wrong = [("name", "tester"), ("password", "wrong password!")];
    for _ in 0..5 {
        assert_eq!(f.post_from("10.1.0.1", "/login", &wrong, &[]).await.status, StatusCode::UNAUTHORIZED);
    }
    // The sixth is refused before any hashing, the right password too, with a wait: this
    // address's own failures.
    for form in [&wrong[..], &[("name", "tester"), ("password", PASSWORD)][..]] {
        let limited = f.post_from("10.1.0.1", "/login", form, &[]).await;
        assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS, "{}", limited.body);
        let wait: u64 = limited.header(header::RETRY_AFTER).parse().expect("Retry-After in seconds");
        assert!((1..=60).contains(&wait), "{wait}");
        assert!(limited.cookies().is_empty());
    }
    // Another address signs in to the same account: its failures were not this address's.
    let elsewhere = f.post_from("10.1.0.2", "/login", &[("name", "tester"), ("password", PASSWORD)], &[]).await;
    assert_eq!(elsewhere.status, StatusCode::SEE_OTHER, "{}", elsewhere.body);
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

/// The monitor with `failures` failed sign-ins a minute per address.
async fn fixture_limited(failures: u32) -> Fixture {
    let limit = web::limits::SignInLimit { failures, window: Duration::from_secs(60) };
    fixture_with(WebOptions { sign_in_limit: limit, ..options() }).await
}

#[tokio::test]
async fn a_guesser_at_one_address_cannot_keep_the_admin_out_from_another() {
    let f = fixture_limited(3).await;
    let guess = [("name", "root"), ("password", "not the password")];
    let right = [("name", "root"), ("password", PASSWORD)];
    let mut statuses = Vec::new();
    // One wrong guess a second from 127.0.0.2, past its limit; after each, the admin signs
    // in from 127.0.0.3 with the right password.
    for _ in 0..6 {
        let started = Instant::now();
        statuses.push(f.post_from("127.0.0.2", "/login", &guess, &[]).await.status.as_u16());
        let admin = f.post_from("127.0.0.3", "/login", &right, &[]).await;
        assert_eq!(admin.status, StatusCode::SEE_OTHER, "the admin signs in: {}", admin.body);
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429], "the guesser is limited by its own address");
}

#[tokio::test]
async fn a_known_and_an_unknown_name_get_the_same_answer_when_throttled() {
    let f = fixture_limited(4).await;
    let from = "127.0.0.4";
    // The page repeats the name typed; the rest must not tell the names apart.
    let attempt = async |name: &str| {
        let started = Instant::now();
        let answer = f.post_from(from, "/login", &[("name", name), ("password", "not it")], &[]).await;
        let retry_after = answer.header(header::RETRY_AFTER).to_owned();
        (answer.status, answer.body.replace(name, "NAME"), retry_after, started.elapsed())
    };
    let (known, unknown) = (attempt("tester").await, attempt("nobody").await);
    assert_eq!((known.0, &known.1), (unknown.0, &unknown.1), "the first failure");
    // The second try at each name waits for its first failure (1 s a minute's window), the
    // unknown name as long as the known one.
    let (known, unknown) = (attempt("tester").await, attempt("nobody").await);
    assert_eq!(known.0, StatusCode::UNAUTHORIZED);
    assert_eq!((known.0, &known.1), (unknown.0, &unknown.1), "slowed down");
    for waited in [known.3, unknown.3] {
        assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    }
    // Four failures from the address: both refused alike, before any hashing.
    let (known, unknown) = (attempt("tester").await, attempt("nobody").await);
    assert_eq!(known.0, StatusCode::TOO_MANY_REQUESTS, "{}", known.1);
    assert_eq!(unknown.0, StatusCode::TOO_MANY_REQUESTS, "{}", unknown.1);
    // The same words, but for the seconds to wait (they may have ticked in between).
    let words = |body: &str| body.replace(|c: char| c.is_ascii_digit(), "");
    assert_eq!(words(&known.1), words(&unknown.1));
    assert!(!known.1.contains("for this account"), "{}", known.1);
    let seconds = |text: &str| text.parse::<i64>().expect("Retry-After in seconds");
    assert!((seconds(&known.2) - seconds(&unknown.2)).abs() <= 1);
}

/// The monitor's router served by the real connection loop on a loopback port.
async fn served(f: &Fixture) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = autocomp_http::serve::Limits::default();
    tokio::spawn(autocomp_http::serve::serve_until(listener, f.router.clone(), limits, None, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// One request over TCP as `text` (a head, then a body): the answer's head, lower-cased.
async fn over_http(addr: SocketAddr, text: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.split("\r\n\r\n").next().unwrap().to_ascii_lowercase()
}

/// `POST /login` as the tester with `next` as sent on the wire; the answer's head.
async fn sign_in_over_http(addr: SocketAddr, next: &str) -> String {
    let body = format!("name=tester&password={}&next={next}", autocomp_monitor::filter::encode(PASSWORD));
    over_http(
        addr,
        &format!(
            "POST /login HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\nContent-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_holding_a_control_character_goes_to_the_overview_never_off_site_or_to_a_500() {
    let f = fixture().await;
    let (addr, _stop) = served(&f).await;
    // As sent on the wire (percent-encoded), and what it must never lead to.
    for next in ["%09", "%0B", "%0D", "%0A", "/%09/evil.example", "%2F%09%2Fevil.example", "/%0D%0ASet-Cookie:x=y"] {
        let head =
            over_http(addr, &format!("GET /login?next={next} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"))
                .await;
        assert!(head.starts_with("http/1.1 200"), "GET /login?next={next}: {head}");
        let head = sign_in_over_http(addr, next).await;
        assert!(head.starts_with("http/1.1 303"), "POST next={next}: {head}");
        assert!(head.contains("\r\nlocation: /\r\n"), "to the overview, for next={next}: {head}");
    }
    // The text "%09" itself (sent as %2509) is a path of this site: kept, still on-site.
    let head = sign_in_over_http(addr, "%2F%2509%2Fevil.example").await;
    assert!(head.contains("\r\nlocation: /%09/evil.example\r\n"), "{head}");
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
    let form = [("action", "prioritize"), ("priority", "9"), ("reason", REASON)];
    let (_, acted) = f.preview_and_confirm("/batches/B2/act", &form, &[("cookie", &cookie)]).await;
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
    let preview = f.preview("/batches/B4/act", &form, &[("cookie", &cookie)]).await;
    assert!(preview.body.contains("<dd>typo⟨U+202E⟩fixed</dd>"), "{}", preview.body);
    assert!(preview.body.contains("value=\"typo&#x202E;fixed\""), "{}", preview.body);
    let done = f.confirm_from(CLIENT, "/batches/B4/act", &preview, &[("cookie", &cookie)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
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

/// Two tabs preview the cancel of the same run; the second to confirm is shown the batch as
/// it is now (nothing left to cancel), 409, and nothing is written. A double submit of a
/// confirm records once and the second answer says already done, with the earlier seq.
#[tokio::test]
async fn a_confirm_acts_once_and_only_on_the_batch_it_previewed() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let holder = autocomp_model::RunHolder {
        agent: Agent::new("checker").unwrap(),
        host: "host1".into(),
        pid: 4242,
        claim_key: None,
        liveness: None,
    };
    let checker = autocomp_model::ComponentName::new("checker").unwrap();
    f.store.claim(&id("B2"), &checker, &holder).await.unwrap();
    let form = [("action", "cancel"), ("component", "checker"), ("reason", REASON)];
    let extra = [("cookie", cookie.as_str())];
    // The batch page's Cancel form starts on the component at work.
    let page = f.get("/batches/B2", &extra).await.body;
    let cancel = &page[page.find("id=\"one-cancel-component\"").expect("the cancel form's select")..];
    let chosen = &cancel[..cancel.find("</select>").unwrap()];
    assert!(chosen.contains("<option value=\"checker\" selected>"), "{chosen}");
    let tab_a = f.preview("/batches/B2/act", &form, &extra).await;
    let tab_b = f.preview("/batches/B2/act", &form, &extra).await;
    assert_eq!((tab_a.status, tab_b.status), (StatusCode::OK, StatusCode::OK), "{}", tab_a.body);
    let version = f.store.get_batch(&id("B2")).await.unwrap().changed_seq;
    let done = f.confirm_from(CLIENT, "/batches/B2/act", &tab_b, &extra).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let cancelled = f.events("B2").await.last().unwrap().clone();
    assert!(cancelled.flag("cancelled"));
    assert!(
        flash(&done).contains(&format!(
            "B2: recorded Checked (seq {}, failure, flagged cancelled): cancelled run 1 of checker",
            cancelled.seq
        )),
        "{}",
        flash(&done)
    );
    let head = f.head().await;
    let stale = f.confirm_from(CLIENT, "/batches/B2/act", &tab_a, &extra).await;
    assert_eq!(stale.status, StatusCode::SEE_OTHER, "{}", stale.body);
    assert!(stale.header(header::LOCATION).starts_with("/batches/B2/act?"), "{}", stale.header(header::LOCATION));
    assert_eq!(f.head().await, head, "the second tab wrote nothing");
    let stale = f.follow(CLIENT, &stale, &extra).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert!(stale.cookies().iter().any(|c| c.starts_with("autocomp_note_") && c.contains("Max-Age=0")), "cleared");
    let now = f.store.get_batch(&id("B2")).await.unwrap().changed_seq;
    assert!(
        stale.body.contains(&format!(
            "the batch changed since your preview (seq {version} -&gt; {now}): nothing was done; review and confirm again"
        )),
        "{}",
        stale.body
    );
    assert!(stale.body.contains("checker has no open run on B2: nothing to cancel"), "{}", stale.body);
    assert!(!stale.body.contains("name=\"confirm\""), "nothing to confirm: {}", stale.body);
    assert_eq!(f.head().await, head, "the second tab wrote nothing");

    // A double submit: the same confirm form twice, at once and then again.
    let form = [("action", "prioritize"), ("priority", "6"), ("reason", REASON)];
    let preview = f.preview("/batches/B1/act", &form, &extra).await;
    let head = f.head().await;
    let (one, two) = tokio::join!(
        f.confirm_from(CLIENT, "/batches/B1/act", &preview, &extra),
        f.confirm_from(CLIENT, "/batches/B1/act", &preview, &extra)
    );
    assert_eq!((one.status, two.status), (StatusCode::SEE_OTHER, StatusCode::SEE_OTHER), "{}{}", one.body, two.body);
    assert_eq!(f.head().await.0, head.0 + 1, "one event");
    let seq = f.events("B1").await.last().unwrap().seq;
    let flashes = [flash(&one), flash(&two)];
    assert_eq!(
        flashes.iter().filter(|m| m.starts_with(&format!("B1: recorded Prioritized (seq {seq}, success)"))).count(),
        1,
        "{flashes:?}"
    );
    assert_eq!(
        flashes.iter().filter(|m| m.starts_with(&format!("B1: already done: seq {seq} "))).count(),
        1,
        "{flashes:?}"
    );
    let third = f.confirm_from(CLIENT, "/batches/B1/act", &preview, &extra).await;
    assert!(flash(&third).starts_with(&format!("B1: already done: seq {seq} ")), "{}", flash(&third));
    assert_eq!(f.head().await.0, head.0 + 1, "still one event");
}

/// The skip form offers "force", the cancel form "record anyway"; without them the refusal
/// says how, with them the action is previewed and done.
#[tokio::test]
async fn skip_and_cancel_refuse_unless_forced_in_the_forms_too() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let page = f.get("/batches/B1", &extra).await.body;
    assert!(page.contains("name=\"force\" type=\"checkbox\" value=\"1\""), "{page}");
    assert!(page.contains("name=\"record_anyway\" type=\"checkbox\" value=\"1\""), "{page}");
    let head = f.head().await;
    let skip = [("action", "skip"), ("component", "probe"), ("reason", REASON)];
    let refused = f.preview("/batches/B1/act", &skip, &extra).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains("probe already succeeded on B1"), "{}", refused.body);
    assert!(refused.body.contains("--force skips anyway"), "{}", refused.body);
    let cancel = [("action", "cancel"), ("component", "probe"), ("reason", REASON)];
    let refused = f.preview("/batches/B1/act", &cancel, &extra).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains("probe has no open run on B1: nothing to cancel"), "{}", refused.body);
    assert_eq!(f.head().await, head, "refusals write nothing");

    let forced: Vec<(&str, &str)> = skip.iter().copied().chain([("force", "1")]).collect();
    let (preview, done) = f.preview_and_confirm("/batches/B1/act", &forced, &extra).await;
    assert!(
        preview.body.contains("Will record Probed (success); probe: success\u{a0}→\u{a0}skipped"),
        "{}",
        preview.body
    );
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let event = f.events("B1").await.last().unwrap().clone();
    assert!(event.is_skipped(), "{event:?}");
    let anyway: Vec<(&str, &str)> = cancel.iter().copied().chain([("record_anyway", "1")]).collect();
    let (_, done) = f.preview_and_confirm("/batches/B1/act", &anyway, &extra).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(flash(&done).contains("probe had no open run; recorded anyway as asked"), "{}", flash(&done));
    assert_eq!(f.head().await.0, head.0 + 2);
}

/// The query of a preview's address as its pairs, still percent-encoded.
fn query_pairs(address: &str) -> Vec<(String, String)> {
    let query = address.split_once('?').map_or("", |(_, q)| q);
    query.split('&').map(|pair| pair.split_once('=').expect("name=value")).map(|(n, v)| (n.into(), v.into())).collect()
}

/// Post/Redirect/Get: asking for a preview is answered 303 to its address, a GET carrying the
/// form's fields (the reason percent-encoded) and a fresh key; the GET writes nothing, is
/// never stored, and its confirm form carries that key. Asked for again once confirmed (Back),
/// it says what was recorded and offers nothing to confirm.
#[tokio::test]
async fn a_preview_is_a_get_with_a_key_and_says_done_once_confirmed() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let reason = "disk & co: 100% full? #1 <b>x</b> = été";
    let form = [("action", "rerun"), ("component", "checker"), ("reason", reason)];
    let head = f.head().await;
    let asked = f.post("/batches/B1/act", &form, &extra).await;
    assert_eq!(asked.status, StatusCode::SEE_OTHER, "{}", asked.body);
    let address = asked.header(header::LOCATION).to_owned();
    assert!(address.starts_with("/batches/B1/act?"), "{address}");
    let pairs = query_pairs(&address);
    let names: Vec<&str> = pairs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["action", "component", "reason", "key"], "{address}");
    assert_eq!(pairs[2].1, "disk+%26+co%3A+100%25+full%3F+%231+%3Cb%3Ex%3C%2Fb%3E+%3D+%C3%A9t%C3%A9", "{address}");
    let key = pairs[3].1.clone();
    assert!(key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "128 random bits: {key}");
    let other = f.post("/batches/B1/act", &form, &extra).await;
    assert_ne!(query_pairs(other.header(header::LOCATION))[3].1, key, "each preview asked for gets its own key");
    assert_eq!(f.head().await, head, "asking for a preview writes nothing");

    let preview = f.follow(CLIENT, &asked, &extra).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert_eq!(preview.header(header::CACHE_CONTROL), "no-store");
    assert!(preview.body.contains("Will record Reset (success) superseding Checked"), "{}", preview.body);
    assert!(
        preview.body.contains("<dd>disk &amp; co: 100% full? #1 &lt;b&gt;x&lt;/b&gt; = été</dd>"),
        "{}",
        preview.body
    );
    let fields = confirm_fields(&preview.body);
    assert!(fields.contains(&("key".to_owned(), key.clone())), "the confirm uses the address's key: {fields:?}");
    assert!(fields.contains(&("reason".to_owned(), reason.to_owned())), "{fields:?}");
    // Asked for again before the confirm (a reload): the same preview, the same key.
    let reload = f.get(&address, &extra).await;
    assert_eq!(confirm_fields(&reload.body), fields);
    assert_eq!(f.head().await, head, "a preview writes nothing");

    let done = f.confirm_from(CLIENT, "/batches/B1/act", &preview, &extra).await;
    assert_eq!((done.status, done.header(header::LOCATION)), (StatusCode::SEE_OTHER, "/batches/B1"), "{}", done.body);
    let reset = f.events("B1").await.last().unwrap().clone();
    assert_eq!(reset.details["reason"], reason);
    assert_eq!(reset.details["idempotency_key"], key.as_str());
    let head = f.head().await;

    // Back: the preview's address, asked for again.
    let back = f.get(&address, &extra).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert_eq!(back.header(header::CACHE_CONTROL), "no-store");
    let words = format!(
        "Done: Reset (success) superseding Checked, seq {}, by <code>operator:tester</code> at {}.",
        reset.seq, reset.at
    );
    assert!(back.body.contains(&words), "{words}\n{}", back.body);
    assert!(!back.body.contains("name=\"confirm\"") && !back.body.contains("name=\"plan\""), "{}", back.body);
    assert!(!back.body.contains("Nothing has been written yet"), "{}", back.body);
    assert!(back.body.contains("href=\"/batches/B1\""), "a way to the batch: {}", back.body);
    // The same key with another action: refused, nothing to confirm.
    let reused = address.replace("action=rerun&component=checker", "action=prioritize&priority=3");
    let reused = f.get(&reused, &extra).await;
    assert_eq!(reused.status, StatusCode::CONFLICT, "{}", reused.body);
    assert!(
        reused.body.contains(&format!("the key {key} was already used on B1 for another request")),
        "{}",
        reused.body
    );
    assert!(!reused.body.contains("name=\"confirm\""), "{}", reused.body);
    assert_eq!(f.head().await, head, "reached again, the preview wrote nothing");
}

/// The preview's address is checked as the form is (each parameter, the key), needs the
/// operator role as the POST does, and is refused unless the monitor's own pages led there.
#[tokio::test]
async fn a_preview_address_is_checked_like_the_form_and_shown_only_to_operators_on_the_monitors_pages() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let head = f.head().await;
    let key = "0123456789abcdef0123456789abcdef";
    let one = format!("/batches/B1/act?action=rerun&component=checker&reason=why&key={key}");
    let bulk = format!("/bulk?q=&order=oldest&action=prioritize&priority=5&reason=why&key={key}");
    for ok in [one.clone(), format!("{bulk}&since=0")] {
        let page = f.get(&ok, &extra).await;
        assert_eq!(page.status, StatusCode::OK, "{ok}: {}", page.body);
        assert!(page.body.contains("name=\"confirm\""), "{}", page.body);
    }
    let bad = [
        (format!("{one}&colour=red"), "colour"),
        (format!("{one}&confirm=1"), "confirm"),
        (format!("{one}&plan=1%3AReset%2Fsuccess%2FChecked"), "plan"),
        (format!("{one}&reason=again"), "reason"),
        (one.replace(&format!("key={key}"), "key=-no"), "key"),
        (one.replace(&format!("&key={key}"), ""), "key"),
        (one.replace("action=rerun", "action=explode"), "action"),
        (one.replace("component=checker", "component=nosuch"), "component"),
        (one.replace("reason=why", "reason=+"), "reason"),
        (format!("{one}&force=1"), "force"),
        (format!("{bulk}&since=0&colour=red"), "colour"),
        (bulk.clone(), "since"),
        (format!("{bulk}&since=-1"), "since"),
        (format!("{bulk}&since=0").replace("q=", "q=colour%3Ared"), "q"),
    ];
    for (uri, field) in bad {
        let page = f.get(&uri, &extra).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri}: {}", page.body);
        assert_eq!(page.header(header::CACHE_CONTROL), "no-store", "{uri}");
    }

    // Reads behind the role the POST needs: signed out, a viewer, a viewer named by the
    // proxy, a monitor without accounts.
    let viewer = f.sign_in("vera").await;
    for uri in [one.clone(), format!("{bulk}&since=0")] {
        let anonymous = f.get(&uri, &[]).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{uri}: {}", anonymous.body);
        let refused = f.get(&uri, &[("cookie", &viewer)]).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{uri}: {}", refused.body);
        assert!(refused.body.contains("needs the operator role; the account vera is a viewer"), "{}", refused.body);
        assert!(!refused.body.contains("name=\"confirm\"") && !refused.body.contains("Will record"));
        let proxied = f.get_from(PROXY, &uri, &[("x-remote-user", "vera")]).await;
        assert_eq!(proxied.status, StatusCode::FORBIDDEN, "{uri}");
    }
    let read_only = fixture_with(WebOptions::default()).await;
    let refused = read_only.get(&one, &[]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("read only"), "{}", refused.body);

    // Sent there by another site's page, or by a link from outside the monitor: refused as
    // a POST from there is. From the monitor's own pages (a redirect, Back, a reload): shown.
    for from in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("sec-fetch-site", "none")],
        vec![("origin", "http://evil.example")],
        vec![("origin", "null")],
    ] {
        for uri in [one.clone(), format!("{bulk}&since=0")] {
            let headers: Vec<(&str, &str)> = extra.iter().chain(&from).copied().collect();
            let page = f.get(&uri, &headers).await;
            assert_eq!(page.status, StatusCode::FORBIDDEN, "{uri} {from:?}: {}", page.body);
            assert!(page.body.contains("nothing was changed") && !page.body.contains("name=\"confirm\""));
        }
    }
    let own = [("cookie", cookie.as_str()), ("sec-fetch-site", "same-origin"), ("origin", "http://monitor.test:7072")];
    assert_eq!(f.get(&one, &own).await.status, StatusCode::OK);

    // What cannot make an address is refused by the POST itself: a reason over its 2000
    // characters, in the operator module's words; any other field too long for an address.
    // The longest reason fits, however it is encoded.
    let long = "é".repeat(2001);
    let huge = "c".repeat(60_000);
    let longest = "🙂".repeat(2000);
    for (uri, form, field) in [
        ("/batches/B1/act", [("action", "rerun"), ("component", "checker"), ("reason", long.as_str())], "reason"),
        ("/bulk", [("action", "rerun"), ("component", "checker"), ("reason", long.as_str())], "reason"),
        ("/batches/B1/act", [("action", "rerun"), ("component", huge.as_str()), ("reason", REASON)], "component"),
    ] {
        let answer = f.post(uri, &form, &extra).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{uri} {field}: {}", answer.status);
        assert!(answer.body.contains(&format!("<code>{field}</code>")), "{uri}: {}", answer.body);
    }
    let form = [("action", "rerun"), ("component", "checker"), ("reason", longest.as_str())];
    let preview = f.preview("/batches/B1/act", &form, &extra).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(confirm_fields(&preview.body).contains(&("reason".to_owned(), longest.clone())));
    assert_eq!(f.head().await, head, "nothing written");
}

/// A bulk preview reached again after its confirm (Back) says on how many batches it was
/// done and offers nothing to confirm, even when the batches left the filter (a rerun of
/// the failed ones).
#[tokio::test]
async fn a_bulk_preview_reached_again_after_its_confirm_says_it_was_done() {
    let f = fixture().await;
    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let form = [
        ("q", "component:checker state:failed"),
        ("order", "oldest"),
        ("action", "rerun"),
        ("component", "checker"),
        ("reason", REASON),
    ];
    let asked = f.post("/bulk", &form, &extra).await;
    assert_eq!(asked.status, StatusCode::SEE_OTHER, "{}", asked.body);
    let address = asked.header(header::LOCATION).to_owned();
    let names: Vec<String> = query_pairs(&address).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["q", "order", "action", "component", "reason", "key", "since"], "{address}");
    let preview = f.follow(CLIENT, &asked, &extra).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert_eq!(preview.header(header::CACHE_CONTROL), "no-store");
    assert!(preview.body.contains("1 selected: 1 would be acted on, 0 refused"), "{}", preview.body);
    let done = f.confirm_from(CLIENT, "/bulk", &preview, &extra).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let reset = f.events("B1").await.last().unwrap().clone();
    assert!(reset.event_type.is_reset(), "{reset:?}");
    let head = f.head().await;

    let back = f.get(&address, &extra).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert_eq!(back.header(header::CACHE_CONTROL), "no-store");
    assert!(
        back.body.contains(&format!("its confirm recorded rerun on 1 batches (seq {0} to {0})", reset.seq)),
        "{}",
        back.body
    );
    assert!(back.body.contains("<a href=\"/batches/B1\">B1</a>"), "{}", back.body);
    assert!(!back.body.contains("name=\"confirm\""), "nothing to confirm: {}", back.body);
    assert_eq!(f.head().await, head, "nothing written");
}

/// The hidden fields of the steering preview's confirm form, as the browser posts them.
fn steer_confirm_fields(page: &str) -> Vec<(String, String)> {
    let form = page
        .split("<form method=\"post\" action=\"/steer\">")
        .nth(1)
        .filter(|form| form.contains("name=\"confirm\""))
        .unwrap_or_else(|| panic!("no steering confirm form in {page}"));
    let form = &form[..form.find("</form>").expect("the form's end")];
    let mut fields = Vec::new();
    for input in form.split("<input type=\"hidden\" ").skip(1) {
        let attribute = |name: &str| {
            let start = input.find(&format!("{name}=\"")).expect("the attribute") + name.len() + 2;
            unescape(&input[start..start + input[start..].find('"').expect("its end")])
        };
        fields.push((attribute("name"), attribute("value")));
    }
    for name in ["version", "confirm", "reason", "action"] {
        assert!(fields.iter().any(|(n, _)| n == name), "no {name} in the confirm form: {fields:?}");
    }
    fields
}

impl Fixture {
    /// The steering state and its newest log entries.
    async fn steering(&self) -> (autocomp_model::Steering, Vec<autocomp_model::SteeringEntry>) {
        self.monitor.operator().steering().await.unwrap()
    }

    async fn steering_version(&self) -> u64 {
        self.steering().await.0.version
    }

    /// Posts the steering preview's confirm form.
    async fn confirm_steer(&self, preview: &Answer, extra: Fields<'_>) -> Answer {
        let fields = steer_confirm_fields(&preview.body);
        let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.post("/steer", &fields, extra).await
    }

    /// Declares the human step `review` (records Reviewed once Probed succeeded): B1 and B2
    /// wait for a person there.
    async fn declare_review(&self) {
        let step = autocomp_ops::operator::HumanStep {
            name: "review".into(),
            event_type: "Reviewed".into(),
            requires: vec!["Probed".into()],
            ..Default::default()
        };
        let operator = self.monitor.operator().acting_as("setup");
        operator.declare_step(&step, "a person looks at every probe").await.unwrap();
    }
}

/// Pausing, draining, resuming and pool sizes are pipeline-wide: an admin's. Operators and
/// viewers see the steering but no forms, and their requests are refused changing nothing.
#[tokio::test]
async fn steering_is_an_admins_and_others_see_it_without_forms() {
    let f = fixture().await;
    let form = [("action", "pause"), ("component", "probe"), ("reason", REASON)];
    let confirm = [("action", "pause"), ("component", "probe"), ("reason", REASON), ("version", "0"), ("confirm", "1")];
    let address = format!("/steer?action=pause&component=probe&reason=why&since=0&key={}", "ab".repeat(16));
    let head = f.head().await;
    let anonymous = f.get("/", &[]).await.body;
    assert!(anonymous.contains("id=\"steering\"") && anonymous.contains("Sign in</a> as an admin"), "{anonymous}");
    assert!(!anonymous.contains("action=\"/steer\""), "{anonymous}");
    assert_eq!(f.post("/steer", &form, &[]).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(f.post("/steer", &confirm, &[]).await.status, StatusCode::UNAUTHORIZED);
    for (name, role) in [("tester", "an operator"), ("vera", "a viewer")] {
        let cookie = f.sign_in(name).await;
        let extra = [("cookie", cookie.as_str())];
        let page = f.get("/", &extra).await.body;
        assert!(page.contains("Each component&#39;s hold") || page.contains("Each component's hold"), "{page}");
        assert!(page.contains("pausing, draining, resuming and pool sizes need the admin role"), "{page}");
        assert!(!page.contains("action=\"/steer\"") && !page.contains("value=\"pause\""), "{name}: {page}");
        for answer in [
            f.post("/steer", &form, &extra).await,
            f.post("/steer", &confirm, &extra).await,
            f.get(&address, &extra).await,
        ] {
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "{name}: {}", answer.body);
            let words = format!("needs the admin role; the account {name} is {role}; nothing was changed");
            assert!(answer.body.contains(&words), "{name}: {}", answer.body);
            assert!(!answer.body.contains("name=\"confirm\""));
        }
    }
    // From another site, even an admin's session is refused.
    let admin = f.sign_in("root").await;
    let page = f.get("/", &[("cookie", &admin)]).await.body;
    assert!(page.contains("action=\"/steer\"") && page.contains("value=\"pause\""), "{page}");
    let elsewhere = f.post("/steer", &confirm, &[("cookie", &admin), ("origin", "http://evil.example")]).await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN, "{}", elsewhere.body);
    let elsewhere = f.get(&address, &[("cookie", &admin), ("sec-fetch-site", "cross-site")]).await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN, "{}", elsewhere.body);
    let read_only = fixture_with(WebOptions::default()).await;
    assert_eq!(read_only.post("/steer", &confirm, &[]).await.status, StatusCode::FORBIDDEN);
    assert_eq!(f.head().await, head, "nothing written");
    assert_eq!(f.steering_version().await, 0, "nothing steered");
}

/// A pause is previewed (what it would record, what runs now), confirmed once: a second
/// submit of the same confirm answers "already done", Back to the preview says it is done,
/// and a confirm that finds the steering changed since its preview does nothing and is shown
/// a fresh preview saying so.
#[tokio::test]
async fn a_pause_is_previewed_confirmed_once_and_a_stale_confirm_changes_nothing() {
    let f = fixture().await;
    let cookie = f.sign_in("root").await;
    let extra = [("cookie", cookie.as_str())];
    // Something runs: the pause lets it go on, and the preview says so.
    let holder = autocomp_model::RunHolder {
        agent: Agent::new("probe/1.0@host1#77").unwrap(),
        host: "host1".into(),
        pid: 77,
        claim_key: None,
        liveness: None,
    };
    f.store.claim(&id("B3"), &autocomp_model::ComponentName::new("probe").unwrap(), &holder).await.unwrap();
    let form = [("action", "pause"), ("component", "probe"), ("reason", REASON)];
    let asked = f.post("/steer", &form, &extra).await;
    assert_eq!(asked.status, StatusCode::SEE_OTHER, "{}", asked.body);
    let address = asked.header(header::LOCATION).to_owned();
    let names: Vec<String> = query_pairs(&address).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["action", "component", "reason", "since", "key"], "{address}");
    assert!(address.starts_with("/steer?action=pause&component=probe&reason=the+disk+was+full&since=0&key="));
    let preview = f.follow(CLIENT, &asked, &extra).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert_eq!(preview.header(header::CACHE_CONTROL), "no-store");
    for words in [
        "Will record: paused probe.",
        "steering version 0",
        "<code>operator:root</code>",
        "Running now: 1 runs, which go on to their result",
        "<a href=\"/batches/B3\">B3</a>",
        "Nothing has been written yet",
    ] {
        assert!(preview.body.contains(words), "{words}: {}", preview.body);
    }
    let fields = steer_confirm_fields(&preview.body);
    assert!(fields.contains(&("version".into(), "0".into())), "{fields:?}");
    assert_eq!(f.steering_version().await, 0, "a preview steers nothing");

    let done = f.confirm_steer(&preview, &extra).await;
    assert_eq!((done.status, done.header(header::LOCATION)), (StatusCode::SEE_OTHER, "/#steering"), "{}", done.body);
    assert!(flash(&done).starts_with("recorded at steering version 1: paused probe"), "{}", flash(&done));
    let (steering, log) = f.steering().await;
    let hold = &steering.components[&autocomp_model::ComponentName::new("probe").unwrap()];
    assert_eq!(
        (hold.kind, hold.by.to_string(), hold.reason.as_str()),
        (autocomp_model::HoldKind::Pause, "operator:root".into(), REASON)
    );
    assert_eq!((steering.version, log.len()), (1, 1));

    // The same confirm again (a double click): already done, nothing more.
    let again = f.confirm_steer(&preview, &extra).await;
    assert_eq!(again.status, StatusCode::SEE_OTHER, "{}", again.body);
    assert!(flash(&again).starts_with("already done at steering version 1: paused probe"), "{}", flash(&again));
    assert_eq!(f.steering_version().await, 1);
    // Back: the preview's address says it was done, with nothing to confirm.
    let back = f.get(&address, &extra).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert!(
        back.body.contains("Done: paused probe, steering version 1, by <code>operator:root</code>"),
        "{}",
        back.body
    );
    assert!(!back.body.contains("name=\"confirm\""), "{}", back.body);
    // The overview shows the hold, who, why, and the log.
    let overview = f.get("/", &extra).await.body;
    assert!(overview.contains("hold-paused") && overview.contains("operator:root"), "{overview}");
    assert!(overview.contains("<td>paused probe</td>"), "{overview}");
    assert!(overview.contains("value=\"resume\"") && overview.contains("value=\"drain\""), "{overview}");

    // A drain previewed, then someone else resumes the component: the confirm changes
    // nothing and leads to a fresh preview that says why.
    let drain = [("action", "drain"), ("component", "probe"), ("reason", REASON)];
    let preview = f.preview("/steer", &drain, &extra).await;
    assert!(preview.body.contains("Will record: draining probe."), "{}", preview.body);
    let other = f.monitor.operator().acting_as("ann");
    let resume = autocomp_ops::operator::SteerAction::Resume {
        scope: autocomp_ops::operator::Scope::Component("probe".into()),
        rerun_failed: false,
    };
    other.steer(&resume, "back to work", None).await.unwrap();
    let stale = f.confirm_steer(&preview, &extra).await;
    assert_eq!(stale.status, StatusCode::SEE_OTHER, "{}", stale.body);
    assert!(stale.header(header::LOCATION).starts_with("/steer?action=drain"), "{}", stale.header(header::LOCATION));
    assert_eq!(f.steering_version().await, 2, "the stale confirm changed nothing");
    let shown = f.follow(CLIENT, &stale, &extra).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    assert!(shown.body.contains("changed since the preview (version 1, now 2)"), "{}", shown.body);
    assert!(shown.body.contains("nothing was done"), "{}", shown.body);
    assert!(steer_confirm_fields(&shown.body).contains(&("version".into(), "2".into())));
    assert!(shown.cookies().iter().any(|c| c.starts_with("autocomp_note_") && c.contains("Max-Age=0")));
}

/// Bad steering input is a 400 naming the field; a refusal is the operator module's; nothing
/// is changed by either.
#[tokio::test]
async fn bad_steering_input_names_the_field_and_changes_nothing() {
    let f = fixture().await;
    let cookie = f.sign_in("root").await;
    let extra = [("cookie", cookie.as_str())];
    let posts: [(Fields, &str); 12] = [
        (&[("action", "pause"), ("component", "probe"), ("reason", " ")], "reason"),
        (&[("action", "pause"), ("component", "probe")], "reason"),
        (&[("action", "explode"), ("component", "probe"), ("reason", REASON)], "action"),
        (&[("action", "pause"), ("reason", REASON)], "component"),
        (&[("action", "pause"), ("all", "1"), ("component", "probe"), ("reason", REASON)], "all"),
        (&[("action", "pause"), ("all", "yes"), ("reason", REASON)], "all"),
        (&[("action", "resume-rerun-failed"), ("all", "1"), ("reason", REASON)], "action"),
        (&[("action", "pool"), ("pool", "tape"), ("size", "many"), ("reason", REASON)], "size"),
        (&[("action", "pool"), ("pool", "tape"), ("size", "1001"), ("reason", REASON)], "size"),
        (&[("action", "pool"), ("size", "2"), ("reason", REASON)], "pool"),
        (&[("action", "pause"), ("component", "probe"), ("size", "2"), ("reason", REASON)], "size"),
        (&[("action", "pause"), ("component", "probe"), ("reason", REASON), ("colour", "red")], "colour"),
    ];
    for (form, field) in posts {
        let page = f.post("/steer", form, &extra).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{form:?}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{form:?}: {}", page.body);
        assert!(page.body.contains("Nothing was changed."), "{form:?}: {}", page.body);
    }
    // What only the pipeline can say, said by the preview: a component it does not have.
    let page = f.preview("/steer", &[("action", "pause"), ("component", "nosuch"), ("reason", REASON)], &extra).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.body);
    assert!(
        page.body.contains("<code>component</code>") && page.body.contains("known: probe, checker"),
        "{}",
        page.body
    );
    // A confirm without the previewed version, or a version that is not one.
    for (version, field) in [(None, "version"), (Some("soon"), "version")] {
        let mut form = vec![("action", "pause"), ("component", "probe"), ("reason", REASON), ("confirm", "1")];
        form.extend(version.map(|v| ("version", v)));
        let page = f.post("/steer", &form, &extra).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{form:?}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{}", page.body);
    }
    // The preview's address is checked as the form is.
    let key = "0123456789abcdef0123456789abcdef";
    let address = format!("/steer?action=pause&component=probe&reason=why&since=0&key={key}");
    assert_eq!(f.get(&address, &extra).await.status, StatusCode::OK);
    for (uri, field) in [
        (address.replace("&since=0", ""), "since"),
        (address.replace(&format!("&key={key}"), ""), "key"),
        (format!("{address}&confirm=1"), "confirm"),
        (format!("{address}&version=0"), "version"),
        (address.replace("reason=why", "reason=+"), "reason"),
    ] {
        let page = f.get(&uri, &extra).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{uri}: {}", page.body);
        assert_eq!(page.header(header::CACHE_CONTROL), "no-store");
    }
    // Refused as the pipeline is: resuming what is not paused.
    let refused =
        f.preview("/steer", &[("action", "resume"), ("component", "probe"), ("reason", REASON)], &extra).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains("probe is not paused"), "{}", refused.body);
    assert!(!refused.body.contains("name=\"confirm\""));
    assert_eq!(f.steering_version().await, 0, "nothing steered");
}

/// The whole pipeline's pause and a pool's size, through the same preview and confirm; the
/// overview shows both.
#[tokio::test]
async fn the_whole_pipeline_is_paused_and_a_pool_sized_from_the_overview() {
    let f = fixture().await;
    let cookie = f.sign_in("root").await;
    let extra = [("cookie", cookie.as_str())];
    let (preview, done) =
        f.preview_and_confirm_steer(&[("action", "pause"), ("all", "1"), ("reason", REASON)], &extra).await;
    assert!(preview.body.contains("Will record: paused the pipeline."), "{}", preview.body);
    assert!(flash(&done).contains("paused the pipeline"), "{}", flash(&done));
    let (preview, done) = f
        .preview_and_confirm_steer(&[("action", "pool"), ("pool", "tape"), ("size", "2"), ("reason", REASON)], &extra)
        .await;
    assert!(preview.body.contains("Will record: pool tape: size 2 (new)."), "{}", preview.body);
    assert!(flash(&done).contains("pool tape: size 2 (new)"), "{}", flash(&done));
    let (steering, _) = f.steering().await;
    assert_eq!(steering.pipeline.as_ref().map(|h| h.kind), Some(autocomp_model::HoldKind::Pause));
    assert_eq!(steering.pools.values().map(|p| p.size).collect::<Vec<_>>(), [2]);
    let overview = f.get("/", &extra).await.body;
    assert!(overview.contains("The whole pipeline is "), "{overview}");
    assert!(overview.contains("with the whole pipeline"), "{overview}");
    assert!(
        overview.contains(
            "<th scope=\"row\">tape</th><td class=\"num\">2</td><td class=\"num\">0</td><td class=\"num\">0</td>"
        ),
        "size 2, none in use, none waiting: {overview}"
    );
    assert!(overview.contains("Resume the whole pipeline"), "{overview}");
}

impl Fixture {
    /// Asks for a steering preview and posts its confirm form.
    async fn preview_and_confirm_steer(&self, form: Fields<'_>, extra: Fields<'_>) -> (Answer, Answer) {
        let preview = self.preview("/steer", form, extra).await;
        assert_eq!(preview.status, StatusCode::OK, "the preview of {form:?}: {}", preview.body);
        let done = self.confirm_steer(&preview, extra).await;
        assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
        (preview, done)
    }
}

/// An open circuit: the overview offers "Resume and rerun failed", whose preview names the
/// batches it would rerun, and whose confirm lifts the hold and reruns exactly those.
#[tokio::test]
async fn an_open_circuit_is_resumed_and_its_failed_batches_rerun() {
    let f = fixture().await;
    let checker = autocomp_model::ComponentName::new("checker").unwrap();
    f.store
        .steer(autocomp_model::SteeringRequest {
            change: autocomp_model::SteeringChange::Outcome {
                component: checker.clone(),
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
    let cookie = f.sign_in("root").await;
    let extra = [("cookie", cookie.as_str())];
    let overview = f.get("/", &extra).await.body;
    assert!(
        overview.contains("hold-circuit") && overview.contains("circuit open: 1 consecutive failures"),
        "{overview}"
    );
    assert!(overview.contains("value=\"resume-rerun-failed\">Resume and rerun failed</button>"), "{overview}");
    let before = f.events("B1").await.len();
    let form = [("action", "resume-rerun-failed"), ("component", "checker"), ("reason", REASON)];
    let (preview, done) = f.preview_and_confirm_steer(&form, &extra).await;
    assert!(preview.body.contains("Would rerun 1 batches"), "{}", preview.body);
    assert!(preview.body.contains("<a href=\"/batches/B1\">B1</a>"), "{}", preview.body);
    let flash = flash(&done);
    assert!(flash.contains("resumed checker (its circuit was open after 1 consecutive failures)"), "{flash}");
    assert!(flash.contains("B1: recorded Reset"), "{flash}");
    assert!(f.steering().await.0.components.is_empty());
    let events = f.events("B1").await;
    assert_eq!(events.len(), before + 1, "one rerun");
    assert_eq!(events.last().unwrap().resets, vec![ty("Checked")]);
    assert_eq!(events.last().unwrap().agent.as_str(), "operator:root");
}

/// A human step's waiting batches: listed per step with how long they waited, counted and
/// filtered as `person`; the batch page puts the decision beside the evidence; approve and
/// reject are previewed and confirmed once, by operators only.
#[tokio::test]
async fn batches_waiting_for_a_person_are_listed_and_decided_by_operators() {
    let f = fixture().await;
    f.declare_review().await;
    let waiting = f.get("/waiting", &[]).await;
    assert_eq!(waiting.status, StatusCode::OK, "{}", waiting.body);
    assert!(waiting.body.contains("2 batches wait for a person at review"), "{}", waiting.body);
    let (b1, b2) = (waiting.body.find(">B1</a>").expect("B1"), waiting.body.find(">B2</a>").expect("B2"));
    assert!(b1 < b2, "the longest waiting first: {}", waiting.body);
    assert!(!waiting.body.contains(">B3</a>"), "B3 waits for its data, not a person");
    let overview = f.get("/", &[]).await.body;
    assert!(overview.contains("2 batches wait for a person (review: 2)") && overview.contains("href=\"/waiting\""));
    assert!(
        overview.contains("/batches?q=component%3Areview+state%3Aperson\" aria-label=\"2 batches person for review\""),
        "{overview}"
    );
    let matrix = f.get("/batches?q=component:review+state:person", &[]).await.body;
    assert!(matrix.contains("<strong>2</strong> batches match") && matrix.contains("state-person"), "{matrix}");
    let csv = f.get("/batches.csv?q=component:review+state:person", &[]).await.body;
    assert!(csv.lines().nth(1).is_some_and(|l| l.ends_with(",person")), "{csv}");

    // The batch page: the evidence and the decision together, before the rest.
    let viewer = f.sign_in("vera").await;
    let page = f.get("/batches/B2", &[("cookie", &viewer)]).await.body;
    let decision = page.find("Waiting for a person at review").expect("the decision section");
    assert!(decision < page.find("Each component's state").expect("the states"), "first: {page}");
    assert!(page.contains("Evidence for review") && page.contains("<code>Probed</code>"), "{page}");
    assert!(page.contains("is a viewer: it may read but not act") && !page.contains("value=\"approve\""), "{page}");
    let refused = f
        .post(
            "/batches/B2/act",
            &[("action", "approve"), ("step", "review"), ("reason", REASON)],
            &[("cookie", &viewer)],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);

    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let page = f.get("/batches/B2", &extra).await.body;
    assert!(page.contains("name=\"action\" value=\"approve\"") && page.contains("name=\"action\" value=\"reject\""));
    assert!(page.contains("name=\"restart_from\"><option value=\"\">no restart"), "{page}");
    assert!(page.contains("<option value=\"Probed\">Probed</option>"), "{page}");
    let head = f.head().await;
    let approve = [("action", "approve"), ("step", "review"), ("reason", REASON)];
    let (preview, done) = f.preview_and_confirm("/batches/B2/act", &approve, &extra).await;
    assert!(
        preview.body.contains("Will record Reviewed (success); review: person\u{a0}→\u{a0}success"),
        "{}",
        preview.body
    );
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let event = f.events("B2").await.last().unwrap().clone();
    assert_eq!(
        (event.event_type.as_str(), event.outcome, event.agent.as_str()),
        ("Reviewed", Outcome::Success, "operator:tester")
    );
    assert!(event.flag("approved"), "{event:?}");
    let again = f.confirm_from(CLIENT, "/batches/B2/act", &preview, &extra).await;
    assert!(flash(&again).contains("already done"), "{}", flash(&again));
    assert_eq!(f.head().await.0, head.0 + 1, "one event");
    assert!(!f.get("/waiting", &[]).await.body.contains(">B2</a>"));

    // Rejected, and sent back to be probed again.
    let reject = [("action", "reject"), ("step", "review"), ("restart_from", "Probed"), ("reason", REASON)];
    let (preview, done) = f.preview_and_confirm("/batches/B1/act", &reject, &extra).await;
    assert!(preview.body.contains("superseding"), "{}", preview.body);
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let event = f.events("B1").await.last().unwrap().clone();
    assert!(event.event_type.is_reset() && event.resets.contains(&ty("Probed")) && event.flag("rejected"), "{event:?}");

    // Bad decisions name the field, or are refused in the operator module's words.
    let head = f.head().await;
    for (form, field) in [
        (&[("action", "approve"), ("step", "probe"), ("reason", REASON)][..], "step"),
        (&[("action", "approve"), ("reason", REASON)][..], "step"),
        (
            &[("action", "approve"), ("step", "review"), ("restart_from", "Probed"), ("reason", REASON)][..],
            "restart_from",
        ),
        (&[("action", "rerun"), ("component", "probe"), ("step", "review"), ("reason", REASON)][..], "step"),
    ] {
        let page = f.preview("/batches/B3/act", form, &extra).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{form:?}: {}", page.body);
        assert!(page.body.contains(&format!("<code>{field}</code>")), "{form:?}: {}", page.body);
    }
    let refused = f.preview("/batches/B3/act", &approve, &extra).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.body.contains("B3 is not waiting for a person at review"), "{}", refused.body);
    assert_eq!(f.head().await, head, "nothing written");
}

/// The batches waiting at a human step are decided at once: the waiting page links to the
/// list of them with the bulk forms open, which offer approve and reject at that step; the
/// preview is bound to the batches it counted, and the confirm approves each once.
#[tokio::test]
async fn the_batches_waiting_at_a_human_step_are_approved_at_once() {
    let f = fixture().await;
    f.declare_review().await;
    let cookie = f.sign_in("tester").await;
    let extra = [("cookie", cookie.as_str())];
    let waiting = f.get("/waiting", &extra).await.body;
    let link = "/batches?q=component%3Areview+state%3Aperson#bulk-actions";
    assert!(waiting.contains(&format!("href=\"{link}\">approve or reject them all at once")), "{waiting}");
    let list = f.get("/batches?q=component:review+state:person", &extra).await.body;
    assert!(list.contains("<details class=\"bulk\" id=\"bulk-actions\" open>"), "opened: {list}");
    assert!(list.contains("id=\"bulk-decide-approve-legend\">Approve at review</legend>"), "{list}");
    assert!(list.contains("id=\"bulk-decide-reject-legend\">Reject at review</legend>"), "{list}");

    let head = f.head().await;
    let approve = [
        ("q", "component:review state:person"),
        ("order", "oldest"),
        ("action", "approve"),
        ("step", "review"),
        ("reason", REASON),
    ];
    let (preview, done) = f.preview_and_confirm("/bulk", &approve, &extra).await;
    assert!(preview.body.contains("2 selected: 2 would be acted on, 0 refused"), "{}", preview.body);
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(flash(&done).starts_with("approve on 2 batches: 2 performed, 0 refused"), "{}", flash(&done));
    for batch in ["B1", "B2"] {
        let event = f.events(batch).await.last().unwrap().clone();
        assert!(event.event_type.as_str() == "Reviewed" && event.flag("approved"), "{batch}: {event:?}");
    }
    assert_eq!(f.head().await.0, head.0 + 2, "one event a batch");
    assert!(f.get("/waiting", &extra).await.body.contains("0 batches wait for a person at review"));
}
