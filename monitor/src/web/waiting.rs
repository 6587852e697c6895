//! `GET /waiting`: the batches waiting for a person, per human step, the longest waiting
//! first.

use std::sync::Arc;

use autocomp_model::{ComponentState, Timestamp};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, age, esc, time, w};
use super::respond::{here, respond};
use crate::data::WaitingAt;
use crate::filter::{Filter, StateFilter, encode};

/// `GET /waiting`: every batch in state `person`, per human step, the longest waiting
/// first, with how long it has waited.
pub async fn waiting(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, WebError> {
    let waiting = app.monitor.waiting().await?;
    let mut body = String::from("<h1>Waiting for a person</h1>\n");
    if waiting.steps.is_empty() {
        body.push_str(
            "<p>The pipeline has no human step (<code>autocomp step add</code> declares one): no batch waits for a \
             person.</p>\n",
        );
    }
    for at in &waiting.steps {
        let step = at.step.as_str();
        let all = Filter::for_state(&at.step, StateFilter::State(ComponentState::Person));
        w!(
            body,
            "<h2 id=\"waiting-{0}\">{0} <small>records <code>{1}</code></small></h2>\n<p>{2} batches wait for a person \
             at {0} (overdue after {3}). <a href=\"/batches?{4}\">All of them in the batch list</a>; \
             <a href=\"/batches?{4}#bulk-actions\">approve or reject them all at once</a>.</p>\n",
            esc(step),
            esc(&at.event_type),
            esc(at.total),
            esc(humantime::format_duration(at.overdue_after)),
            esc(all.url_query())
        );
        if at.batches.is_empty() {
            continue;
        }
        body.push_str(&table(at, step, waiting.now));
    }
    Ok(respond(&headers, &caller, "Waiting for a person", Nav::Waiting, &here(&uri), &body))
}

/// The batches waiting at `step` (those the page lists of them), the longest waiting first,
/// with how long each has waited by `now`.
fn table(at: &WaitingAt, step: &str, now: Timestamp) -> String {
    let mut body = String::new();
    w!(
        body,
        "<div class=\"scroll\" role=\"region\" aria-label=\"Waiting at {2}\" tabindex=\"0\">\
         <table class=\"grid\"><caption>{0}{1} batches waiting at {2}, the longest waiting first</caption><thead><tr>\
         <th scope=\"col\">Batch</th><th scope=\"col\">Type</th><th scope=\"col\" class=\"num\">Priority</th>\
         <th scope=\"col\">Waiting since</th><th scope=\"col\">Waited</th></tr></thead><tbody>\n",
        if (at.batches.len() as u64) < at.total { "The first " } else { "" },
        esc(at.batches.len()),
        esc(step)
    );
    for b in &at.batches {
        let overdue = if b.overdue {
            " <span class=\"overdue\"><span class=\"icon\" aria-hidden=\"true\">⚠\u{fe0e}</span> overdue</span>"
        } else {
            ""
        };
        w!(
            body,
            "<tr><th scope=\"row\"><a href=\"/batches/{}#decide-{}\">{}</a></th><td>{}</td><td class=\"num\">{}</td>\
             <td>{}</td><td>{}{overdue}</td></tr>\n",
            esc(encode(b.id.as_str())),
            esc(step),
            esc(&b.id),
            esc(&b.batch_type),
            esc(b.priority),
            time(b.since),
            esc(age(now.since(b.since)))
        );
    }
    body.push_str("</tbody></table></div>\n");
    body
}
