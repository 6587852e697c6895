//! `GET /batches/{id}`: one batch's page (its verdict, the decision at a human step it waits
//! at beside its evidence, the actions, metadata, open runs, timeline, a page of its log and
//! the runs' output), and `GET /batches/{id}/events/{seq}`, one event whole as JSON.

use std::sync::Arc;

use autocomp_model::{Batch, ComponentState, Event, InvalidInput, Outcome, RESULT_KEY, Seq};
use autocomp_ops::operator::{Explanation, OlderResult, OperatorError, report_summary, size_text};
use autocomp_store::BatchHead;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::access::Access;
use super::action_forms::{Choices, Target, action_forms, decision_forms};
use super::app::App;
use super::error::WebError;
use super::explain::{explain, failures, states};
use super::gate::Caller;
use super::html::{Nav, age, esc, json_block, state_badge, time, w};
use super::log::log;
use super::respond::{here, respond};

/// The query of a batch's page: `before=SEQ` shows the events before that seq.
#[derive(Debug, Deserialize, Default)]
pub struct BatchQuery {
    pub before: Option<String>,
}

impl BatchQuery {
    fn before(query: Result<Query<BatchQuery>, QueryRejection>) -> Result<Option<Seq>, WebError> {
        let query =
            query.map(|Query(q)| q).map_err(|e| WebError::unreadable("query string", e.status(), &e.body_text()))?;
        match query.before.as_deref() {
            None | Some("") => Ok(None),
            Some(text) => match text.parse::<i64>() {
                Ok(seq) if seq > 0 => Ok(Some(Seq(seq))),
                _ => Err(WebError::invalid(autocomp_model::InvalidInput::new(
                    "before",
                    text,
                    "not a seq: a page's \"Older events\" link gives one",
                ))),
            },
        }
    }
}

