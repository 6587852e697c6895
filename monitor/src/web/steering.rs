//! Steering the whole pipeline from the browser (admins only): pause, drain and resume a
//! component or the whole pipeline, size a pool, through the operator module's own
//! `preview_steer` and `steer`, recorded as the signed-in admin, by `confirm`'s protocol.
//! Operators and viewers are refused (403) before anything is read. The overview shows the
//! steering and the forms (`steering_section`).
//!
//! As for the batch actions: a form posts to `POST /steer` and is answered 303 to the
//! preview's address, `GET /steer?action=pause&component=c&reason=...&since=V&key=K`
//! (`since`: the steering state's version when the preview was asked for; `key`: 128 random
//! bits naming this preview, for the note of a preview shown again). The GET reads only,
//! checks its parameters as the POST checks its fields, needs the admin role, is refused when
//! another site's page sent the browser there, and is never stored. Its confirm form carries
//! `version`, the steering version the preview planned against: `steer` acts only if the
//! steering is still at it. A repeated confirm (a double click, a resubmitted form) finds the
//! change it made in the steering log and answers "already done", writing nothing; a confirm
//! that finds the steering changed otherwise writes nothing and is sent (303) to a fresh
//! preview that says so. Reached again after its confirm (Back), the preview finds its change
//! in the log after `since`, by the same admin with the same reason, and says it is done,
//! with nothing to confirm.

use std::sync::Arc;

use autocomp_model::{InvalidInput, SteeringEntry};
use autocomp_ops::operator::{Format, OperatorError, SteerAction, SteerPreview, check_reason};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::app::App;
use super::confirm::{
    self, Note, confirm_form, done_end, done_redirect, done_verdict, facts, field, form_fields, fresh_key, no_store,
    opening, query_fields, query_key, refuse_from_elsewhere, refused_now, shown_again,
};
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, hidden_fields, time, w};
use super::steer_input::{Carrier, PATH, Steer};
use crate::filter::encode;

/// Where a steering action comes from and goes back to.
pub(super) const BACK: &str = "/#steering";

/// `POST /steer`, admins only: a preview asked for is answered 303 to its address, with the
/// steering's version now and a fresh key. With `confirm=1` (and the preview's `version`):
/// steer and go back to the overview, whose one-time message says what was recorded (or that
/// a repeated confirm was already done); or, if the steering changed since the preview, to a
/// fresh preview that says so.
pub async fn steer(
    State(app): State<Arc<App>>,
    caller: Caller,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let name = caller.access.admin()?;
    let steer = Steer::parse(form_fields(form)?, Carrier::Form)?;
    let operator = app.monitor.operator().acting_as(name);
    let Some(version) = steer.version else {
        check_reason(&steer.reason)?;
        let since = operator.steering().await?.0.version;
        return Ok(Redirect::to(&steer.address(since, &fresh_key())?).into_response());
    };
    match operator.steer(&steer.action, &steer.reason, Some(version)).await {
        Ok(report) => {
            let words = report.render(Format::Text);
            tracing::info!(operator = name, action = steer.action.name(), "{}", report.message);
            Ok(done_redirect(caller.secure, BACK, words.trim_end()))
        }
        // The steering changed since the preview: nothing was done; a fresh preview says so.
        Err(OperatorError::Refused(words) | OperatorError::AlreadyInState(words)) => {
            let since = operator.steering().await?.0.version;
            let key = fresh_key();
            Ok(shown_again(caller.secure, PATH, &steer.address(since, &key)?, &key, &words))
        }
        Err(e) => Err(e.into()),
    }
}

/// `GET /steer?action=...&reason=...&since=V&key=K`: the preview, reading only; or, when the
/// steering log holds its change since `since`, that it was done. Never stored.
pub async fn steer_preview(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    no_store(steer_preview_page(&app, &caller, &headers, query).await)
}

async fn steer_preview_page(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.admin()?;
    refuse_from_elsewhere(headers)?;
    let fields = query_fields(query)?;
    let steer = Steer::parse(fields.clone(), Carrier::Query)?;
    let key = query_key(&fields)?;
    let since = field(&fields, "since").unwrap_or_default();
    let since = since.parse::<u64>().map_err(|_| {
        InvalidInput::new(
            "since",
            since,
            "required: the steering version when the preview was asked for, a whole number",
        )
    })?;
    let operator = app.monitor.operator().acting_as(name);
    let (_, log) = operator.steering().await?;
    if let Some(entry) = steer.done_in(&log, name, since) {
        return Ok(done_page(access, &steer, entry));
    }
    let note = Note::take(headers, caller.secure, PATH, key.as_str());
    let title = format!("Preview: {}", steer.title());
    let response = match operator.preview_steer(&steer.action, &steer.reason).await {
        Ok(preview) => {
            let body = preview_body(name, &steer, &preview, note.text());
            confirm::page(access, Nav::Overview, StatusCode::OK, &title, &body)
        }
        // Shown again, and refused as the steering is now: say both.
        Err(OperatorError::Refused(words) | OperatorError::AlreadyInState(words)) if note.text().is_some() => {
            let now = "the pipeline is steered now";
            let body = refused_now(&esc(&title).to_string(), note.text(), now, &words, (BACK, "Back to the overview"));
            confirm::page(access, Nav::Overview, StatusCode::CONFLICT, &title, &body)
        }
        Err(e) => WebError::from(e).into_response(),
    };
    Ok(note.cleared(response))
}

