//! The preview-then-confirm protocol every write from the browser goes through, a batch's
//! actions (`actions`), bulk actions (`bulk`) and steering (`steering`) alike: how a form
//! and a preview's address are read, the preview's address and its key, the note of a
//! preview shown again, the guard against previews opened from elsewhere, and the pieces
//! of every preview page (its opening, facts, confirm form, "done" and "refused now").
//!
//! **Post/Redirect/Get.** The action form posts to `POST /batches/{id}/act` (or `POST /bulk`);
//! the fields are checked as ever, and the answer is 303 to the preview's address, a GET
//! that carries the form's fields (percent-encoded: the reason is the person's text, escaped
//! again when shown) and a fresh `key`: `GET /batches/{id}/act?action=cancel&component=c&
//! reason=...&key=K`, and for a bulk action `GET /bulk?q=...&order=...&action=...&key=K&
//! since=S`. The GET reads only. It checks its parameters as the POST checks its fields (an
//! unknown one, one given twice, a bad key: 400 naming it), needs the same operator role
//! (it shows a form that acts), and is refused when another site's page sent the browser to
//! it, as the POST is (`refuse_from_elsewhere`). Its answer is `Cache-Control: no-store`, so
//! Back and Forward ask for it again instead of showing a stored copy.
//!
//! **Confirm exactly what was previewed, once.** The preview's confirm form carries, besides
//! the action's fields, two hidden fields:
//! - `plan`: what the preview planned against (for one batch its version, `changed_seq`, and
//!   the write planned; for a bulk action the count and a SHA-256 of the ids with their
//!   versions and planned writes). The confirm re-plans; if anything differs it writes
//!   nothing (see "shown again").
//! - `key`: the idempotency key of the preview's address. The write records it (a bulk
//!   action derives one per batch from it and the batch id). A confirm whose key the
//!   batch's log already holds writes nothing and answers "already done: seq N", so a double
//!   click or a resubmitted form records once.
//!
//! **Back after a confirm.** Back leads to the preview's address, which is asked for again.
//! Its key is now in the batch's log (`Operator::find_keyed`), so the page says "Done:
//! Reset (success) superseding Checked, seq N, by operator:x at T" with a link to the batch,
//! and has no confirm form. For a bulk preview the batches that hold the key derived for
//! them are counted (`Operator::find_keyed_many`): those changed since `since` (the store's
//! head when the preview was asked for; the confirm wrote after it, perhaps taking the
//! batches out of the filter, as a rerun of `state:failed` does), and the filter's batches
//! if more than `MAX_BULK_BATCHES` changed since. If any holds it, the page says on how
//! many batches it was done, and has no confirm form.
//!
//! **Shown again.** A confirm that finds the batch changed (or the key used for another
//! request) writes nothing and answers 303 to a fresh preview's address, with a new key;
//! that page shows the ops module's words ("the batch changed since your preview (seq X ->
//! Y): nothing was done; review and confirm again"), then the preview as the batch is now
//! (or "As the batch is now, it is refused: ...", 409, with no confirm form). The words
//! travel in a cookie named after the new key, for the preview's path only, for 2 minutes,
//! cleared by the page that shows them. It is a redirect rather than a 409 page rendered
//! in answer to the POST because the fresh preview is a page one may confirm and then go
//! Back to: as the answer to a POST, Back to it would be the browser's "resubmit the form?"
//! (`no-store`) or its stored copy (without), never "done"; as a GET it is asked for again
//! and says it is done.

use argon2::password_hash::rand_core::{OsRng, RngCore};
use autocomp_model::{IdempotencyKey, InvalidInput};
use axum::Form;
use axum::extract::Query;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::de::DeserializeOwned;

use super::access::Access;
use super::auth::{decode, flash_cookie};
use super::error::WebError;
use super::html::{Nav, Page, esc, html_response, w};
use super::sessions::cookie;
use crate::filter::encode;

