//! The operator's actions from the browser: the forms, a preview of what an action would do
//! (`Operator::preview`, `preview_many`), and only on the confirming POST the write itself
//! (`perform_confirmed`, `perform_many_confirmed`) as the signed-in operator, then a redirect
//! (303) to the page the action came from, whose flash says what was written. Input and
//! refusals come back in the operator module's own words. The decision at a human step
//! (`approve`, `reject` with an optional `restart_from`) is one of these actions, offered on
//! the batch's page while the batch waits there (`decision_forms`).
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

use std::collections::HashSet;
use std::sync::Arc;

use argon2::password_hash::rand_core::{OsRng, RngCore};
use autocomp_model::{Batch, BatchId, Event, IdempotencyKey, InvalidInput, Seq};
use autocomp_ops::operator::{
    Action, ActionPreview, ActionReport, BulkOutcome, BulkPreview, MAX_BULK_BATCHES, Operator, OperatorError,
    RestartFrom, check_reason,
};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::auth::{decode, flash_cookie};
use super::gate::Caller;
use super::html::{Nav, Page, attr, esc, hidden_fields, w};
use super::sessions::cookie;
use super::{App, WebError, html_response};
use crate::filter::{Filter, encode};

/// What an action form is about.
pub enum Target<'a> {
    One(&'a Batch),
    /// Every batch of the filter (`total` when the page was read).
    Bulk {
        filter: &'a Filter,
        total: u64,
    },
}

/// `from` for a restart at the first failure (an event type cannot contain `-`).
const FIRST_FAILURE: &str = "first-failure";

/// Why the page offers no action forms to this request (read only, signed out, a viewer),
/// or `None` for an operator or an admin.
fn why_no_forms(access: &Access, here: &str) -> Option<String> {
    let mut out = String::new();
    match access {
        Access::ReadOnly => out.push_str("<p>This monitor is read only (started without accounts): no actions.</p>\n"),
        Access::SignedOut => {
            w!(out, "<p><a href=\"/login?next={}\">Sign in</a> to act.</p>\n", esc(encode(here)))
        }
        Access::SignedIn { name, role, .. } if !access.may_act() => w!(
            out,
            "<p>Your account <strong>{}</strong> is a {}: it may read but not act on batches.</p>\n",
            esc(name),
            esc(role)
        ),
        Access::SignedIn { .. } => return None,
    }
    Some(out)
}

/// The decision at a human step the batch waits at: Approve, and Reject with an optional
/// type to restart from (one of the batch's effective `types`), each previewed first like
/// every batch action; or why there are none.
pub fn decision_forms(access: &Access, batch: &Batch, step: &str, types: &[String], here: &str) -> String {
    if let Some(why) = why_no_forms(access, here) {
        return why;
    }
    let mut out = String::new();
    let url = format!("/batches/{}/act", encode(batch.id.as_str()));
    w!(
        out,
        "<p class=\"help\">Each decision is previewed first; nothing is written until you confirm. It is recorded as \
         <code>operator:{}</code> with your reason.</p>\n<div class=\"actions\">\n",
        esc(access.name().unwrap_or_default())
    );
    let forms: [(&str, &str, String); 2] = [
        ("approve", "Approve", format!("Record {step}'s success, so the steps after it may run.")),
        (
            "reject",
            "Reject",
            format!(
                "Record {step}'s failure (it stays failed until rerun), or send the batch back: restart it from a \
                 step so it is redone and comes to {step} again."
            ),
        ),
    ];
    for (action, label, help) in forms {
        let id = format!("decide-{step}-{action}");
        w!(
            out,
            "<form method=\"post\" action=\"{}\" class=\"action\"><fieldset><legend id=\"{id}-legend\">{} at {}</legend>\
             <p class=\"help\">{}</p><input type=\"hidden\" name=\"action\" value=\"{}\">\
             <input type=\"hidden\" name=\"step\" value=\"{}\">",
            esc(&url),
            esc(label),
            esc(step),
            esc(help),
            esc(action),
            attr(step),
            id = esc(&id)
        );
        if action == "reject" {
            w!(
                out,
                "<p><label for=\"{0}-restart-from\">Restart from (optional)</label><select id=\"{0}-restart-from\" \
                 name=\"restart_from\"><option value=\"\">no restart: record the rejection</option>",
                esc(&id)
            );
            for t in types {
                w!(out, "<option value=\"{}\">{}</option>", attr(t), esc(t));
            }
            out.push_str("</select></p>");
        }
        w!(
            out,
            "<p><label for=\"{0}-reason\">Reason (required)</label><input id=\"{0}-reason\" name=\"reason\" required \
             maxlength=\"2000\"></p><p><button type=\"submit\">Preview {1}</button></p></fieldset></form>\n",
            esc(&id),
            esc(action)
        );
    }
    out.push_str("</div>\n");
    out
}

