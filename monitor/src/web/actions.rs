//! The operator's actions on one batch from the browser: a preview of what an action would
//! do (`Operator::preview`), and only on the confirming POST the write itself
//! (`perform_confirmed`) as the signed-in operator, then a redirect (303) to the batch, whose
//! flash says what was written; the protocol is `confirm`'s. Input and refusals come back in
//! the operator module's own words. The decision at a human step (`approve`, `reject` with an
//! optional `restart_from`) is one of these actions.

use std::sync::Arc;

use autocomp_model::{BatchId, Event, IdempotencyKey};
use autocomp_ops::operator::{ActionPreview, ActionReport, OperatorError};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::action_input::{Carrier, Confirm, Posted};
use super::app::App;
use super::confirm::{
    self, Note, confirm_form, done_end, done_redirect, done_verdict, facts, form_fields, fresh_key, no_store, opening,
    query_fields, query_key, refuse_from_elsewhere, refused_now, shown_again,
};
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, w};
use crate::filter::encode;

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
    let posted = form_fields(form).and_then(|fields| Posted::parse(fields, Carrier::OneForm)).map_err(link)?;
    let Some(Confirm { plan, key }) = &posted.confirm else {
        let address = posted.address(&path, &[("key", &fresh_key())]).map_err(link)?;
        return Ok(Redirect::to(&address).into_response());
    };
    let operator = app.monitor.operator().acting_as(name);
    let batch = BatchId::new(id.as_str()).map_err(|e| link(e.into()))?;
    match operator.perform_confirmed(&batch, &posted.action, &posted.reason, plan, key).await {
        Ok(report) => {
            tracing::info!(operator = name, batch = %report.batch, action = posted.action.name(), "{}", report.message);
            Ok(done_redirect(caller.secure, &back, report.render().trim_end()))
        }
        // The batch changed (or the key was used for something else): nothing was done; the
        // preview is shown again as the batch is now.
        Err(OperatorError::Refused(words)) => {
            let key = fresh_key();
            Ok(shown_again(caller.secure, &path, &posted.preview_url(&path, &[("key", &key)]), &key, &words))
        }
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
    let posted = Posted::parse(fields.clone(), Carrier::OneQuery).map_err(link)?;
    let key = query_key(&fields).map_err(link)?;
    let operator = app.monitor.operator().acting_as(name);
    let batch = BatchId::new(id).map_err(|e| link(e.into()))?;
    match operator.find_keyed(&batch, &posted.action, &posted.reason, &key).await {
        Ok(Some(report)) => return Ok(one_done(access, &posted, id, &back, &report)),
        Ok(None) => {}
        Err(e) => return Err(link(e.into())),
    }
    let note = Note::take(headers, caller.secure, &path, key.as_str());
    let title = format!("Preview: {} on {id}", posted.action.name());
    let heading = format!("Preview: {} on <code>{}</code>", esc(posted.action.name()), esc(id));
    let response = match operator.preview(&batch, &posted.action, &posted.reason).await {
        Ok(preview) => {
            let shown = Shown { name, posted: &posted, key: &key, note: note.text() };
            confirm::page(access, Nav::Batches, StatusCode::OK, &title, &preview_body(&shown, &path, &back, &preview))
        }
        // Shown again, and refused as the batch is now: say both.
        Err(OperatorError::Refused(words)) if note.text().is_some() => {
            let body = refused_now(&heading, note.text(), "the batch is now", &words, (&back, "Back to the batch"));
            confirm::page(access, Nav::Batches, StatusCode::CONFLICT, &title, &body)
        }
        Err(e) => link(e.into()).into_response(),
    };
    Ok(note.cleared(response))
}

/// What a preview page is shown for: the name it is recorded as, the action, its key, and
/// the note of a preview shown again.
pub(super) struct Shown<'s> {
    pub(super) name: &'s str,
    pub(super) posted: &'s Posted,
    pub(super) key: &'s IdempotencyKey,
    pub(super) note: Option<&'s str>,
}

/// The preview of an action on one batch: what it will record and change, what it was
/// planned against, and the confirm form.
fn preview_body(shown: &Shown, path: &str, back: &str, preview: &ActionPreview) -> String {
    let posted = shown.posted;
    let heading = format!("Preview: {} on <code>{}</code>", esc(posted.action.name()), esc(&preview.batch));
    let mut body = opening(&heading, shown.note, &preview.action);
    w!(body, "<p class=\"verdict\">Will record {}; {}.</p>\n", esc(records(preview)), esc(changes_list(preview)));
    let mut planned = String::new();
    w!(
        planned,
        "<dt>It will report</dt><dd>{}</dd><dt>Planned against</dt><dd>the batch as of seq {} (if it changes before \
         you confirm, nothing is done and this preview is shown again)</dd>",
        esc(&preview.message),
        esc(preview.version)
    );
    body.push_str(&facts(&planned, shown.name, &posted.reason));
    body.push_str("<p>Nothing has been written yet.</p>\n");
    let hidden = posted.confirm_fields(&preview.plan, shown.key);
    body.push_str(&confirm_form(path, &hidden, posted.action.name(), back, "Cancel, back to the batch"));
    body
}

/// A preview whose confirm was done: what it recorded, by whom and when; nothing to
/// confirm.
fn one_done(access: &Access, posted: &Posted, id: &str, back: &str, report: &ActionReport) -> Response {
    let mut body = String::new();
    w!(body, "<h1>Done: {} on <code>{}</code></h1>\n", esc(posted.action.name()), esc(id));
    if let Some(event) = &report.event {
        let reason = event.details.get("reason").and_then(serde_json::Value::as_str).unwrap_or_default();
        let at = format!("seq {}", event.seq);
        body.push_str(&done_verdict(&recorded(event), &at, event.agent.as_ref(), &event.at.to_string(), reason));
    }
    body.push_str(&done_end("the batch's page", back, "Back to the batch"));
    let title = format!("Done: {} on {id}", posted.action.name());
    confirm::page(access, Nav::Batches, StatusCode::OK, &title, &body)
}

pub(super) fn changes_list(preview: &ActionPreview) -> String {
    if preview.changes.is_empty() {
        return "no component changes state".into();
    }
    let changes: Vec<String> =
        preview.changes.iter().map(|c| format!("{}: {}\u{a0}→\u{a0}{}", c.component, c.before, c.after)).collect();
    changes.join("; ")
}

/// The event it would append: `Reset (success) superseding Checked, Audited`,
/// `Checked (failure)`.
pub(super) fn records(preview: &ActionPreview) -> String {
    let mut out = format!("{} ({})", preview.records, preview.outcome.as_str());
    if !preview.resets.is_empty() {
        let resets: Vec<&str> = preview.resets.iter().map(|t| t.as_str()).collect();
        w!(out, " superseding {}", resets.join(", "));
    }
    out
}

/// What an event recorded, as a preview names it: `Reset (success) superseding Checked`,
/// `Checked (failure, flagged cancelled)`.
pub(super) fn recorded(event: &Event) -> String {
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