/// The fields given as `T`, the operator module's form of an action (its `ActionForm` or
/// `SteerForm`): read by name as axum's `Form` reads a form, once `check_names` has refused
/// an unknown field or one given twice.
pub(super) fn typed<T: DeserializeOwned>(fields: &[(String, String)]) -> Result<T, WebError> {
    let encoded = serde_urlencoded::to_string(fields).expect("pairs of strings encode");
    serde_urlencoded::from_str(&encoded).map_err(|e| InvalidInput::new("form", "", e.to_string()).into())
}

/// The fields of a posted form.
pub(super) fn form_fields(
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Vec<(String, String)>, WebError> {
    let Form(fields) = form.map_err(|e| WebError::unreadable("form", e.status(), &e.body_text()))?;
    Ok(fields)
}

/// The fields of a preview's address.
pub(super) fn query_fields(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Vec<(String, String)>, WebError> {
    let Query(fields) = query.map_err(|e| WebError::unreadable("query", e.status(), &e.body_text()))?;
    Ok(fields)
}

pub(super) fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The key a preview's address carries: its confirm form's, made by the POST that led
/// here (or by a confirm that found the batch changed).
pub(super) fn query_key(fields: &[(String, String)]) -> Result<IdempotencyKey, WebError> {
    let key = field(fields, "key").unwrap_or_default();
    if key.is_empty() {
        return Err(InvalidInput::new(
            "key",
            "",
            "required: a preview's address carries the key its confirm uses; preview again from the batch's page",
        )
        .into());
    }
    Ok(IdempotencyKey::new(key).map_err(|e| InvalidInput::new("key", key, e.reason))?)
}

/// Every field is one of `known`, and none is given twice; else 400 naming it.
pub(super) fn check_names(fields: &[(String, String)], known: &[&str]) -> Result<(), WebError> {
    for (i, (name, value)) in fields.iter().enumerate() {
        if !known.contains(&name.as_str()) {
            return Err(InvalidInput::new(
                name.as_str(),
                value.as_str(),
                format!("not a field of this form (fields: {})", known.join(", ")),
            )
            .into());
        }
        if fields[..i].iter().any(|(earlier, _)| earlier == name) {
            return Err(InvalidInput::new(name.as_str(), value.as_str(), "given twice").into());
        }
    }
    Ok(())
}

/// The preview's address: `path`, the action's `fields`, then `extra` (the key, and what
/// the preview was asked for against), each name and value percent-encoded.
pub(super) fn preview_url(path: &str, fields: &[(String, String)], extra: &[(&str, &str)]) -> String {
    let pairs = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).chain(extra.iter().copied());
    let query: Vec<String> = pairs.map(|(name, value)| format!("{}={}", encode(name), encode(value))).collect();
    format!("{path}?{}", query.join("&"))
}

/// The address a preview asked for is sent to, once the fields that would not fit in one
/// are refused as the preview would refuse them: the reason in the operator module's words
/// (at most 2000 characters), any other field too long for an address.
pub(super) fn address(
    path: &str,
    fields: &[(String, String)],
    reason: &str,
    extra: &[(&str, &str)],
) -> Result<String, WebError> {
    autocomp_ops::operator::check_reason(reason)?;
    let address = preview_url(path, fields, extra);
    if address.len() > MAX_ADDRESS {
        let (name, value) = fields.iter().max_by_key(|(_, v)| v.len()).expect("an action field");
        let words = format!("too long for a preview's address ({} characters)", value.chars().count());
        return Err(InvalidInput::new(name.as_str(), "", words).into());
    }
    Ok(address)
}

/// The longest preview's address: a reason of 2000 characters and a filter of 1000, each
/// character percent-encoded as up to 12, fit.
pub(super) const MAX_ADDRESS: usize = 48 << 10;

/// A new idempotency key: 128 random bits from the OS, as hex.
pub(super) fn fresh_key() -> String {
    let mut random = [0u8; 16];
    OsRng.fill_bytes(&mut random);
    hex::encode(random)
}

/// How long a note for a preview shown again waits for its page (the redirect is
/// followed at once).
const NOTE_SECONDS: u64 = 120;
/// Longest note kept (the cookie, percent-encoded, must stay under 4 KiB).
const MAX_NOTE_CHARS: usize = 1_000;

/// The cookie that carries the note of a preview shown again to the one page with its key,
/// and only to the preview's path.
fn note_cookie(secure: bool, path: &str, key: &str, note: Option<&str>) -> HeaderValue {
    let mut text = format!("autocomp_note_{key}=");
    match note {
        Some(note) => {
            let mut kept: String = note.chars().take(MAX_NOTE_CHARS).collect();
            if kept.len() < note.len() {
                kept.push('…');
            }
            w!(text, "{}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={NOTE_SECONDS}", encode(&kept));
        }
        None => w!(text, "; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0"),
    }
    if secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("a hex key, a percent-encoded note and a percent-encoded path")
}

/// The note of a preview shown again that a request carries, if any, and the header that
/// clears it once the page has shown it.
pub(super) struct Note(Option<(String, HeaderValue)>);

impl Note {
    /// The note the request carries for the preview at `path` with `key`.
    pub(super) fn take(headers: &HeaderMap, secure: bool, path: &str, key: &str) -> Note {
        // Only a key this monitor made (hex) names a note.
        if !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Note(None);
        }
        let note = cookie(headers, &format!("autocomp_note_{key}")).filter(|v| !v.is_empty()).and_then(decode);
        Note(note.map(|note| (note, note_cookie(secure, path, key, None))))
    }

    pub(super) fn text(&self) -> Option<&str> {
        self.0.as_ref().map(|(note, _)| note.as_str())
    }

    /// `response`, clearing the note if there was one.
    pub(super) fn cleared(self, mut response: Response) -> Response {
        if let Some((_, clear)) = self.0 {
            response.headers_mut().append(header::SET_COOKIE, clear);
        }
        response
    }
}