/// The action forms, or why there are none (read only, not signed in). `components` and
/// `types` fill the selects; `priority` is the batch's current one.
/// `preselect`: the component the component selects start at (a batch page's failed
/// component), else the first.
pub fn action_forms(
    access: &Access,
    target: &Target,
    components: &[String],
    types: &[String],
    priority: Option<i32>,
    preselect: Option<&str>,
    here: &str,
) -> String {
    if let Some(why) = why_no_forms(access, here) {
        return why;
    }
    let mut out = String::new();
    let (action_url, hidden, prefix, scope) = match target {
        Target::One(batch) => (
            format!("/batches/{}/act", encode(batch.id.as_str())),
            String::new(),
            "one".to_owned(),
            format!("batch {}", batch.id),
        ),
        Target::Bulk { filter, total } => (
            "/bulk".to_owned(),
            hidden_fields(&filter_fields(filter)),
            "bulk".to_owned(),
            format!("all {total} batches of the filter"),
        ),
    };
    w!(
        out,
        "<p class=\"help\">Each action is previewed first; nothing is written until you confirm. It acts on {}, is \
         recorded as <code>operator:{}</code> with your reason.</p>\n<div class=\"actions\">\n",
        esc(&scope),
        esc(access.name().unwrap_or_default())
    );
    let select = |out: &mut String, id: &str, name: &str, label: &str, options: &[(String, String)]| {
        w!(
            out,
            "<p><label for=\"{0}\">{1}</label><select id=\"{0}\" name=\"{2}\" required>",
            esc(id),
            esc(label),
            esc(name)
        );
        let chosen = preselect.filter(|p| name == "component" && options.iter().any(|(value, _)| value == p));
        for (value, text) in options {
            let selected = if chosen == Some(value.as_str()) { " selected" } else { "" };
            w!(out, "<option value=\"{}\"{selected}>{}</option>", esc(value), esc(text));
        }
        out.push_str("</select></p>");
    };
    let component_options: Vec<(String, String)> = components.iter().map(|c| (c.clone(), c.clone())).collect();
    let from_options: Vec<(String, String)> =
        std::iter::once((FIRST_FAILURE.to_owned(), "the first failure".to_owned()))
            .chain(types.iter().map(|t| (t.clone(), t.clone())))
            .collect();
    let forms: [(&str, &str, &str); 5] = [
        ("rerun", "Rerun", "Supersede the component's result (a Reset) so it runs again."),
        ("restart", "Restart", "Reset the starting step and every step recorded after it."),
        ("cancel", "Cancel", "Stop the component's running worker and record a cancelled failure."),
        ("skip", "Skip", "Record a skipped success so the steps after it may run."),
        ("prioritize", "Prioritize", "Set the priority (higher runs first)."),
    ];
    for (action, label, help) in forms {
        let id = format!("{prefix}-{action}");
        w!(
            out,
            "<form method=\"post\" action=\"{}\" class=\"action\">\
             <fieldset><legend id=\"{id}-legend\">{}</legend><p class=\"help\">{}</p>{hidden}\
             <input type=\"hidden\" name=\"action\" value=\"{}\">",
            esc(&action_url),
            esc(label),
            esc(help),
            esc(action),
            id = esc(&id)
        );
        match action {
            "rerun" | "cancel" | "skip" => {
                if components.is_empty() {
                    out.push_str("<p>No components.</p></fieldset></form>");
                    continue;
                }
                select(&mut out, &format!("{id}-component"), "component", "Component", &component_options);
                let checkbox = match action {
                    "skip" => Some(("force", "Force: skip even over a success")),
                    "cancel" => Some(("record_anyway", "Record the cancelled failure even if it is not running")),
                    _ => None,
                };
                if let Some((name, label)) = checkbox {
                    w!(
                        out,
                        "<p><label for=\"{0}-{1}\"><input id=\"{0}-{1}\" name=\"{1}\" type=\"checkbox\" value=\"1\"> \
                         {2}</label></p>",
                        esc(&id),
                        esc(name),
                        esc(label)
                    );
                }
            }
            "restart" => select(&mut out, &format!("{id}-from"), "from", "From", &from_options),
            _ => w!(
                out,
                "<p><label for=\"{0}-priority\">Priority</label><input id=\"{0}-priority\" name=\"priority\" \
                 type=\"number\" step=\"1\" required value=\"{1}\"></p>",
                esc(&id),
                esc(priority.unwrap_or(0))
            ),
        }
        w!(
            out,
            "<p><label for=\"{0}-reason\">Reason (required)</label><input id=\"{0}-reason\" name=\"reason\" required \
             maxlength=\"2000\" aria-describedby=\"{0}-reason-help\"><span id=\"{0}-reason-help\" class=\"help\">\
             Recorded with the event for whoever reads the log later.</span></p>\
             <p><button type=\"submit\">Preview {1}</button></p></fieldset></form>\n",
            esc(&id),
            esc(action)
        );
    }
    out.push_str("</div>\n");
    out
}

fn filter_fields(filter: &Filter) -> Vec<(String, String)> {
    let order = match filter.order {
        autocomp_sboi::PageOrder::Priority => "priority",
        _ => "oldest",
    };
    vec![("q".into(), filter.query()), ("order".into(), order.into())]
}