/// One event of a batch, whole, as JSON (a download): where a page of the log that left an
/// event's details out links to. 404 when the batch has no event with that seq.
pub async fn event(State(app): State<Arc<App>>, Path((id, seq)): Path<(String, String)>) -> Result<Response, WebError> {
    let batch = autocomp_model::BatchId::new(&id)?;
    let seq = match seq.parse::<i64>() {
        Ok(seq) if seq > 0 => Seq(seq),
        _ => return Err(WebError::invalid(InvalidInput::new("seq", seq, "not a seq: the log lists each event's"))),
    };
    let store = app.monitor.operator().store().await?;
    let found = autocomp_store::port::event_at(store.as_ref(), &batch, seq).await.map_err(OperatorError::from)?;
    let Some(event) = found else {
        let words = format!("Batch {batch} has no event with seq {seq}.");
        return Err(WebError::new(StatusCode::NOT_FOUND, "No such event", words));
    };
    let body =
        serde_json::to_vec_pretty(&event).map_err(|e| InvalidInput::new("event", seq.to_string(), e.to_string()))?;
    let disposition = format!("attachment; filename=\"event-{seq}.json\"");
    let disposition = HeaderValue::from_str(&disposition).expect("digits and ASCII");
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

pub async fn batch(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path(id): Path<String>,
    query: Result<Query<BatchQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let before = BatchQuery::before(query)?;
    let page = app.monitor.batch(&id, before).await?;
    let head = &page.head;
    let mut body = String::new();
    w!(body, "<h1>Batch <code>{}</code></h1>\n", esc(head.id()));
    body.push_str(&failures(&page.explanations));
    body.push_str(&older_results(&page.older_results));
    body.push_str(&summary(head));
    let types: Vec<String> = head.summary.effective.iter().map(|e| e.event_type.to_string()).collect();
    let target = without_log(head);
    // A human step it waits at: the evidence and the decision, first.
    for e in page.explanations.iter().filter(|e| e.state == ComponentState::Person) {
        body.push_str(&decision(&caller.access, head, &target, e, &page.explanations, &types, &here(&uri)));
    }
    body.push_str(&states(&page.explanations));
    // The actions beside the verdict, the failed component (the first in pipeline order
    // whose effective result is a failure) chosen in them.
    let failed = page.explanations.iter().find(|e| e.result.as_ref().is_some_and(|r| r.outcome == Outcome::Failure));
    let components: Vec<String> = page.explanations.iter().map(|e| e.component.to_string()).collect();
    body.push_str("<h2 id=\"actions\">Actions</h2>\n");
    let (priority, preselect) = (Some(head.summary.priority), failed.map(|e| e.component.as_str()));
    // A cancel starts on the component at work, if one is.
    let running = page.explanations.iter().find(|e| e.open_run.is_some()).map(|e| e.component.as_str());
    let choices = Choices { components: &components, types: &types, preselect, running };
    body.push_str(&action_forms(&caller.access, &Target::One(&target), &choices, priority, &here(&uri)));
    body.push_str(&metadata(head));
    body.push_str(&open_runs(head));
    // What the going runs printed so far: the page refreshes itself while one goes.
    body.push_str(&super::output::going_section(&head.open_runs, &page.saved_outputs, head.as_of));
    body.push_str(&super::timeline::section(&app.monitor.operator().timeline(head).await?));
    body.push_str(&log(head, &page.log, before));
    // What the runs on this page of the log printed, an attempt per `<details>`.
    body.push_str(&super::output::section(&page.log.events, &page.saved_outputs));
    body.push_str("<h2 id=\"explanations\">Why each component is (not) ready</h2>\n");
    if page.explanations.is_empty() {
        body.push_str("<p>No component has run a pass against this store yet.</p>\n");
    }
    for explanation in &page.explanations {
        body.push_str(&explain(explanation));
    }
    let title = format!("Batch {}", head.id());
    let mut response = respond(&headers, &caller, &title, Nav::Batches, &here(&uri), &body);
    if !head.open_runs.is_empty() {
        // A going run's output is saved without moving the store's head: the page is
        // asked for whole at each refresh while one goes, not answered 304.
        response.extensions_mut().insert(super::etag::Untagged);
    }
    Ok(response)
}

/// A human step the batch waits at: the effective results of the steps before it (what the
/// person decides on), each with its report's summary and its result, then the Approve and
/// Reject forms.
fn decision(
    access: &Access,
    head: &BatchHead,
    target: &Batch,
    step: &Explanation,
    explanations: &[Explanation],
    types: &[String],
    here: &str,
) -> String {
    let mut out = String::new();
    let name = step.component.as_str();
    w!(
        out,
        "<section class=\"decision\" id=\"decide-{0}\" aria-labelledby=\"decide-{0}-heading\">\
         <h2 id=\"decide-{0}-heading\">Waiting for a person at {0}</h2>\n<p>{1} <code>{2}</code> is a human step: \
         a person approves the batch (its steps after it may run) or rejects it. Decide on the evidence below, the \
         effective results of the steps before it.</p>\n",
        esc(name),
        state_badge(ComponentState::Person, false),
        esc(&step.event_type)
    );
    out.push_str(&evidence(head, step, explanations));
    out.push_str(&decision_forms(access, &Target::One(target), &[name.to_owned()], types, here));
    out.push_str("</section>\n");
    out
}

/// What the person decides on at `step`: the effective results of the steps before it,
/// each with its report's summary and its result.
fn evidence(head: &BatchHead, step: &Explanation, explanations: &[Explanation]) -> String {
    let mut out = String::new();
    let name = step.component.as_str();
    let mut evidence: Vec<&Event> = head.effective.iter().filter(|e| e.event_type != step.event_type).collect();
    evidence.sort_by_key(|e| e.seq);
    if evidence.is_empty() {
        out.push_str("<p>No step before it has recorded a result on this batch.</p>\n");
    } else {
        w!(
            out,
            "<div class=\"scroll\" role=\"region\" aria-label=\"Evidence for {0}\" tabindex=\"0\">\
             <table class=\"grid\"><caption>Evidence for {0}: the effective results before it</caption><thead><tr>\
             <th scope=\"col\">Step</th><th scope=\"col\">Result</th><th scope=\"col\">Outcome</th>\
             <th scope=\"col\">Seq</th><th scope=\"col\">By</th><th scope=\"col\">At</th><th scope=\"col\">Report</th>\
             </tr></thead><tbody>\n",
            esc(name)
        );
        for e in evidence {
            let by_step = explanations.iter().find(|x| x.event_type == e.event_type).map(|x| x.component.as_str());
            w!(
                out,
                "<tr><th scope=\"row\">{}</th><td><code>{}</code></td><td class=\"outcome-{}\">{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}",
                esc(by_step.unwrap_or("–")),
                esc(&e.event_type),
                esc(e.outcome.as_str()),
                esc(e.outcome.as_str()),
                esc(e.seq),
                esc(&e.agent),
                time(e.at),
                esc(report_summary(e).join("; "))
            );
            if let Some(result) = e.details.get(RESULT_KEY) {
                w!(
                    out,
                    "<details id=\"evidence-{}-{}\"><summary>Result</summary>{}</details>",
                    esc(name),
                    esc(e.seq),
                    json_block(result)
                );
            }
            out.push_str("</td></tr>\n");
        }
        out.push_str("</tbody></table></div>\n");
    }
    out
}

/// The batch as the action forms take it: they name it by its id; its log is not read.
fn without_log(head: &BatchHead) -> Batch {
    let s = &head.summary;
    Batch {
        id: s.id.clone(),
        batch_type: s.batch_type.clone(),
        priority: s.priority,
        metadata: head.metadata.clone(),
        created_seq: s.created_seq,
        modified_seq: s.modified_seq,
        changed_seq: s.changed_seq,
        created_at: head.created_at,
        modified_at: head.modified_at,
        events: Vec::new(),
        open_runs: head.open_runs.clone(),
        as_of: head.as_of,
    }
}

/// Effective results made under an older schema than their producers publish now, each with
/// the command that records it afresh (a restart from its type).
fn older_results(older: &[OlderResult]) -> String {
    if older.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<section class=\"older-results\" aria-labelledby=\"older-results-heading\">\
         <h2 id=\"older-results-heading\">Results made under an older schema</h2>\n<ul>\n",
    );
    for result in older {
        w!(
            out,
            "<li id=\"older-{}\">{}. Records it afresh: <code>{}</code></li>\n",
            esc(&result.event_type),
            esc(result.what()),
            esc(&result.next)
        );
    }
    out.push_str("</ul></section>\n");
    out
}