/// A confirm that found what it would change changed: nothing was done; off (303) to a
/// fresh preview's `address` with the new `key`, whose note says so.
pub(super) fn shown_again(secure: bool, path: &str, address: &str, key: &str, note: &str) -> Response {
    let mut response = Redirect::to(address).into_response();
    response.headers_mut().append(header::SET_COOKIE, note_cookie(secure, path, key, Some(note)));
    response
}

/// A confirm that wrote: back (303) to the page the action came from, whose one-time
/// message says what was recorded.
pub(super) fn done_redirect(secure: bool, back: &str, words: &str) -> Response {
    let mut response = Redirect::to(back).into_response();
    response.headers_mut().append(header::SET_COOKIE, flash_cookie(secure, words));
    response
}

/// A preview's address is a page with a confirm form: like the POST that leads to it, it
/// is refused unless it comes from the monitor's own pages. A browser says where a
/// navigation came from in `Sec-Fetch-Site`: `same-origin` for the redirect after the
/// preview's POST and for Back, Forward and reload of it (checked in headless Chromium);
/// `none` when the address was typed, pasted, opened from a bookmark or from another
/// program (a mail or chat client); `same-site` or `cross-site` from another site's page.
/// Only `same-origin` passes, so a link nobody on this monitor made cannot put an
/// actionable preview in front of an operator. An `Origin`, if sent, must be this host.
/// Neither header (an old browser, a script): as for the POST, the session cookie
/// (SameSite=Strict) is the line.
pub(super) fn refuse_from_elsewhere(headers: &HeaderMap) -> Result<(), WebError> {
    let refuse = |why: String| {
        Err(WebError::new(
            StatusCode::FORBIDDEN,
            "Opened from elsewhere",
            format!(
                "{why}: a preview is shown only to the monitor's own pages; ask for it again there; nothing was \
                 changed"
            ),
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site")
        && site != "same-origin"
    {
        return refuse(format!(
            "this preview's address was not opened from this monitor's pages (Sec-Fetch-Site: {})",
            String::from_utf8_lossy(site.as_bytes())
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let own = [format!("http://{host}"), format!("https://{host}")];
        if host.is_empty() || !own.iter().any(|own| origin == own.as_str()) {
            return refuse(format!(
                "this preview was asked for from {} (not this monitor's own pages)",
                String::from_utf8_lossy(origin.as_bytes())
            ));
        }
    }
    Ok(())
}

/// A preview's answer is never stored: Back and Forward ask for it again, and see what it
/// became (done, or changed).
pub(super) fn no_store(answer: Result<Response, WebError>) -> Response {
    let mut response = answer.unwrap_or_else(IntoResponse::into_response);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A preview page under `nav`: 200, or 409 when a confirm that found its subject changed
/// shows it again and, as it is now, the action is refused.
pub(super) fn page(access: &Access, nav: Nav, status: StatusCode, title: &str, body: &str) -> Response {
    let page = Page { title, nav, access: Some(access), flash: None, live: false, here: "/" };
    html_response(status, page.render(body))
}

/// The note above a preview shown again, if any.
pub(super) fn note_html(note: Option<&str>) -> String {
    note.map(|note| format!("<p class=\"error\" role=\"alert\">{}</p>\n", esc(note))).unwrap_or_default()
}

/// The opening of every preview page: its heading (HTML), the note of a preview shown
/// again, and what the action would do, in words.
pub(super) fn opening(heading: &str, note: Option<&str>, summary: &str) -> String {
    format!("<h1>{heading}</h1>\n{}<p>{}</p>\n", note_html(note), esc(summary))
}

/// A preview's facts: `planned` (its own `<dt>`/`<dd>` pairs, HTML), then who it is
/// recorded as and the reason.
pub(super) fn facts(planned: &str, name: &str, reason: &str) -> String {
    format!(
        "<dl class=\"facts\">{planned}<dt>As</dt><dd><code>operator:{}</code></dd><dt>Reason</dt><dd>{}</dd></dl>\n",
        esc(name),
        esc(reason.trim())
    )
}

/// The confirm form: the preview's `hidden` fields (HTML), the button, and the way back.
pub(super) fn confirm_form(path: &str, hidden: &str, label: &str, back: &str, back_label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{}\">{hidden}<p><button type=\"submit\">Confirm: {}</button> \
         <a href=\"{}\">{}</a></p></form>\n",
        esc(path),
        esc(label),
        esc(back),
        esc(back_label)
    )
}

/// A preview shown again whose action, as things are `now`, is refused: the note and the
/// refusal, nothing to confirm.
pub(super) fn refused_now(heading: &str, note: Option<&str>, now: &str, words: &str, back: (&str, &str)) -> String {
    format!(
        "<h1>{heading}</h1>\n{}<p class=\"verdict\">As {now}, it is refused: {}</p>\n\
         <p>Nothing was written. <a href=\"{}\">{}</a></p>\n",
        note_html(note),
        esc(words),
        esc(back.0),
        esc(back.1)
    )
}

/// What a done preview's confirm recorded: `what`, `at` (its seq or version), by whom,
/// when, and why.
pub(super) fn done_verdict(what: &str, at: &str, by: &str, when: &str, reason: &str) -> String {
    format!(
        "<p class=\"verdict\" role=\"status\">Done: {}, {}, by <code>{}</code> at {}.</p>\n\
         <dl class=\"facts\"><dt>Reason</dt><dd>{}</dd></dl>\n",
        esc(what),
        esc(at),
        esc(by),
        esc(when),
        esc(reason)
    )
}

/// The end of a done preview: nothing to confirm; to do it again, preview it again `from`.
pub(super) fn done_end(from: &str, back: &str, back_label: &str) -> String {
    let mut out = String::new();
    w!(
        out,
        "<p>This preview was confirmed, and what it recorded is above: it cannot be confirmed again, and nothing \
         more was written. To do it once more, preview it again from {}.</p>\n<p><a href=\"{}\">{}</a></p>\n",
        esc(from),
        esc(back),
        esc(back_label)
    );
    out
}
