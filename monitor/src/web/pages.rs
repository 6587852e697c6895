//! The read pages rendered from `data`: the overview (with the pipeline's steering), the
//! batch matrix, one batch (with the decision at a human step it waits at, beside its
//! evidence) and the batches waiting for a person; and the ETag every one of them carries:
//! the store's head (which every write and every steering change moves) plus what else the
//! page depends on, so a poll of an unchanged page costs one head read and answers 304.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use autocomp_model::{Batch, ComponentState, Event, InvalidInput, Outcome, RESULT_KEY, Seq, Timestamp};
use autocomp_ops::operator::{Explanation, OperatorError, describe_lock, report_summary, size_text};
use autocomp_sboi::PageKey;
use autocomp_store::{BatchHead, LogPage};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::access::Access;
use super::actions::{Target, action_forms, decision_forms};
use super::auth;
use super::gate::Caller;
use super::html::{Nav, age, check, code_spans, esc, hold_badge, json_block, state_badge, time, w};
use super::{App, WebError, assets, here, respond, respond_with, steering};
use crate::data::Matrix;
use crate::filter::{Filter, StateFilter, encode, format_after, parse_after};

/// The query of the list, its exports and its bulk actions.
#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    pub q: Option<String>,
    pub order: Option<String>,
    pub after: Option<String>,
}

impl ListQuery {
    pub fn from(query: Result<Query<ListQuery>, QueryRejection>) -> Result<ListQuery, WebError> {
        query
            .map(|Query(q)| q)
            .map_err(|e| WebError::invalid(autocomp_model::InvalidInput::new("query string", "", e.body_text())))
    }

    pub fn filter(&self) -> Result<Filter, WebError> {
        Ok(Filter::parse(self.q.as_deref().unwrap_or_default(), self.order.as_deref())?)
    }

    pub fn after(&self) -> Result<Option<PageKey>, WebError> {
        match self.after.as_deref() {
            None | Some("") => Ok(None),
            Some(text) => Ok(Some(parse_after(text)?)),
        }
    }
}

