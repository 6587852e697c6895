//! The operator's actions from the browser: the forms, a preview of what a POST would do
//! (`Operator::preview`, `preview_many`), and only on the confirming re-POST the write
//! itself (`perform`, `perform_many`) as the signed-in operator, then a redirect to a page
//! showing the result. Input and refusals come back in the operator module's own words.

use std::sync::Arc;

use autocomp_model::{Batch, BatchId, InvalidInput};
use autocomp_ops::operator::{Action, ActionPreview, BulkOutcome, BulkPreview, RestartFrom};
use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::auth::flash_cookie;
use super::gate::Caller;
use super::html::{Nav, Page, esc, hidden_fields, w};
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

/// The action forms, or why there are none (read only, not signed in). `components` and
/// `types` fill the selects; `priority` is the batch's current one.
pub fn action_forms(
    access: &Access,
    target: &Target,
    components: &[String],
    types: &[String],
    priority: Option<i32>,
    here: &str,
) -> String {
    let mut out = String::new();
    match access {
        Access::ReadOnly => {
            out.push_str("<p>This monitor is read only (started without accounts): no actions.</p>\n");
            return out;
        }
        Access::SignedOut => {
            w!(out, "<p><a href=\"/login?next={}\">Sign in</a> to act.</p>\n", esc(encode(here)));
            return out;
        }
        Access::SignedIn { name, role, .. } if !access.may_act() => {
            w!(
                out,
                "<p>Your account <strong>{}</strong> is a {}: it may read but not act on batches.</p>\n",
                esc(name),
                esc(role)
            );
            return out;
        }
        Access::SignedIn { .. } => {}
    }
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
        for (value, text) in options {
            w!(out, "<option value=\"{}\">{}</option>", esc(value), esc(text));
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

/// A posted action form, checked field by field.
struct Posted {
    action: Action,
    reason: String,
    confirm: bool,
    /// Every field but `confirm`, for the confirm form to post again.
    fields: Vec<(String, String)>,
}

impl Posted {
    fn parse(form: Result<Form<Vec<(String, String)>>, FormRejection>, known: &[&str]) -> Result<Posted, WebError> {
        let Form(fields) = form.map_err(|e| WebError::invalid(InvalidInput::new("form", "", e.body_text())))?;
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
        let get = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        let required = |name: &str| match get(name) {
            Some(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
            other => Err(WebError::invalid(InvalidInput::new(name, other.unwrap_or_default(), "required"))),
        };
        let text = get("action").unwrap_or_default();
        let action = match text {
            "rerun" => Action::Rerun { component: required("component")? },
            "cancel" => Action::Cancel { component: required("component")? },
            "skip" => Action::Skip { component: required("component")? },
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
            other => {
                return Err(
                    InvalidInput::new("action", other, "expected rerun, restart, cancel, skip or prioritize").into()
                );
            }
        };
        let confirm = match get("confirm") {
            None | Some("") => false,
            Some("1") => true,
            Some(other) => return Err(InvalidInput::new("confirm", other, "expected 1").into()),
        };
        // The operator module checks the reason (non-empty, bounded) in its own words.
        let reason = get("reason").unwrap_or_default().to_owned();
        let fields = fields.into_iter().filter(|(name, _)| name != "confirm").collect();
        Ok(Posted { action, reason, confirm, fields })
    }
}

const ONE_FIELDS: &[&str] = &["action", "component", "from", "priority", "reason", "confirm"];
const BULK_FIELDS: &[&str] = &["action", "component", "from", "priority", "reason", "confirm", "q", "order", "expect"];

fn preview_page(access: &Access, title: &str, body: &str) -> Response {
    let page = Page { title, nav: Nav::Batches, access: Some(access), flash: None, live: false, here: "/" };
    html_response(StatusCode::OK, page.render(body))
}

fn changes_list(preview: &ActionPreview) -> String {
    if preview.changes.is_empty() {
        return "no component changes state".into();
    }
    let changes: Vec<String> =
        preview.changes.iter().map(|c| format!("{}: {}\u{a0}→\u{a0}{}", c.component, c.before, c.after)).collect();
    changes.join("; ")
}

/// The event it would append: `Reset of Checked, Audited`, `Checked`.
fn records(preview: &ActionPreview) -> String {
    if preview.resets.is_empty() {
        preview.records.clone()
    } else {
        let resets: Vec<&str> = preview.resets.iter().map(|t| t.as_str()).collect();
        format!("{} of {}", preview.records, resets.join(", "))
    }
}

/// `POST /batches/{id}/act`: preview, or with `confirm=1` perform and redirect to the batch.
pub async fn one(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let back = format!("/batches/{}", encode(&id));
    let posted = Posted::parse(form, ONE_FIELDS).map_err(|e| e.with_link(&back, "Back to the batch"))?;
    let operator = app.monitor.operator().acting_as(name);
    if !posted.confirm {
        let preview = operator
            .preview(&id, &posted.action, &posted.reason)
            .await
            .map_err(|e| WebError::from(e).with_link(&back, "Back to the batch"))?;
        let mut body = String::new();
        w!(
            body,
            "<h1>Preview: {} on <code>{}</code></h1>\n<p>{}</p>\n<p class=\"verdict\">Will record {}; {}.</p>\n\
             <dl class=\"facts\"><dt>It will report</dt><dd>{}</dd><dt>As</dt><dd><code>operator:{}</code></dd>\
             <dt>Reason</dt><dd>{}</dd></dl>\n<p>Nothing has been written yet.</p>\n\
             <form method=\"post\" action=\"{}\">{}<input type=\"hidden\" name=\"confirm\" value=\"1\">\
             <p><button type=\"submit\">Confirm: {}</button> <a href=\"{}\">Cancel, back to the batch</a></p></form>\n",
            esc(posted.action.name()),
            esc(&preview.batch),
            esc(&preview.action),
            esc(records(&preview)),
            esc(changes_list(&preview)),
            esc(&preview.message),
            esc(name),
            esc(posted.reason.trim()),
            esc(format!("{back}/act")),
            hidden_fields(&posted.fields),
            esc(posted.action.name()),
            esc(&back)
        );
        return Ok(preview_page(access, &format!("Preview: {} on {id}", posted.action.name()), &body));
    }
    let report = operator
        .perform(&id, &posted.action, &posted.reason)
        .await
        .map_err(|e| WebError::from(e).with_link(&back, "Back to the batch"))?;
    tracing::info!(operator = name, batch = %report.batch, action = posted.action.name(), "{}", report.message);
    let mut response = Redirect::to(&back).into_response();
    response.headers_mut().append(header::SET_COOKIE, flash_cookie(caller.secure, report.render().trim_end()));
    Ok(response)
}

/// `POST /bulk`: the same over every batch of the filter (`Monitor::ids`). The confirm
/// form carries the count previewed; if the filter selects a different number by then,
/// the new preview is shown instead of acting on batches nobody looked at.
pub async fn bulk(
    State(app): State<Arc<App>>,
    caller: Caller,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, WebError> {
    let access = &caller.access;
    let name = access.writer()?;
    let posted = Posted::parse(form, BULK_FIELDS)?;
    let field = |key: &str| posted.fields.iter().find(|(n, _)| n == key).map(|(_, v)| v.as_str());
    let filter = Filter::parse(field("q").unwrap_or_default(), field("order"))?;
    let back = format!("/batches?{}", filter.url_query());
    let link = |e: WebError| e.with_link(&back, "Back to the batches");
    let ids = app.monitor.ids(&filter).await.map_err(|e| link(e.into()))?;
    let operator = app.monitor.operator().acting_as(name);
    let expected = match field("expect") {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<usize>().map_err(|_| link(InvalidInput::new("expect", text, "expected a count").into()))?,
        ),
    };
    let changed = expected.is_some_and(|n| n != ids.len());
    if !posted.confirm || changed {
        let preview = operator.preview_many(&ids, &posted.action, &posted.reason).await.map_err(|e| link(e.into()))?;
        let status = if changed { StatusCode::CONFLICT } else { StatusCode::OK };
        let note = match expected {
            Some(n) if changed => format!(
                "The filter selected {n} batches when you previewed and selects {} now: nothing was done. Review \
                 this preview and confirm again.",
                ids.len()
            ),
            _ => String::new(),
        };
        let mut response = bulk_preview(access, name, &posted, &filter, &back, &preview, &note);
        *response.status_mut() = status;
        return Ok(response);
    }
    let outcome = operator.perform_many(&ids, &posted.action, &posted.reason).await.map_err(|e| link(e.into()))?;
    let summary = bulk_summary(posted.action.name(), ids.len(), &outcome);
    tracing::info!(operator = name, action = posted.action.name(), filter = %filter.query(), "{}", summary.lines().next().unwrap_or_default());
    let mut response = Redirect::to(&back).into_response();
    response.headers_mut().append(header::SET_COOKIE, flash_cookie(caller.secure, &summary));
    Ok(response)
}

fn bulk_preview(
    access: &Access,
    name: &str,
    posted: &Posted,
    filter: &Filter,
    back: &str,
    preview: &BulkPreview,
    note: &str,
) -> Response {
    let mut body = String::new();
    let q = filter.query();
    w!(body, "<h1>Preview: {} on {} batches</h1>\n", esc(posted.action.name()), esc(preview.total));
    if !note.is_empty() {
        w!(body, "<p class=\"error\" role=\"alert\">{}</p>\n", esc(note));
    }
    let refused = preview.total - preview.applicable;
    w!(
        body,
        "<p>{}</p>\n<dl class=\"facts\"><dt>Filter</dt><dd><a href=\"{}\"><code>{}</code></a></dd>\
         <dt>Batches</dt><dd>{} selected: {} would be acted on, {} refused</dd>\
         <dt>As</dt><dd><code>operator:{}</code></dd><dt>Reason</dt><dd>{}</dd></dl>\n\
         <p>Nothing has been written yet.</p>\n",
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
            "<form method=\"post\" action=\"/bulk\">{}<input type=\"hidden\" name=\"expect\" value=\"{}\">\
             <input type=\"hidden\" name=\"confirm\" value=\"1\"><p><button type=\"submit\">Confirm: {} on {} \
             batches</button> <a href=\"{}\">Cancel, back to the batches</a></p></form>\n",
            hidden_fields(&posted.fields.iter().filter(|(n, _)| n != "expect").cloned().collect::<Vec<_>>()),
            esc(preview.total),
            esc(posted.action.name()),
            esc(preview.applicable),
            esc(back)
        );
    } else {
        w!(body, "<p>Nothing to do. <a href=\"{}\">Back to the batches</a></p>\n", esc(back));
    }
    preview_page(access, &format!("Preview: {} on {} batches", posted.action.name(), preview.total), &body)
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

/// The outcome counts, then the first refusals and the error that stopped it, if any.
fn bulk_summary(action: &str, total: usize, outcome: &BulkOutcome) -> String {
    let mut out = format!(
        "{action} on {total} batches: {} performed, {} refused",
        outcome.performed.len(),
        outcome.refused.len()
    );
    if let Some((id, error)) = &outcome.stopped {
        let left = total.saturating_sub(outcome.performed.len() + outcome.refused.len());
        w!(out, ", stopped at {id} ({left} not attempted): {error}");
    }
    for (id, words) in outcome.refused.iter().take(3) {
        w!(out, "\n  refused {id}: {words}");
    }
    if outcome.refused.len() > 3 {
        w!(out, "\n  ... and {} more refusals", outcome.refused.len() - 3);
    }
    out
}