fn summary(head: &BatchHead) -> String {
    let s = &head.summary;
    let mut out = String::new();
    w!(
        out,
        "<table class=\"facts\"><caption>Batch</caption><tbody>\
         <tr><th scope=\"row\">Type</th><td>{}</td></tr>\
         <tr><th scope=\"row\">Priority</th><td>{}</td></tr>\
         <tr><th scope=\"row\">Location</th><td>{}</td></tr>\
         <tr><th scope=\"row\">Registered</th><td>seq {}, {}</td></tr>\
         <tr><th scope=\"row\">Last content change</th><td>seq {}, {}</td></tr>\
         <tr><th scope=\"row\">Stored</th><td>{} events, {} of details and metadata</td></tr>\
         <tr><th scope=\"row\">Read at</th><td>{} (store clock)</td></tr>\
         </tbody></table>\n",
        esc(&s.batch_type),
        esc(s.priority),
        head.location().map_or("<em>none</em>".to_owned(), |l| format!("<code>{}</code>", esc(l))),
        esc(s.created_seq),
        time(head.created_at),
        esc(s.modified_seq),
        time(head.modified_at),
        esc(head.event_count),
        esc(size_text(head.stored_bytes)),
        time(head.as_of)
    );
    out
}

fn metadata(head: &BatchHead) -> String {
    format!(
        "<h2>Metadata</h2>\n{}\n",
        if head.metadata.is_empty() {
            "<p>None.</p>".to_owned()
        } else {
            json_block(&Value::Object(head.metadata.clone()))
        }
    )
}

fn open_runs(head: &BatchHead) -> String {
    let mut out = String::from("<h2>Open runs</h2>\n");
    if head.open_runs.is_empty() {
        out.push_str("<p>None: no component is working on it.</p>\n");
        return out;
    }
    out.push_str(
        "<div class=\"scroll\" role=\"region\" aria-label=\"Open runs\" tabindex=\"0\">\
         <table class=\"grid\"><caption>Open runs</caption><thead><tr><th scope=\"col\">Component</th>\
         <th scope=\"col\">Generation</th><th scope=\"col\">Held by</th><th scope=\"col\">Since</th></tr></thead><tbody>\n",
    );
    for run in &head.open_runs {
        w!(
            out,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{} on {} pid {}</td><td>{} ({})</td></tr>\n",
            esc(&run.component),
            esc(run.generation),
            esc(&run.holder.agent),
            esc(&run.holder.host),
            esc(run.holder.pid),
            time(run.started_at),
            esc(age(head.as_of.since(run.started_at)))
        );
    }
    out.push_str("</tbody></table></div>\n");
    out
}