/// An action form, posted or in a preview's address, checked field by field.
struct Posted {
    action: Action,
    reason: String,
    /// Present when confirming a preview.
    confirm: Option<Confirm>,
    /// The action's fields (and a bulk action's filter): every field but `confirm`, `plan`,
    /// `key` and `since`, for the preview's address and its confirm form.
    fields: Vec<(String, String)>,
}

/// What a confirm carries: the plan it confirms and its idempotency key.
struct Confirm {
    plan: String,
    key: IdempotencyKey,
}

/// A checkbox: absent or empty is unchecked, `1` checked.
pub(super) fn checkbox(name: &str, value: Option<&str>) -> Result<bool, InvalidInput> {
    match value {
        None | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(InvalidInput::new(name, other, "expected 1 (checked) or nothing")),
    }
}

/// The fields of a posted form.
pub(super) fn form_fields(
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Vec<(String, String)>, WebError> {
    let Form(fields) = form.map_err(|e| WebError::invalid(InvalidInput::new("form", "", e.body_text())))?;
    Ok(fields)
}

/// The fields of a preview's address.
pub(super) fn query_fields(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Vec<(String, String)>, WebError> {
    let Query(fields) = query.map_err(|e| WebError::invalid(InvalidInput::new("query", "", e.body_text())))?;
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

impl Posted {
    fn parse(fields: Vec<(String, String)>, known: &[&str]) -> Result<Posted, WebError> {
        check_names(&fields, known)?;
        let get = |name: &str| field(&fields, name);
        let required = |name: &str| match get(name) {
            Some(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
            other => Err(WebError::invalid(InvalidInput::new(name, other.unwrap_or_default(), "required"))),
        };
        let text = get("action").unwrap_or_default();
        let force = checkbox("force", get("force"))?;
        let record_anyway = checkbox("record_anyway", get("record_anyway"))?;
        let only_for = |name: &str, set: bool, action: &str| {
            if set && text != action {
                Err(InvalidInput::new(name, "1", format!("only a {action} takes it, not a {text}")))
            } else {
                Ok(())
            }
        };
        only_for("force", force, "skip")?;
        only_for("record_anyway", record_anyway, "cancel")?;
        let restart_from = get("restart_from").map(str::trim).filter(|t| !t.is_empty());
        if let Some(start) = restart_from
            && text != "reject"
        {
            return Err(
                InvalidInput::new("restart_from", start, format!("only a reject takes it, not a {text}")).into()
            );
        }
        if let Some(step) = get("step")
            && !["approve", "reject"].contains(&text)
        {
            return Err(
                InvalidInput::new("step", step, format!("only an approve or a reject takes it, not a {text}")).into()
            );
        }
        let action = match text {
            "rerun" => Action::Rerun { component: required("component")? },
            "cancel" => Action::Cancel { component: required("component")?, record_anyway },
            "skip" => Action::Skip { component: required("component")?, force },
            "restart" => match required("from")?.as_str() {
                FIRST_FAILURE => Action::Restart { from: RestartFrom::FirstFailure },
                start => Action::Restart { from: RestartFrom::Type(start.to_owned()) },
            },
            "prioritize" => {
                let value = get("priority").unwrap_or_default();
                let priority = value
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| InvalidInput::new("priority", value, "expected a whole number (higher runs first)"))?;
                Action::Prioritize { priority }
            }
            "approve" => Action::Approve { step: required("step")? },
            "reject" => Action::Reject { step: required("step")?, restart_from: restart_from.map(str::to_owned) },
            other => {
                return Err(InvalidInput::new(
                    "action",
                    other,
                    "expected rerun, restart, cancel, skip, prioritize, approve or reject",
                )
                .into());
            }
        };
        let confirm = match get("confirm") {
            None | Some("") => None,
            Some("1") => {
                let missing = |name: &str| {
                    InvalidInput::new(name, "", "required to confirm: the confirm form of a preview posts it")
                };
                let plan = get("plan").filter(|p| !p.is_empty()).ok_or_else(|| missing("plan"))?.to_owned();
                let key = get("key").filter(|k| !k.is_empty()).ok_or_else(|| missing("key"))?;
                let key = IdempotencyKey::new(key).map_err(|e| InvalidInput::new("key", key, e.reason))?;
                Some(Confirm { plan, key })
            }
            Some(other) => return Err(InvalidInput::new("confirm", other, "expected 1").into()),
        };
        // The operator module checks the reason (non-empty, bounded) in its own words.
        let reason = get("reason").unwrap_or_default().to_owned();
        let fields = fields
            .into_iter()
            .filter(|(name, _)| !["confirm", "plan", "key", "since"].contains(&name.as_str()))
            .collect();
        Ok(Posted { action, reason, confirm, fields })
    }

    /// The hidden fields of the confirm form: the action's, the plan, the preview's key.
    fn confirm_fields(&self, plan: &str, key: &IdempotencyKey) -> String {
        let mut fields = self.fields.clone();
        fields.extend([
            ("plan".to_owned(), plan.to_owned()),
            ("key".to_owned(), key.to_string()),
            ("confirm".into(), "1".into()),
        ]);
        hidden_fields(&fields)
    }

    /// The preview's address: `path`, the action's fields, then `extra` (the key, and for
    /// a bulk action `since`), each name and value percent-encoded.
    fn preview_url(&self, path: &str, extra: &[(&str, &str)]) -> String {
        let pairs = self.fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).chain(extra.iter().copied());
        let query: Vec<String> = pairs.map(|(name, value)| format!("{}={}", encode(name), encode(value))).collect();
        format!("{path}?{}", query.join("&"))
    }

    /// The address a preview asked for is sent to, once the fields that would not fit in
    /// one are refused as the preview would refuse them: the reason in the operator
    /// module's words (at most 2000 characters), any other field too long for an address.
    fn address(&self, path: &str, extra: &[(&str, &str)]) -> Result<String, WebError> {
        check_reason(&self.reason)?;
        let address = self.preview_url(path, extra);
        if address.len() > MAX_ADDRESS {
            let (name, value) = self.fields.iter().max_by_key(|(_, v)| v.len()).expect("an action field");
            let words = format!("too long for a preview's address ({} characters)", value.chars().count());
            return Err(InvalidInput::new(name.as_str(), "", words).into());
        }
        Ok(address)
    }
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

const ONE_FIELDS: &[&str] = &[
    "action",
    "component",
    "step",
    "from",
    "restart_from",
    "priority",
    "reason",
    "force",
    "record_anyway",
    "confirm",
    "plan",
    "key",
];
const BULK_FIELDS: &[&str] = &[
    "action",
    "component",
    "step",
    "from",
    "restart_from",
    "priority",
    "reason",
    "force",
    "record_anyway",
    "confirm",
    "plan",
    "key",
    "q",
    "order",
];
/// A preview's address: the action's fields and its key, never `confirm` or `plan`.
const ONE_QUERY: &[&str] =
    &["action", "component", "step", "from", "restart_from", "priority", "reason", "force", "record_anyway", "key"];
const BULK_QUERY: &[&str] = &[
    "action",
    "component",
    "step",
    "from",
    "restart_from",
    "priority",
    "reason",
    "force",
    "record_anyway",
    "key",
    "q",
    "order",
    "since",
];

/// How long a note for a preview shown again waits for its page (the redirect is
/// followed at once).
const NOTE_SECONDS: u64 = 120;
/// Longest note kept (the cookie, percent-encoded, must stay under 4 KiB).
const MAX_NOTE_CHARS: usize = 1_000;

/// The cookie that carries the note of a preview shown again to the one page with its key,
/// and only to the preview's path.
pub(super) fn note_cookie(secure: bool, path: &str, key: &str, note: Option<&str>) -> HeaderValue {
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

/// The note the request carries for the preview with `key`, if any, and the header that
/// clears it.
pub(super) fn take_note(
    headers: &HeaderMap,
    secure: bool,
    path: &str,
    key: &IdempotencyKey,
) -> Option<(String, HeaderValue)> {
    // Only a key this monitor made (hex) names a note.
    if !key.as_str().bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let note = cookie(headers, &format!("autocomp_note_{key}")).filter(|v| !v.is_empty()).and_then(decode)?;
    Some((note, note_cookie(secure, path, key.as_str(), None)))
}

/// A confirm that found the batch (or the batches) changed: nothing was done; off to a
/// fresh preview, with a new key, that says so.
fn shown_again(secure: bool, posted: &Posted, path: &str, since: Option<Seq>, note: &str) -> Response {
    let key = fresh_key();
    let since = since.map(|s| s.0.to_string());
    let mut extra = vec![("key", key.as_str())];
    extra.extend(since.as_deref().map(|s| ("since", s)));
    let mut response = Redirect::to(&posted.preview_url(path, &extra)).into_response();
    response.headers_mut().append(header::SET_COOKIE, note_cookie(secure, path, &key, Some(note)));
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

/// A preview page: 200, or 409 when a confirm that found the batch changed shows it
/// again and, as the batch is now, the action is refused.
fn preview_page(access: &Access, status: StatusCode, title: &str, body: &str) -> Response {
    let page = Page { title, nav: Nav::Batches, access: Some(access), flash: None, live: false, here: "/" };
    html_response(status, page.render(body))
}

fn changes_list(preview: &ActionPreview) -> String {
    if preview.changes.is_empty() {
        return "no component changes state".into();
    }
    let changes: Vec<String> =
        preview.changes.iter().map(|c| format!("{}: {}\u{a0}→\u{a0}{}", c.component, c.before, c.after)).collect();
    changes.join("; ")
}

/// The event it would append: `Reset (success) superseding Checked, Audited`,
/// `Checked (failure)`.
fn records(preview: &ActionPreview) -> String {
    let mut out = format!("{} ({})", preview.records, preview.outcome.as_str());
    if !preview.resets.is_empty() {
        let resets: Vec<&str> = preview.resets.iter().map(|t| t.as_str()).collect();
        w!(out, " superseding {}", resets.join(", "));
    }
    out
}

/// What an event recorded, as a preview names it: `Reset (success) superseding Checked`,
/// `Checked (failure, flagged cancelled)`.
fn recorded(event: &Event) -> String {
    let mut out = format!("{} ({}", event.event_type, event.outcome.as_str());
    for flag in ["cancelled", "skipped"] {
        if event.flag(flag) {
            w!(out, ", flagged {flag}");
        }
    }
    out.push(')');
    if !event.resets.is_empty() {
        let resets: Vec<&str> = event.resets.iter().map(|t| t.as_str()).collect();
        w!(out, " superseding {}", resets.join(", "));
    }
    out
}

/// The note above a preview shown again, if any.
pub(super) fn note_html(note: Option<&str>) -> String {
    note.map(|note| format!("<p class=\"error\" role=\"alert\">{}</p>\n", esc(note))).unwrap_or_default()
}

/// `POST /batches/{id}/act`: a preview asked for (the form checked as the preview checks
/// it) is answered 303 to its address, `GET /batches/{id}/act?...&key=K`, with a fresh key.
/// With `confirm=1` (and the preview's `plan` and `key`): perform and redirect to the batch,
/// or, if the batch changed since the preview, to a fresh preview that says so.
pub async fn one(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let back = format!("/batches/{}", encode(&id));
    let path = format!("{back}/act");
    let link = |e: WebError| e.with_link(&back, "Back to the batch");
    let posted = form_fields(form).and_then(|fields| Posted::parse(fields, ONE_FIELDS)).map_err(link)?;
    let Some(Confirm { plan, key }) = &posted.confirm else {
        let address = posted.address(&path, &[("key", &fresh_key())]).map_err(link)?;
        return Ok(Redirect::to(&address).into_response());
    };
    let operator = app.monitor.operator().acting_as(name);
    match operator.perform_confirmed(&id, &posted.action, &posted.reason, plan, key).await {
        Ok(report) => {
            tracing::info!(operator = name, batch = %report.batch, action = posted.action.name(), "{}", report.message);
            let mut response = Redirect::to(&back).into_response();
            let flash = flash_cookie(caller.secure, report.render().trim_end());
            response.headers_mut().append(header::SET_COOKIE, flash);
            Ok(response)
        }
        // The batch changed (or the key was used for something else): nothing was done; the
        // preview is shown again as the batch is now.
        Err(OperatorError::Refused(words)) => Ok(shown_again(caller.secure, &posted, &path, None, &words)),
        Err(e) => Err(link(e.into())),
    }
}

/// `GET /batches/{id}/act?action=...&reason=...&key=K`: the preview, reading only. If the
/// batch's log holds the key, its confirm was done: the page says what it recorded, and
/// offers nothing to confirm. Never stored by the browser.
pub async fn one_preview(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    no_store(one_preview_page(&app, &caller, &headers, &id, query).await)
}

async fn one_preview_page(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    id: &str,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let back = format!("/batches/{}", encode(id));
    let path = format!("{back}/act");
    let link = |e: WebError| e.with_link(&back, "Back to the batch");
    refuse_from_elsewhere(headers).map_err(link)?;
    let fields = query_fields(query).map_err(link)?;
    let posted = Posted::parse(fields.clone(), ONE_QUERY).map_err(link)?;
    let key = query_key(&fields).map_err(link)?;
    let operator = app.monitor.operator().acting_as(name);
    let title = format!("Preview: {} on {id}", posted.action.name());
    match operator.find_keyed(id, &posted.action, &posted.reason, &key).await {
        Ok(Some(report)) => return Ok(one_done(access, &posted, id, &back, &report)),
        Ok(None) => {}
        Err(e) => return Err(link(e.into())),
    }
    let note = take_note(headers, caller.secure, &path, &key);
    let clear = note.as_ref().map(|(_, clear)| clear.clone());
    let note = note.map(|(note, _)| note);
    let mut response = match operator.preview(id, &posted.action, &posted.reason).await {
        Ok(preview) => {
            let mut body = String::new();
            w!(
                body,
                "<h1>Preview: {} on <code>{}</code></h1>\n{}<p>{}</p>\n<p class=\"verdict\">Will record {}; {}.</p>\n\
                 <dl class=\"facts\"><dt>It will report</dt><dd>{}</dd><dt>Planned against</dt><dd>the batch as of seq \
                 {} (if it changes before you confirm, nothing is done and this preview is shown again)</dd>\
                 <dt>As</dt><dd><code>operator:{}</code></dd><dt>Reason</dt><dd>{}</dd></dl>\n<p>Nothing has been \
                 written yet.</p>\n<form method=\"post\" action=\"{}\">{}\
                 <p><button type=\"submit\">Confirm: {}</button> <a href=\"{}\">Cancel, back to the batch</a></p></form>\n",
                esc(posted.action.name()),
                esc(&preview.batch),
                note_html(note.as_deref()),
                esc(&preview.action),
                esc(records(&preview)),
                esc(changes_list(&preview)),
                esc(&preview.message),
                esc(preview.version),
                esc(name),
                esc(posted.reason.trim()),
                esc(&path),
                posted.confirm_fields(&preview.plan, &key),
                esc(posted.action.name()),
                esc(&back)
            );
            preview_page(access, StatusCode::OK, &title, &body)
        }
        // Shown again, and refused as the batch is now: say both.
        Err(OperatorError::Refused(words)) if note.is_some() => {
            let mut body = String::new();
            w!(
                body,
                "<h1>Preview: {} on <code>{}</code></h1>\n{}<p class=\"verdict\">As the batch is now, it is refused: \
                 {}</p>\n<p>Nothing was written. <a href=\"{}\">Back to the batch</a></p>\n",
                esc(posted.action.name()),
                esc(id),
                note_html(note.as_deref()),
                esc(words),
                esc(&back)
            );
            preview_page(access, StatusCode::CONFLICT, &title, &body)
        }
        Err(e) => link(e.into()).into_response(),
    };
    if let Some(clear) = clear {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    Ok(response)
}

/// A preview whose confirm was done: what it recorded, by whom and when; nothing to
/// confirm.
fn one_done(access: &Access, posted: &Posted, id: &str, back: &str, report: &ActionReport) -> Response {
    let mut body = String::new();
    w!(body, "<h1>Done: {} on <code>{}</code></h1>\n", esc(posted.action.name()), esc(id));
    if let Some(event) = &report.event {
        w!(
            body,
            "<p class=\"verdict\" role=\"status\">Done: {}, seq {}, by <code>{}</code> at {}.</p>\n\
             <dl class=\"facts\"><dt>Reason</dt><dd>{}</dd></dl>\n",
            esc(recorded(event)),
            esc(event.seq),
            esc(&event.agent),
            esc(event.at),
            esc(event.details.get("reason").and_then(serde_json::Value::as_str).unwrap_or_default())
        );
    }
    w!(
        body,
        "<p>This preview was confirmed, and what it recorded is above: it cannot be confirmed again, and nothing \
         more was written. To do it once more, preview it again from the batch's page.</p>\n\
         <p><a href=\"{}\">Back to the batch</a></p>\n",
        esc(back)
    );
    preview_page(access, StatusCode::OK, &format!("Done: {} on {id}", posted.action.name()), &body)
}

/// `POST /bulk`: the same over every batch of the filter (`Monitor::ids`). A preview asked
/// for is answered 303 to its address, `GET /bulk?...&key=K&since=S`. The confirm form
/// carries the preview's plan (the count and a digest of the ids, their versions and
/// planned writes); if the filter now selects other batches, or one of them changed, a new
/// preview is shown instead of acting on batches nobody looked at.
pub async fn bulk(
    State(app): State<Arc<App>>,
    caller: Caller,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let posted = Posted::parse(form_fields(form)?, BULK_FIELDS)?;
    let filter = Filter::parse(field(&posted.fields, "q").unwrap_or_default(), field(&posted.fields, "order"))?;
    let back = format!("/batches?{}", filter.url_query());
    let link = |e: WebError| e.with_link(&back, "Back to the batches");
    let operator = app.monitor.operator().acting_as(name);
    let Some(Confirm { plan, key }) = &posted.confirm else {
        posted.address("/bulk", &[]).map_err(link)?;
        let since = head(&operator).await.map_err(|e| link(e.into()))?;
        let address = posted.address("/bulk", &[("key", &fresh_key()), ("since", &since.0.to_string())]);
        return Ok(Redirect::to(&address.map_err(link)?).into_response());
    };
    let ids = app.monitor.ids(&filter).await.map_err(|e| link(e.into()))?;
    match operator.perform_many_confirmed(&ids, &posted.action, &posted.reason, plan, key).await {
        Ok(outcome) => {
            let summary = bulk_summary(posted.action.name(), ids.len(), &outcome);
            tracing::info!(operator = name, action = posted.action.name(), filter = %filter.query(), "{}", summary.lines().next().unwrap_or_default());
            let mut response = Redirect::to(&back).into_response();
            response.headers_mut().append(header::SET_COOKIE, flash_cookie(caller.secure, &summary));
            Ok(response)
        }
        Err(OperatorError::Refused(words)) => {
            let since = head(&operator).await.map_err(|e| link(e.into()))?;
            Ok(shown_again(caller.secure, &posted, "/bulk", Some(since), &words))
        }
        Err(e) => Err(link(e.into())),
    }
}

/// The store's head: a confirm of a preview asked for now writes after it, so its page looks
/// for its key among the batches changed since.
async fn head(operator: &Operator) -> Result<Seq, OperatorError> {
    Ok(operator.store().await?.head().await?)
}

/// `GET /bulk?q=...&action=...&key=K&since=S`: the bulk preview, reading only. If a batch
/// holds the key its confirm derives for it, the confirm was done: the page says on how
/// many batches, and offers nothing to confirm. Never stored by the browser.
pub async fn bulk_preview(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    no_store(bulk_preview_page(&app, &caller, &headers, query).await)
}

async fn bulk_preview_page(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    refuse_from_elsewhere(headers)?;
    let fields = query_fields(query)?;
    let posted = Posted::parse(fields.clone(), BULK_QUERY)?;
    let key = query_key(&fields)?;
    let since = field(&fields, "since").unwrap_or_default();
    let since = since.parse::<i64>().ok().filter(|s| *s >= 0).map(Seq).ok_or_else(|| {
        InvalidInput::new("since", since, "required: the store's seq when the preview was asked for, a whole number")
    })?;
    let filter = Filter::parse(field(&posted.fields, "q").unwrap_or_default(), field(&posted.fields, "order"))?;
    let back = format!("/batches?{}", filter.url_query());
    let link = |e: WebError| e.with_link(&back, "Back to the batches");
    let operator = app.monitor.operator().acting_as(name);
    let (mut done, unfinished) = keyed_since(&operator, since, &key).await.map_err(|e| link(e.into()))?;
    if !done.is_empty() {
        return Ok(bulk_done(access, &posted, &filter, &back, &done));
    }
    let ids = app.monitor.ids(&filter).await.map_err(|e| link(e.into()))?;
    if let Some(seen) = unfinished {
        let rest: Vec<BatchId> = ids.iter().filter(|id| !seen.contains(*id)).cloned().collect();
        done = operator.find_keyed_many(&rest, &key).await.map_err(|e| link(e.into()))?;
        if !done.is_empty() {
            return Ok(bulk_done(access, &posted, &filter, &back, &done));
        }
    }
    let note = take_note(headers, caller.secure, "/bulk", &key);
    let preview = operator.preview_many(&ids, &posted.action, &posted.reason).await.map_err(|e| link(e.into()))?;
    let mut response = bulk_preview_body(
        access,
        name,
        &posted,
        &key,
        &filter,
        &back,
        &preview,
        note.as_ref().map(|(n, _)| n.as_str()),
    );
    if let Some((_, clear)) = note {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    Ok(response)
}

/// Change-feed entries read per call when a bulk preview looks for its key.
const CHANGE_PAGE: usize = 1_000;

/// The events a bulk confirm with `key` recorded on the batches changed after `since` (the
/// store's head when the preview was asked for: the confirm wrote after it, perhaps taking
/// the batches out of the filter, as a rerun of `state:failed` does), up to
/// `MAX_BULK_BATCHES` batches; if more changed, also the batches looked at, so that the
/// caller looks at the filter's others too.
async fn keyed_since(
    operator: &Operator,
    since: Seq,
    key: &IdempotencyKey,
) -> Result<(Vec<Event>, Option<HashSet<BatchId>>), OperatorError> {
    let store = operator.store().await?;
    let mut seen: HashSet<BatchId> = HashSet::new();
    let mut done = Vec::new();
    let mut cursor = since;
    loop {
        let page = store.changes(cursor, CHANGE_PAGE).await?;
        let changed: Vec<BatchId> =
            page.changes.iter().map(|(_, id)| id.clone()).filter(|id| seen.insert(id.clone())).collect();
        done.extend(operator.find_keyed_many(&changed, key).await?);
        if page.changes.len() < CHANGE_PAGE || page.next >= page.head || page.next <= cursor {
            return Ok((done, None));
        }
        if seen.len() >= MAX_BULK_BATCHES {
            return Ok((done, Some(seen)));
        }
        cursor = page.next;
    }
}

/// A bulk preview whose confirm was done: on how many batches, the first of them; nothing
/// to confirm.
fn bulk_done(access: &Access, posted: &Posted, filter: &Filter, back: &str, done: &[Event]) -> Response {
    let mut body = String::new();
    let q = filter.query();
    let (first, last) = (done.iter().map(|e| e.seq).min(), done.iter().map(|e| e.seq).max());
    w!(body, "<h1>Done: {} on {} batches</h1>\n", esc(posted.action.name()), esc(done.len()));
    w!(
        body,
        "<p class=\"verdict\" role=\"status\">Done: this preview was confirmed, and its confirm recorded {} on {} \
         batches (seq {} to {}).</p>\n<dl class=\"facts\"><dt>Filter</dt><dd><a href=\"{}\"><code>{}</code></a></dd>\
         <dt>Reason</dt><dd>{}</dd></dl>\n",
        esc(posted.action.name()),
        esc(done.len()),
        esc(first.unwrap_or_default()),
        esc(last.unwrap_or_default()),
        esc(back),
        esc(if q.is_empty() { "every batch" } else { &q }),
        esc(posted.reason.trim())
    );
    let mut sample: Vec<&Event> = done.iter().collect();
    sample.sort_by_key(|e| e.seq);
    w!(
        body,
        "<table class=\"grid\"><caption>The first {} of the {} batches it was done on</caption><thead><tr>\
         <th scope=\"col\">Batch</th><th scope=\"col\">Recorded</th><th scope=\"col\">Seq</th><th scope=\"col\">By\
         </th><th scope=\"col\">At</th></tr></thead><tbody>\n",
        esc(sample.len().min(BULK_DONE_SAMPLE)),
        esc(done.len())
    );
    for event in sample.iter().take(BULK_DONE_SAMPLE) {
        w!(
            body,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td>{}</td><td><code>{}</code></td>\
             <td>{}</td></tr>\n",
            esc(encode(event.batch_id.as_str())),
            esc(&event.batch_id),
            esc(recorded(event)),
            esc(event.seq),
            esc(&event.agent),
            esc(event.at)
        );
    }
    body.push_str("</tbody></table>\n");
    w!(
        body,
        "<p>It cannot be confirmed again, and nothing more was written. To do it once more, preview it again from \
         the batches.</p>\n<p><a href=\"{}\">Back to the batches</a></p>\n",
        esc(back)
    );
    preview_page(access, StatusCode::OK, &format!("Done: {} on {} batches", posted.action.name(), done.len()), &body)
}

/// How many batches a done bulk preview lists.
const BULK_DONE_SAMPLE: usize = 10;

#[allow(clippy::too_many_arguments)]
fn bulk_preview_body(
    access: &Access,
    name: &str,
    posted: &Posted,
    key: &IdempotencyKey,
    filter: &Filter,
    back: &str,
    preview: &BulkPreview,
    note: Option<&str>,
) -> Response {
    let mut body = String::new();
    let q = filter.query();
    w!(body, "<h1>Preview: {} on {} batches</h1>\n", esc(posted.action.name()), esc(preview.total));
    body.push_str(&note_html(note));
    let refused = preview.total - preview.applicable;
    w!(
        body,
        "<p>{}</p>\n<dl class=\"facts\"><dt>Filter</dt><dd><a href=\"{}\"><code>{}</code></a></dd>\
         <dt>Batches</dt><dd>{} selected: {} would be acted on, {} refused</dd>\
         <dt>As</dt><dd><code>operator:{}</code></dd><dt>Reason</dt><dd>{}</dd></dl>\n\
         <p>Nothing has been written yet. If the filter selects other batches, or one of them changes, before you \
         confirm, nothing is done and this preview is shown again.</p>\n",
        esc(posted.action.to_string()),
        esc(back),
        esc(if q.is_empty() { "every batch" } else { &q }),
        esc(preview.total),
        esc(preview.applicable),
        esc(refused),
        esc(name),
        esc(posted.reason.trim())
    );
    if !preview.sample.is_empty() {
        w!(
            body,
            "<table class=\"grid\"><caption>The first {} of {} batches it would act on</caption><thead><tr>\
             <th scope=\"col\">Batch</th><th scope=\"col\">Will record</th><th scope=\"col\">State changes</th>\
             <th scope=\"col\">It will report</th></tr></thead><tbody>\n",
            esc(preview.sample.len()),
            esc(preview.applicable)
        );
        for p in &preview.sample {
            w!(
                body,
                "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                esc(encode(p.batch.as_str())),
                esc(&p.batch),
                esc(records(p)),
                esc(changes_list(p)),
                esc(&p.message)
            );
        }
        body.push_str("</tbody></table>\n");
    }
    body.push_str(&refusals_table(&preview.refused, refused));
    if preview.applicable > 0 {
        w!(
            body,
            "<form method=\"post\" action=\"/bulk\">{}<p><button type=\"submit\">Confirm: {} on {} batches</button> \
             <a href=\"{}\">Cancel, back to the batches</a></p></form>\n",
            posted.confirm_fields(&preview.plan, key),
            esc(posted.action.name()),
            esc(preview.applicable),
            esc(back)
        );
    } else {
        w!(body, "<p>Nothing to do. <a href=\"{}\">Back to the batches</a></p>\n", esc(back));
    }
    preview_page(
        access,
        StatusCode::OK,
        &format!("Preview: {} on {} batches", posted.action.name(), preview.total),
        &body,
    )
}

fn refusals_table(refused: &[(BatchId, String)], total: usize) -> String {
    let mut out = String::new();
    if refused.is_empty() {
        return out;
    }
    w!(
        out,
        "<table class=\"grid\"><caption>The first {} of {} refusals</caption><thead><tr><th scope=\"col\">Batch</th>\
         <th scope=\"col\">Why</th></tr></thead><tbody>\n",
        esc(refused.len()),
        esc(total)
    );
    for (id, words) in refused {
        w!(
            out,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td></tr>\n",
            esc(encode(id.as_str())),
            esc(id),
            esc(words)
        );
    }
    out.push_str("</tbody></table>\n");
    out
}

/// The outcome counts, what the first writes were, the first refusals and the error that
/// stopped it, if any.
fn bulk_summary(action: &str, total: usize, outcome: &BulkOutcome) -> String {
    let already = outcome.performed.iter().filter(|r| r.already_done).count();
    let written = outcome.performed.len() - already;
    let mut out = format!("{action} on {total} batches: {written} performed");
    if already > 0 {
        w!(out, ", {already} already done (nothing written for them)");
    }
    w!(out, ", {} refused", outcome.refused.len());
    if let Some((id, error)) = &outcome.stopped {
        let left = total.saturating_sub(outcome.performed.len() + outcome.refused.len());
        w!(out, ", stopped at {id} ({left} not attempted): {error}");
    }
    for report in outcome.performed.iter().take(3) {
        w!(out, "\n  {}", report.message);
    }
    if outcome.performed.len() > 3 {
        w!(out, "\n  ... and {} more", outcome.performed.len() - 3);
    }
    for (id, words) in outcome.refused.iter().take(3) {
        w!(out, "\n  refused {id}: {words}");
    }
    if outcome.refused.len() > 3 {
        w!(out, "\n  ... and {} more refusals", outcome.refused.len() - 3);
    }
    out
}