/// Answers 304 when the browser's copy of the page is current, and tags fresh pages.
///
/// The tag covers the store's head (every write moves it), the path and query, who is
/// asking (the page shows their forms), the assets' version and the current minute: some of
/// what a page shows moves without a write (a batch becoming overdue, locks, ages), so an
/// idle page still refreshes once a minute. A page carrying a one-time message is never
/// tagged.
pub async fn etag(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if super::sessions::cookie(request.headers(), auth::FLASH_COOKIE).is_some_and(|v| !v.is_empty()) {
        return next.run(request).await;
    }
    let Ok(head) = app.monitor.head().await else {
        // The page itself reports the outage.
        return next.run(request).await;
    };
    let access = Caller::of(request.extensions()).access;
    let minute = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60);
    let mut hasher = Sha256::new();
    for part in [
        request.uri().path_and_query().map_or("", |pq| pq.as_str()),
        &access.key(),
        &assets::version(),
        &minute.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update(b"\0");
    }
    let tag = format!("\"{head}-{}\"", &hex::encode(hasher.finalize())[..16]);
    let tag_value = HeaderValue::from_str(&tag).expect("digits, hex and quotes");
    let matches = request
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|candidate| {
            let candidate = candidate.trim();
            candidate == "*" || candidate.trim_start_matches("W/") == tag
        });
    if matches {
        return (
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, tag_value), (header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"))],
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::OK {
        response.headers_mut().insert(header::ETAG, tag_value);
    }
    response
}

pub async fn overview(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, WebError> {
    let overview = app.monitor.overview().await?;
    let needs = app.monitor.needs(&overview).await?;
    let mut body = String::from("<h1>Overview</h1>\n");
    // What a person has to act on comes first; the counts it was drawn from follow.
    body.push_str(&super::needs::section(&needs));
    w!(
        body,
        "<p>{} batches in the store; store head seq {}. A batch is <em>overdue</em> when ready longer than its \
         component's <code>overdue_after</code> (default {}) or working longer than its <code>max_runtime</code>.</p>\n",
        esc(overview.batches),
        esc(overview.head),
        esc(humantime::format_duration(app.monitor.settings().ready_overdue_after))
    );
    if overview.rows.is_empty() {
        body.push_str("<p>No component has run a pass against this store yet: the pipeline is empty.</p>\n");
        return Ok(respond(&headers, &caller, "Overview", Nav::Overview, &here(&uri), &body));
    }
    body.push_str(
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"overview-caption\" tabindex=\"0\">\n\
         <table class=\"grid\">\n<caption id=\"overview-caption\">Batches per component and state \
         (each count lists its batches)</caption>\n<thead><tr><th scope=\"col\">Component</th>\
         <th scope=\"col\">Records</th>",
    );
    for state in StateFilter::ALL {
        // The batches in this state at any component.
        w!(
            body,
            "<th scope=\"col\" class=\"num\"><a href=\"/batches?{}\" title=\"the batches {} at any component\">{}</a></th>",
            esc(Filter { state: Some(state), ..Filter::default() }.url_query()),
            esc(state.as_str()),
            esc(state.as_str())
        );
    }
    body.push_str(
        "<th scope=\"col\" class=\"num\">Total</th><th scope=\"col\">Oldest ready (or waiting for a person) since</th>\
         <th scope=\"col\">Hosts (last pass)</th><th scope=\"col\">Last seen</th></tr></thead>\n<tbody>\n",
    );
    for row in &overview.rows {
        let component = &row.component;
        let name = component.name();
        w!(
            body,
            "<tr><th scope=\"row\"><a href=\"/batches?{}\">{}</a>",
            esc(Filter { component: Some(name.clone()), ..Filter::default() }.url_query()),
            esc(name)
        );
        if component.descriptor.manual {
            body.push_str(" <small>(human step)</small>");
        }
        if let Some(hold) = overview.steering.hold_of(name) {
            w!(body, "<br><a href=\"#steering\">{}</a>", hold_badge(hold.kind));
        }
        w!(body, "</th><td><code>{}</code></td>", esc(&component.descriptor.event_type));
        let mut total = 0;
        for (state, count) in &row.counts {
            if *state != StateFilter::Overdue {
                total += count;
            }
            let class = if *count == 0 { "num zero" } else { "num" };
            w!(
                body,
                "<td class=\"{class}\"><a href=\"/batches?{}\" aria-label=\"{} batches {} for {}\">{}</a></td>",
                esc(Filter::for_state(name, *state).url_query()),
                esc(count),
                esc(state.as_str()),
                esc(name),
                esc(count)
            );
        }
        w!(body, "<td class=\"num\">{}</td>", esc(total));
        match row.oldest_ready {
            Some(at) => w!(body, "<td>{} ({} ago)</td>", time(at), esc(age(overview.now.since(at)))),
            None => body.push_str("<td>–</td>"),
        }
        body.push_str("<td>");
        if component.hosts.is_empty() {
            body.push_str("none");
        }
        for (i, host) in component.hosts.iter().enumerate() {
            let outcome = if host.running() {
                "running".to_owned()
            } else {
                host.outcome.map_or("–".to_owned(), |o| o.as_str().to_owned())
            };
            w!(
                body,
                "{}{} ({}, {})",
                if i > 0 { "<br>" } else { "" },
                esc(&host.host),
                esc(outcome),
                esc(&host.version)
            );
        }
        body.push_str("</td>");
        match component.last_seen() {
            Some(at) => w!(body, "<td>{} ago<br><small>{}</small></td>", esc(age(overview.now.since(at))), time(at)),
            None => body.push_str("<td>never</td>"),
        }
        body.push_str("</tr>\n");
    }
    body.push_str("</tbody></table></div>\n");
    body.push_str(&super::graph::svg(&overview));
    body.push_str(&steering::section(&caller.access, &overview, &here(&uri)));
    Ok(respond(&headers, &caller, "Overview", Nav::Overview, &here(&uri), &body))
}

pub async fn batches(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let query = ListQuery::from(query)?;
    let after = query.after()?;
    let q = query.q.clone().unwrap_or_default();
    // A filter the monitor cannot apply (a bad term, an unknown component) is shown beside
    // the box that still holds it, not on a page of its own.
    let applied = match Filter::parse(&q, query.order.as_deref()) {
        Ok(filter) => match app.monitor.matrix(&filter, after).await {
            Ok(matrix) => Ok((filter, matrix)),
            Err(OperatorError::Input(input)) => Err(input),
            Err(error) => return Err(error.into()),
        },
        Err(input) => Err(input),
    };
    let (filter, mut matrix) = match applied {
        Ok(applied) => applied,
        Err(input) => {
            let mut body = String::from("<h1>Batches</h1>\n");
            body.push_str(&filter_form(&q, query.order.as_deref().unwrap_or_default(), Some(&input)));
            body.push_str("<p>Nothing is listed until the filter is fixed. Nothing was changed.</p>\n");
            let (status, here) = (StatusCode::BAD_REQUEST, here(&uri));
            return Ok(respond_with(status, &headers, &caller, "Batches: bad filter", Nav::Batches, &here, &body));
        }
    };
    app.monitor.failure_summaries(&mut matrix).await?;
    let mut body = String::from("<h1>Batches</h1>\n");
    body.push_str(&filter_form(&q, order_name(&filter), None));
    body.push_str(&matrix_table(&filter, after, &matrix));
    let url_query = filter.url_query();
    if after.is_some() || matrix.next.is_some() {
        body.push_str("<nav class=\"pager\" aria-label=\"Pages\"><p>");
        if after.is_some() {
            w!(body, "<a href=\"/batches?{}\">First page</a> ", esc(&url_query));
        }
        if let Some(next) = matrix.next {
            w!(
                body,
                "<a href=\"/batches?{}&amp;after={}\" rel=\"next\">Next page</a>",
                esc(&url_query),
                esc(encode(&format_after(next)))
            );
        }
        body.push_str("</p></nav>\n");
    }
    w!(
        body,
        "<p>Export every batch of this filter: <a href=\"/batches.csv?{0}\" download>CSV</a>, \
         <a href=\"/batches.ndjson?{0}\" download>NDJSON</a>.</p>\n",
        esc(&url_query)
    );
    if matrix.total > 0 {
        let components: Vec<String> = matrix.components.iter().map(|c| c.to_string()).collect();
        let types: Vec<String> = if caller.access.may_act() {
            app.monitor.pipeline().await?.iter().map(|step| step.event_type().to_string()).collect()
        } else {
            Vec::new()
        };
        let target = Target::Bulk { filter: &filter, total: matrix.total };
        w!(
            body,
            "<details class=\"bulk\" id=\"bulk-actions\"><summary>Act on all {} batches of this filter</summary>\n{}</details>\n",
            esc(matrix.total),
            action_forms(&caller.access, &target, &components, &types, None, None, &here(&uri))
        );
    }
    let title = if q.trim().is_empty() { "Batches".to_owned() } else { format!("Batches: {}", q.trim()) };
    Ok(respond(&headers, &caller, &title, Nav::Batches, &here(&uri), &body))
}

/// The filter box holding `q` (as typed), the order, and `error` beside them when the
/// filter could not be applied.
fn filter_form(q: &str, order: &str, error: Option<&InvalidInput>) -> String {
    let mut out = String::new();
    let invalid = |on_order: bool| match error {
        Some(input) if (input.field == "order") == on_order => " aria-invalid=\"true\"",
        _ => "",
    };
    let described = if error.is_some() { "filter-error filter-help" } else { "filter-help" };
    w!(
        out,
        "<form method=\"get\" action=\"/batches\" class=\"filter\" role=\"search\">\
         <p><label for=\"filter-q\">Filter</label>\
         <input id=\"filter-q\" name=\"q\" value=\"{}\" size=\"50\" aria-describedby=\"{described}\"{}> \
         <label for=\"filter-order\">Order</label>\
         <select id=\"filter-order\" name=\"order\"{}{}>",
        esc(q),
        invalid(false),
        if error.is_some() { " aria-describedby=\"filter-error\"" } else { "" },
        invalid(true)
    );
    for (value, label) in [("oldest", "oldest first"), ("priority", "highest priority first")] {
        let selected = if value == order { " selected" } else { "" };
        w!(out, "<option value=\"{}\"{selected}>{}</option>", esc(value), esc(label));
    }
    out.push_str("</select> <button type=\"submit\">Apply</button></p>");
    if let Some(input) = error {
        w!(
            out,
            "<p id=\"filter-error\" class=\"error\" role=\"alert\">Not applied: <code>{}</code> <code>{}</code>: {}</p>",
            esc(&input.field),
            esc(&input.value),
            code_spans(&input.reason)
        );
    }
    let states: Vec<&str> = StateFilter::ALL.iter().map(|state| state.as_str()).collect();
    w!(
        out,
        "<p id=\"filter-help\" class=\"help\">Terms: <code>component:NAME</code>, <code>state:STATE</code> \
         ({}; with <code>component:</code> that component's state, without it the state at any component), \
         <code>type:TYPE</code>, <code>priority:N</code>, <code>priority:&gt;=N</code>, <code>priority:&lt;=N</code>, \
         and a bare word for an id prefix.</p></form>\n",
        esc(states.join(", "))
    );
    out
}

fn order_name(filter: &Filter) -> &'static str {
    match filter.order {
        autocomp_sboi::PageOrder::Priority => "priority",
        _ => "oldest",
    }
}

fn matrix_table(filter: &Filter, after: Option<PageKey>, matrix: &Matrix) -> String {
    let mut out = String::new();
    let q = filter.query();
    let described = if q.is_empty() { "every batch".to_owned() } else { q };
    w!(
        out,
        "<p><strong>{}</strong> batches match <code>{}</code>{}.</p>\n",
        esc(matrix.total),
        esc(&described),
        if after.is_some() { " (a later page)" } else { "" }
    );
    if matrix.rows.is_empty() {
        out.push_str("<p>No batches on this page.</p>\n");
        return out;
    }
    w!(
        out,
        "<p class=\"help\">Keys: <kbd>j</kbd> and <kbd>k</kbd> move between batches.</p>\n\
         <div class=\"scroll\" role=\"region\" aria-labelledby=\"matrix-caption\" tabindex=\"0\">\n\
         <table class=\"grid matrix\">\n<caption id=\"matrix-caption\">{} of {} batches, {}, each component's \
         state</caption>\n<thead><tr><th scope=\"col\">Batch</th><th scope=\"col\">Type</th>\
         <th scope=\"col\" class=\"num\">Priority</th><th scope=\"col\" class=\"num duration\" \
         title=\"from its creation to its last activity\">In pipeline</th>",
        esc(matrix.rows.len()),
        esc(matrix.total),
        esc(match filter.order {
            autocomp_sboi::PageOrder::Priority => "highest priority first",
            _ => "oldest first",
        })
    );
    for component in &matrix.components {
        w!(out, "<th scope=\"col\">{}</th>", esc(component));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &matrix.rows {
        let batch = &row.batch;
        w!(
            out,
            "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td class=\"num\">{}</td>",
            esc(encode(batch.id.as_str())),
            esc(&batch.id),
            esc(&batch.batch_type),
            esc(batch.priority)
        );
        let last = batch.listing.summary.last_activity;
        w!(
            out,
            "<td class=\"num duration\" title=\"created {}, last activity {} (UTC): {}\">{}</td>",
            esc(batch.created_at),
            esc(last),
            esc(age(last.since(batch.created_at))),
            esc(short_age(last.since(batch.created_at)))
        );
        for cell in &row.cells {
            let overdue = if cell.overdue { " overdue-cell" } else { "" };
            w!(out, "<td class=\"cell{overdue}\">{}", state_badge(cell.state, cell.overdue));
            if let Some(failure) = &cell.failure {
                w!(out, "<br><small class=\"failure-summary\">{}</small>", esc(failure));
            }
            out.push_str("</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// A duration as `age` writes it (whole seconds, the model's `humantime` words), cut to its
/// two largest units: a list column stays narrow, and the cell's title has it exactly.
fn short_age(duration: std::time::Duration) -> String {
    age(duration).split(' ').take(2).collect::<Vec<_>>().join(" ")
}

/// The query of a batch's page: `before=SEQ` shows the events before that seq.
#[derive(Debug, Deserialize, Default)]
pub struct BatchQuery {
    pub before: Option<String>,
}

impl BatchQuery {
    fn before(query: Result<Query<BatchQuery>, QueryRejection>) -> Result<Option<Seq>, WebError> {
        let query = query
            .map(|Query(q)| q)
            .map_err(|e| WebError::invalid(autocomp_model::InvalidInput::new("query string", "", e.body_text())))?;
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
    body.push_str(&action_forms(
        &caller.access,
        &Target::One(&target),
        &components,
        &types,
        priority,
        preselect,
        &here(&uri),
    ));
    body.push_str(&metadata(head));
    body.push_str(&open_runs(head));
    body.push_str(&super::timeline::section(&app.monitor.operator().timeline(head).await?));
    body.push_str(&log(head, &page.log, before));
    // What the runs on this page of the log printed, an attempt per `<details>`.
    body.push_str(&super::output::section(&page.log.events));
    body.push_str("<h2 id=\"explanations\">Why each component is (not) ready</h2>\n");
    if page.explanations.is_empty() {
        body.push_str("<p>No component has run a pass against this store yet.</p>\n");
    }
    for explanation in &page.explanations {
        body.push_str(&explain(explanation));
    }
    let title = format!("Batch {}", head.id());
    Ok(respond(&headers, &caller, &title, Nav::Batches, &here(&uri), &body))
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
    out.push_str(&decision_forms(access, target, name, types, here));
    out.push_str("</section>\n");
    out
}

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
             at {0} (overdue after {3}). <a href=\"/batches?{4}\">All of them in the batch list</a>.</p>\n",
            esc(step),
            esc(&at.event_type),
            esc(at.total),
            esc(humantime::format_duration(at.overdue_after)),
            esc(all.url_query())
        );
        if at.batches.is_empty() {
            continue;
        }
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
                esc(age(waiting.now.since(b.since)))
            );
        }
        body.push_str("</tbody></table></div>\n");
    }
    Ok(respond(&headers, &caller, "Waiting for a person", Nav::Waiting, &here(&uri), &body))
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

/// The verdict first: each component whose effective result is a failure, in pipeline
/// order, with its report's summary and a way to the actions.
fn failures(explanations: &[Explanation]) -> String {
    let mut out = String::new();
    for e in explanations {
        let Some(failure) = e.result.as_ref().filter(|r| r.outcome == Outcome::Failure) else { continue };
        let notes = report_summary(failure);
        w!(
            out,
            "<p class=\"verdict\" id=\"failed-{1}\">{0} at <a href=\"#explain-{1}\">{1}</a>: <code>{2}</code> seq {3} \
             by {4} at {5}{6}{7} (<a href=\"#actions\">actions</a>).</p>\n",
            state_badge(e.state, false),
            esc(&e.component),
            esc(&failure.event_type),
            esc(failure.seq),
            esc(&failure.agent),
            time(failure.at),
            if notes.is_empty() { "" } else { ": " },
            esc(notes.join("; "))
        );
        // The end of what the failed run printed to stderr (or logged): usually the reason.
        out.push_str(&super::output::verdict_tail(failure));
    }
    out
}

fn states(explanations: &[Explanation]) -> String {
    if explanations.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<div class=\"scroll\" role=\"region\" aria-label=\"Each component's state\" tabindex=\"0\">\
         <table class=\"grid\"><caption>Each component's state</caption><thead><tr>\
         <th scope=\"col\">Component</th><th scope=\"col\">Records</th><th scope=\"col\">State</th>\
         <th scope=\"col\">Verdict</th></tr></thead><tbody>\n",
    );
    for e in explanations {
        w!(
            out,
            "<tr><th scope=\"row\"><a href=\"#explain-{}\">{}</a></th><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n",
            esc(&e.component),
            esc(&e.component),
            esc(&e.event_type),
            state_badge(e.state, false),
            esc(verdict(e))
        );
    }
    out.push_str("</tbody></table></div>\n");
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

/// Links to the pages of the log around this one, above the page (its events are oldest
/// first): older events (`?before=`), and back to the newest when this is not it.
fn log_pager(head: &BatchHead, log: &LogPage, before: Option<Seq>) -> String {
    if log.older.is_none() && before.is_none() {
        return String::new();
    }
    let path = format!("/batches/{}", encode(head.id().as_str()));
    let mut out = String::from("<nav class=\"pager\" aria-label=\"Pages of the log\"><p>");
    if let Some(older) = log.older {
        w!(out, "<a href=\"{}?before={}#log\" rel=\"prev\">Older events</a> ", esc(&path), esc(older));
    }
    if before.is_some() {
        w!(out, "<a href=\"{}#log\">Newest events</a>", esc(&path));
    }
    out.push_str("</p></nav>\n");
    out
}

fn log(head: &BatchHead, log: &LogPage, before: Option<Seq>) -> String {
    let mut out = String::new();
    w!(out, "<h2 id=\"log\">Log</h2>\n");
    if log.total == 0 {
        out.push_str("<p>No events yet: the batch waits for its first one.</p>\n");
        return out;
    }
    let pager = log_pager(head, log, before);
    if log.events.is_empty() {
        w!(out, "<p>No events before seq {} on this page.</p>\n", esc(before.unwrap_or_default()));
        out.push_str(&pager);
        return out;
    }
    let effective: Vec<Seq> = head.summary.effective.iter().map(|e| e.seq).collect();
    let which = if log.events.len() as u64 == log.total {
        format!("{} events, oldest first", log.total)
    } else {
        let (first, last) = (log.events[0].seq, log.events[log.events.len() - 1].seq);
        format!("events seq {first} to {last}, {} of {}, oldest first", log.events.len(), log.total)
    };
    out.push_str(&pager);
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"log-caption\" tabindex=\"0\">\n\
         <table class=\"grid log\"><caption id=\"log-caption\">Log: {} (append-only; \
         <span class=\"effective-mark\">effective</span> events are what triggers see)</caption>\n\
         <thead><tr><th scope=\"col\">Seq</th><th scope=\"col\">Time</th><th scope=\"col\">Type</th>\
         <th scope=\"col\">Outcome</th><th scope=\"col\">Agent</th><th scope=\"col\">Summary</th>\
         <th scope=\"col\">Report</th></tr></thead><tbody>\n",
        esc(which)
    );
    let path = format!("/batches/{}", encode(head.id().as_str()));
    for e in &log.events {
        let is_effective = effective.contains(&e.seq);
        w!(
            out,
            "<tr{}><th scope=\"row\">{}</th><td>{}</td><td><code>{}</code>{}</td><td class=\"outcome-{}\">{}</td>\
             <td>{}</td><td>{}</td><td>",
            if is_effective { " class=\"effective\"" } else { "" },
            esc(e.seq),
            time(e.at),
            esc(&e.event_type),
            if is_effective { " <span class=\"effective-mark\">effective</span>" } else { "" },
            esc(e.outcome.as_str()),
            esc(e.outcome.as_str()),
            esc(&e.agent),
            esc(report_summary(e).join("; "))
        );
        if let Some(bytes) = log.left_out(e.seq) {
            // Read by size: a page costs its events' heads, not their megabytes of details.
            w!(
                out,
                "<p class=\"left-out\">Its details, {}, are too large to show here: \
                 <a href=\"{}/events/{}\" download=\"event-{}.json\">the whole event (JSON)</a>.</p></td></tr>\n",
                esc(size_text(bytes)),
                esc(&path),
                esc(e.seq),
                esc(e.seq)
            );
            continue;
        }
        if let Some(result) = e.details.get(RESULT_KEY) {
            w!(
                out,
                "<details id=\"result-{}\" open><summary>Result</summary>{}</details>",
                esc(e.seq),
                json_block(result)
            );
        }
        // The run's output has a section of its own (below the log): not twice on the page.
        let mut details = e.details.clone();
        let had_output = details.as_object_mut().and_then(|d| d.remove(autocomp_model::OUTPUT_KEY)).is_some();
        w!(
            out,
            "<details id=\"report-{}\"><summary>Full report</summary>{}{}</details>",
            esc(e.seq),
            json_block(&details),
            if had_output {
                format!("<p>Its output: <a href=\"#output-{}\">under Run output</a>.</p>", esc(e.seq))
            } else {
                String::new()
            }
        );
        out.push_str("</td></tr>\n");
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// `checks`: each clause as written, whether it holds in the store and in the index.
fn clause_table<'c>(
    caption: &str,
    checks: impl ExactSizeIterator<Item = (&'c str, bool, Option<bool>)>,
    store: bool,
    index: Option<bool>,
) -> String {
    let mut out = String::new();
    if checks.len() == 0 {
        out.push_str("<p>The trigger has no clauses: every batch is ready.</p>\n");
        return out;
    }
    w!(
        out,
        "<div class=\"scroll\" role=\"region\" aria-label=\"{0}\" tabindex=\"0\">\
         <table class=\"grid clauses\"><caption>{0}</caption><thead><tr><th scope=\"col\">Clause</th>\
         <th scope=\"col\">Store</th><th scope=\"col\">Index</th></tr></thead><tbody>\n",
        esc(caption)
    );
    for (clause, holds_in_store, holds_in_index) in checks {
        w!(
            out,
            "<tr><th scope=\"row\"><code>{}</code></th><td>{}</td><td>{}</td></tr>\n",
            esc(clause),
            check(Some(holds_in_store)),
            check(holds_in_index)
        );
    }
    w!(
        out,
        "</tbody><tfoot><tr><th scope=\"row\">All clauses</th><td>{}</td><td>{}</td></tr></tfoot></table></div>\n",
        check(Some(store)),
        check(index)
    );
    out
}

/// The explanation's verdict; at a human step the batch is ready for, what that means.
fn verdict(e: &Explanation) -> String {
    if e.state == ComponentState::Person {
        return format!("waiting for a person: every clause holds; approve or reject it at {} (above)", e.component);
    }
    e.verdict()
}

fn explain(e: &Explanation) -> String {
    let mut out = String::new();
    w!(
        out,
        "<section class=\"explain\" aria-labelledby=\"explain-{0}\"><h3 id=\"explain-{0}\">{0} <small>records \
         <code>{1}</code></small> {2}</h3>\n<p class=\"verdict\">{3}</p>\n",
        esc(&e.component),
        esc(&e.event_type),
        state_badge(e.state, false),
        esc(verdict(e))
    );
    if let Some(refusal) = &e.refusal {
        w!(out, "<p>Not ready because of <code>{}</code>: {}</p>\n", esc(refusal.clause), esc(&refusal.reason));
    }
    if !e.held_up_by.is_empty() {
        // Back along the requires chain to what holds the batch up, nearest first.
        out.push_str("<ol class=\"held-up-by\" aria-label=\"Held up by\">\n");
        for cause in &e.held_up_by {
            w!(out, "<li>because {}</li>\n", esc(cause));
        }
        out.push_str("</ol>\n");
    }
    out.push_str(&clause_table(
        &format!("Trigger clauses of {} on {}, evaluated at {}", e.component, e.batch, e.as_of),
        e.clauses.iter().map(|c| (c.clause.as_str(), c.store, c.index)),
        e.ready_in_store,
        e.ready_in_index,
    ));
    if e.ready_in_index.is_none() {
        out.push_str(
            "<p>The index has no document for this batch (<code>autocomp reindex</code> if the store has it).</p>\n",
        );
    }
    if let Some(retry) = &e.retry {
        let window = if retry.opens_at <= e.as_of {
            format!("open since {}", retry.opens_at)
        } else {
            format!("opens at {} (in {})", retry.opens_at, age(retry.opens_at.since(e.as_of)))
        };
        w!(
            out,
            "<p>Retry of the transient failure seq {} at {}: retry_backoff {}, window {}.</p>\n",
            esc(retry.failure.seq),
            time(retry.failure.at),
            esc(humantime::format_duration(retry.backoff)),
            esc(window)
        );
        out.push_str(&clause_table(
            &format!("Retry clauses of {}", e.component),
            retry.clauses.iter().map(|c| (c.clause.as_str(), c.store, c.index)),
            retry.ready_in_store,
            retry.ready_in_index,
        ));
    }
    let result = match &e.result {
        Some(r) => format!("{} {} seq {} by {} at {}", r.event_type, r.outcome.as_str(), r.seq, r.agent, r.at),
        None => "none".into(),
    };
    let run = match &e.open_run {
        Some(run) => format!(
            "generation {} held by {} on {} pid {} since {}",
            run.generation, run.holder.agent, run.holder.host, run.holder.pid, run.started_at
        ),
        None => "none".into(),
    };
    let now = Timestamp::now();
    let lag = e.store_head.0.saturating_sub(e.index_cursor.0);
    w!(
        out,
        "<dl class=\"facts\"><dt>Result</dt><dd>{}</dd>\
         <dt>Failed attempts since the last reset</dt><dd>{} of max_attempts {}</dd>\
         <dt>Open run</dt><dd>{}</dd>\
         <dt>Batch lock <code>batch/{}/{}</code></dt><dd>{}</dd>\
         <dt>Poll lock <code>poll/{}</code></dt><dd>{}</dd>\
         <dt>Index</dt><dd>committed up to seq {}, store head seq {} (behind by {})</dd></dl>\n</section>\n",
        esc(result),
        esc(e.failed_attempts),
        esc(e.max_attempts),
        esc(run),
        esc(&e.component),
        esc(&e.batch),
        esc(describe_lock(e.batch_lock.as_ref(), now)),
        esc(&e.component),
        esc(describe_lock(e.poll_lock.as_ref(), now)),
        esc(e.index_cursor),
        esc(e.store_head),
        esc(lag)
    );
    out
}
