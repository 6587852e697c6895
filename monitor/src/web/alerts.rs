//! `GET /alerts`: what `autocomp alerts` would say now, one alert per row, in its own words
//! (`Alert::line`), each with a link to where it can be looked into: the batches ready too
//! long in the list, a run past its `max_runtime` on its batch's page, a hold in the
//! overview's steering section, anything else on the overview. The thresholds are the CLI's
//! defaults, with the monitor's own `ready_overdue_after` (as its overdue marks and metrics).

use std::sync::Arc;

use autocomp_model::ComponentState;
use autocomp_ops::operator::{Alert, AlertDefaults, AlertsView, Step, ready_state};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, time, w};
use super::respond::{here, respond};
use crate::filter::{Filter, StateFilter, encode};

pub async fn alerts(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, WebError> {
    let defaults = AlertDefaults { ready_after: app.monitor.settings().ready_overdue_after, ..Default::default() };
    let view = app.monitor.operator().alerts(&defaults).await?;
    let mut body = String::from("<h1>Alerts</h1>\n");
    w!(
        body,
        "<p>What <code>autocomp alerts</code> reports at {}: batches ready longer than their component's \
         <code>overdue_after</code> (default {}), runs past their <code>max_runtime</code>, components no host has \
         run, an index behind the store, foreign lock nodes, long pauses and open circuits.</p>\n",
        time(view.now),
        esc(humantime::format_duration(defaults.ready_after))
    );
    if view.alerts.is_empty() {
        body.push_str("<p class=\"verdict\" id=\"no-alerts\">Nothing needs a person.</p>\n");
    } else {
        // Which components are human steps: their batches wait in `person`, not `ready`.
        let pipeline = app.monitor.pipeline().await.unwrap_or_default();
        w!(
            body,
            "<div class=\"scroll\" role=\"region\" aria-labelledby=\"alerts-caption\" tabindex=\"0\">\n\
             <table class=\"grid alerts\">\n<caption id=\"alerts-caption\">{} {}, as <code>autocomp alerts</code> \
             words them</caption>\n<thead><tr><th scope=\"col\">Alert</th><th scope=\"col\">What</th>\
             <th scope=\"col\">Look at</th></tr></thead>\n<tbody>\n",
            esc(view.alerts.len()),
            if view.alerts.len() == 1 { "alert" } else { "alerts" }
        );
        body.push_str(&rows(&view, &pipeline));
        body.push_str("</tbody></table></div>\n");
    }
    Ok(respond(&headers, &caller, "Alerts", Nav::Alerts, &here(&uri), &body))
}

/// One row per alert: its kind, its line as `autocomp alerts` words it, where to look.
fn rows(view: &AlertsView, pipeline: &[Step]) -> String {
    let mut body = String::new();
    for alert in &view.alerts {
        let (href, label) = link(alert, |name| {
            pipeline.iter().find(|step| step.name() == name).map_or(ComponentState::Ready, ready_state)
        });
        w!(
            body,
            "<tr><th scope=\"row\">{}</th><td class=\"message\">{}</td><td><a href=\"{}\">{}</a></td></tr>\n",
            esc(kind(alert)),
            esc(alert.line(view.now)),
            esc(href),
            esc(label)
        );
    }
    body
}

/// The alert's kind, for the row's header.
fn kind(alert: &Alert) -> &'static str {
    match alert {
        Alert::ContractBroken { .. } => "contract broken",
        Alert::PassRefused { .. } => "pass refused",
        Alert::Failed { .. } => "failed",
        Alert::ReadyTooLong { .. } => "ready too long",
        Alert::WorkingTooLong { .. } => "working too long",
        Alert::Silent { .. } => "silent",
        Alert::IndexLag { .. } => "index behind",
        Alert::ForeignLock { .. } => "foreign lock",
        Alert::Held { hold, .. } => hold.kind.as_str(),
    }
}

/// Where to look into the alert, and the link's words. `waits_in` is the state a
/// component's batches wait for it in (`person` at a human step).
fn link(alert: &Alert, waits_in: impl Fn(&autocomp_model::ComponentName) -> ComponentState) -> (String, String) {
    match alert {
        Alert::Failed { component, .. } => {
            let filter = Filter::for_state(component, StateFilter::State(ComponentState::Failed));
            (format!("/batches?{}", filter.url_query()), format!("{component}'s failed batches"))
        }
        Alert::ReadyTooLong { component, .. } => {
            let state = waits_in(component);
            let filter = Filter::for_state(component, StateFilter::State(state));
            (format!("/batches?{}", filter.url_query()), format!("{component}'s {} batches", state.as_str()))
        }
        Alert::WorkingTooLong { batch, .. } => {
            (format!("/batches/{}", encode(batch.as_str())), format!("batch {batch}"))
        }
        Alert::Held { .. } => ("/#steering".into(), "the overview's steering".into()),
        Alert::ContractBroken { .. } => ("/graph#contracts".into(), "the results and what reads them".into()),
        Alert::PassRefused { component, .. } => ("/".into(), format!("{component} in the overview")),
        Alert::Silent { component, .. } => ("/".into(), format!("{component} in the overview")),
        Alert::IndexLag { .. } | Alert::ForeignLock { .. } => ("/".into(), "the overview".into()),
    }
}
