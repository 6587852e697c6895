//! `GET /batches`: the batch matrix, a batch x component grid of states under the filter box
//! (a filter that cannot be applied is shown beside the box), paged, with the exports and
//! the bulk actions of the filter.

use std::sync::Arc;

use autocomp_model::{ComponentState, InvalidInput, Timestamp};
use autocomp_ops::operator::OperatorError;
use autocomp_sboi::PageKey;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::access::Access;
use super::action_forms::{Choices, Target, action_forms, decision_forms};
use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, age, code_spans, esc, state_badge, w};
use super::list_query::ListQuery;
use super::respond::{here, respond, respond_with};
use crate::data::{Matrix, MatrixRow};
use crate::filter::{Filter, StateFilter, encode, format_after};

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
    body.push_str(&pager(&url_query, after, &matrix));
    w!(
        body,
        "<p>Export every batch of this filter: <a href=\"/batches.csv?{0}\" download>CSV</a>, \
         <a href=\"/batches.ndjson?{0}\" download>NDJSON</a>.</p>\n",
        esc(&url_query)
    );
    if matrix.total > 0 {
        body.push_str(&bulk_actions(&app, &caller.access, &filter, &matrix, &here(&uri)).await?);
    }
    let title = if q.trim().is_empty() { "Batches".to_owned() } else { format!("Batches: {}", q.trim()) };
    Ok(respond(&headers, &caller, &title, Nav::Batches, &here(&uri), &body))
}

/// Links to the first and the next page of the list, when there is more than one.
fn pager(url_query: &str, after: Option<PageKey>, matrix: &Matrix) -> String {
    let mut body = String::new();
    if after.is_none() && matrix.next.is_none() {
        return body;
    }
    body.push_str("<nav class=\"pager\" aria-label=\"Pages\"><p>");
    if after.is_some() {
        w!(body, "<a href=\"/batches?{}\">First page</a> ", esc(url_query));
    }
    if let Some(next) = matrix.next {
        w!(
            body,
            "<a href=\"/batches?{}&amp;after={}\" rel=\"next\">Next page</a>",
            esc(url_query),
            esc(encode(&format_after(next)))
        );
    }
    body.push_str("</p></nav>\n");
    body
}

/// The bulk actions over every batch of the filter, folded away under the list.
async fn bulk_actions(
    app: &App,
    access: &Access,
    filter: &Filter,
    matrix: &Matrix,
    here: &str,
) -> Result<String, WebError> {
    let components: Vec<String> = matrix.components.iter().map(|c| c.to_string()).collect();
    let (types, human_steps): (Vec<String>, Vec<String>) = if access.may_act() {
        let pipeline = app.monitor.pipeline().await?;
        let types = pipeline.iter().map(|step| step.event_type().to_string()).collect();
        // A filter on one human step decides at that one.
        let human = pipeline
            .iter()
            .filter(|step| step.descriptor().manual)
            .filter(|step| filter.component.as_ref().is_none_or(|named| named == step.name()))
            .map(|step| step.name().to_string());
        (types, human.collect())
    } else {
        (Vec::new(), Vec::new())
    };
    let target = Target::Bulk { filter, total: matrix.total };
    let choices = Choices { components: &components, types: &types, preselect: None, running: None };
    let mut forms = action_forms(access, &target, &choices, None, here);
    // The decisions at the human steps, when the pipeline has any and the caller may act.
    if !human_steps.is_empty() && access.may_act() {
        w!(forms, "<h3>Decide at a human step</h3>\n{}", decision_forms(access, &target, &human_steps, &types, here));
    }
    // Opened when the filter is a human step's waiting batches: deciding them is why one comes.
    let waiting = filter.state == Some(StateFilter::State(ComponentState::Person)) && !human_steps.is_empty();
    let open = if waiting { " open" } else { "" };
    Ok(format!(
        "<details class=\"bulk\" id=\"bulk-actions\"{open}><summary>Act on all {} batches of this filter</summary>\n{}\
         </details>\n",
        esc(matrix.total),
        forms
    ))
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
         title=\"from its creation to now while a step works on it or waits (a person too), else to its last \
         activity\">In pipeline</th>",
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
        out.push_str(&matrix_row(row, matrix.now));
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// One batch of the matrix: its id, type, priority, time in the pipeline, and each
/// component's state (with a failure's summary).
fn matrix_row(row: &MatrixRow, now: Timestamp) -> String {
    let mut out = String::new();
    let batch = &row.batch;
    w!(
        out,
        "<tr><th scope=\"row\"><a href=\"/batches/{}\">{}</a></th><td>{}</td><td class=\"num\">{}</td>",
        esc(encode(batch.id.as_str())),
        esc(&batch.id),
        esc(&batch.batch_type),
        esc(batch.priority)
    );
    let (last, until) = (batch.listing.summary.last_activity, row.in_pipeline_until(now));
    w!(
        out,
        "<td class=\"num duration\" title=\"created {}, last activity {} (UTC): {}\">{}</td>",
        esc(batch.created_at),
        esc(last),
        esc(age(until.since(batch.created_at))),
        esc(short_age(until.since(batch.created_at)))
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
    out
}

/// A duration as `age` writes it (whole seconds, the model's `humantime` words), cut to its
/// two largest units: a list column stays narrow, and the cell's title has it exactly.
fn short_age(duration: std::time::Duration) -> String {
    age(duration).split(' ').take(2).collect::<Vec<_>>().join(" ")
}
