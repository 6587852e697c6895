//! `GET /`: the overview, a component x state grid of counts (each a link to its batches),
//! what needs a person first, the pipeline graph and the steering section.

use std::sync::Arc;

use autocomp_model::{ComponentState, RegisteredComponent};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, age, esc, hold_badge, time, w};
use super::respond::{here, respond};
use super::steering_section;
use crate::data::{Overview, OverviewRow};
use crate::filter::{Filter, StateFilter};

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
    body.push_str(&counts_table(&overview));
    body.push_str(&super::graph::svg(&overview));
    body.push_str(&steering_section::section(&caller.access, &overview, &here(&uri)));
    Ok(respond(&headers, &caller, "Overview", Nav::Overview, &here(&uri), &body))
}

/// The component x state grid: each count a link to its batches, each component's oldest
/// ready batch, its hosts and when it was last seen.
fn counts_table(overview: &Overview) -> String {
    let mut body = String::new();
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
        body.push_str(&component_row(overview, row));
    }
    body.push_str("</tbody></table></div>\n");
    body
}

/// One component's row of the grid.
fn component_row(overview: &Overview, row: &OverviewRow) -> String {
    let mut body = String::new();
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
        // A count that needs someone is coloured as its state's badge: failed, overdue, a
        // person's decision.
        let class = match state {
            _ if *count == 0 => "num zero",
            StateFilter::State(ComponentState::Failed) => "num count-failed",
            StateFilter::Overdue => "num count-overdue",
            StateFilter::State(ComponentState::Person) => "num count-person",
            _ => "num",
        };
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
    body.push_str(&hosts_cell(component));
    match component.last_seen() {
        Some(at) => w!(body, "<td>{} ago<br><small>{}</small></td>", esc(age(overview.now.since(at))), time(at)),
        None => body.push_str("<td>never</td>"),
    }
    body.push_str("</tr>\n");
    body
}

/// The hosts that ran the component's last passes: each with its outcome and version, and
/// which versions run where while its hosts are upgraded one at a time.
fn hosts_cell(component: &RegisteredComponent) -> String {
    let hosts = &component.hosts;
    let mut body = String::new();
    body.push_str("<td>");
    if hosts.is_empty() {
        body.push_str("none");
    }
    for (i, host) in hosts.iter().enumerate() {
        let outcome = if host.running() {
            "running".to_owned()
        } else {
            host.outcome.map_or("–".to_owned(), |o| o.as_str().to_owned())
        };
        w!(body, "{}{} ({}, {})", if i > 0 { "<br>" } else { "" }, esc(&host.host), esc(outcome), esc(&host.version));
    }
    if let Some(mixed) = component.mixed_versions() {
        w!(body, "<br><small class=\"warn\">mixed versions: {}</small>", esc(mixed));
    }
    body.push_str("</td>");
    body
}