/// The preview of a steering action: what it would record, what it was planned against,
/// what runs now (a pause or drain) or would rerun, and the confirm form.
fn preview_body(name: &str, steer: &Steer, preview: &SteerPreview, note: Option<&str>) -> String {
    let title = format!("Preview: {}", steer.title());
    let mut body = opening(&esc(&title).to_string(), note, &preview.summary);
    w!(body, "<p class=\"verdict\">Will record: {}.</p>\n", esc(&preview.would));
    let mut planned = String::new();
    w!(
        planned,
        "<dt>Planned against</dt><dd>steering version {} (if the steering changes before you confirm, nothing is \
         done and this preview is shown again)</dd>",
        esc(preview.version)
    );
    body.push_str(&facts(&planned, name, &steer.reason));
    body.push_str(&affected(steer, preview));
    let mut fields = steer.fields.clone();
    fields.extend([("version".to_owned(), preview.version.to_string()), ("confirm".to_owned(), "1".to_owned())]);
    body.push_str("<p>Nothing has been written yet.</p>\n");
    body.push_str(&confirm_form(PATH, &hidden_fields(&fields), &steer.title(), BACK, "Cancel, back to the overview"));
    body
}

/// What a pause or drain leaves running, or what a resume would rerun.
fn affected(steer: &Steer, preview: &SteerPreview) -> String {
    let mut body = String::new();
    match &steer.action {
        SteerAction::Pause { .. } | SteerAction::Drain { .. } if preview.running.is_empty() => {
            body.push_str("<p>Nothing of it runs now.</p>\n");
        }
        SteerAction::Pause { .. } | SteerAction::Drain { .. } => {
            w!(
                body,
                "<div class=\"scroll\" role=\"region\" aria-label=\"Running now\" tabindex=\"0\"><table class=\"grid\"><caption>Running now: {} runs, which go on to their result</caption><thead><tr>\
                 <th scope=\"col\">Batch</th><th scope=\"col\">Component</th><th scope=\"col\">Held by</th>\
                 <th scope=\"col\">Since</th></tr></thead><tbody>\n",
                esc(preview.running.len())
            );
            for run in &preview.running {
                w!(
                    body,
                    "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td>{} on {} pid {}</td>\
                     <td>{}</td></tr>\n",
                    esc(encode(run.batch_id.as_str())),
                    esc(&run.batch_id),
                    esc(&run.component),
                    esc(&run.holder.agent),
                    esc(&run.holder.host),
                    esc(run.holder.pid),
                    time(run.started_at)
                );
            }
            body.push_str("</tbody></table></div>\n");
        }
        SteerAction::Resume { rerun_failed: true, .. } if preview.reruns.is_empty() => {
            body.push_str("<p>No batch to rerun: its breaker remembers no failed batch.</p>\n");
        }
        SteerAction::Resume { rerun_failed: true, .. } => {
            w!(
                body,
                "<div class=\"scroll\" role=\"region\" aria-label=\"Would rerun\" tabindex=\"0\"><table class=\"grid\"><caption>Would rerun {} batches, the ones that failed while its circuit was \
                 breaking</caption><thead><tr><th scope=\"col\">Batch</th></tr></thead><tbody>\n",
                esc(preview.reruns.len())
            );
            for id in &preview.reruns {
                w!(
                    body,
                    "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th></tr>\n",
                    esc(encode(id.as_str())),
                    esc(id)
                );
            }
            body.push_str("</tbody></table></div>\n");
        }
        _ => {}
    }
    body
}

/// A preview whose confirm was done: what it recorded, by whom and when; nothing to confirm.
fn done_page(access: &Access, steer: &Steer, entry: &SteeringEntry) -> Response {
    let title = format!("Done: {}", steer.title());
    let mut body = String::new();
    w!(body, "<h1>{}</h1>\n", esc(&title));
    let at = format!("steering version {}", entry.version);
    body.push_str(&done_verdict(&entry.said, &at, entry.by.as_ref(), &entry.at.to_string(), &entry.reason));
    body.push_str(&done_end("the overview", BACK, "Back to the overview"));
    confirm::page(access, Nav::Overview, StatusCode::OK, &title, &body)
}
