//! Steering the whole pipeline from the browser: the overview's section that shows each
//! component's hold (paused, draining, circuit open: by whom, since when, why), the resource
//! pools and their sizes, the breaker counts and the newest entries of the steering log, with
//! the forms for an admin; and the actions themselves, through the operator module's own
//! `preview_steer` and `steer`, recorded as the signed-in admin. Operators and viewers see the
//! state and no forms; a request from them is refused (403) before anything is read.
//!
//! As for the batch actions (`actions`): a form posts to `POST /steer` and is answered 303 to
//! the preview's address, `GET /steer?action=pause&component=c&reason=...&since=V&key=K`
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

use std::collections::BTreeSet;
use std::sync::Arc;

use autocomp_model::{ComponentName, ComponentState, InvalidInput, MAX_POOL_SIZE, SteeringChange, SteeringEntry};
use autocomp_ops::operator::{Format, OperatorError, Scope, SteerAction, SteerPreview, check_reason};
use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::access::Access;
use super::actions::{
    MAX_ADDRESS, check_names, checkbox, field, form_fields, fresh_key, no_store, note_cookie, note_html, query_fields,
    query_key, refuse_from_elsewhere, take_note,
};
use super::auth::flash_cookie;
use super::gate::Caller;
use super::html::{Nav, Page, age, attr, esc, hidden_fields, hold_badge, time, w};
use super::{App, WebError, html_response};
use crate::data::Overview;
use crate::filter::{StateFilter, encode};

/// Where a steering action comes from and goes back to.
const BACK: &str = "/#steering";
const PATH: &str = "/steer";

/// The fields a steering form posts (a confirm adds `confirm` and `version`).
const STEER_FIELDS: &[&str] = &["action", "component", "all", "pool", "size", "reason", "confirm", "version"];
/// A steering preview's address: the action's fields, `since` and `key`.
const STEER_QUERY: &[&str] = &["action", "component", "all", "pool", "size", "reason", "since", "key"];
/// The fields that say what the action is: carried by the address and the confirm form.
const ACTION_FIELDS: &[&str] = &["action", "component", "all", "pool", "size", "reason"];

/// A steering form, posted or in a preview's address, checked field by field.
struct Steer {
    action: SteerAction,
    reason: String,
    /// A confirm's: the steering version its preview planned against.
    version: Option<u64>,
    /// The action's fields, for the preview's address and its confirm form.
    fields: Vec<(String, String)>,
}

impl Steer {
    fn parse(fields: Vec<(String, String)>, known: &[&str]) -> Result<Steer, WebError> {
        check_names(&fields, known)?;
        let given = |name: &str| field(&fields, name).map(str::trim).filter(|v| !v.is_empty());
        let text = field(&fields, "action").unwrap_or_default();
        let all = checkbox("all", field(&fields, "all"))?;
        let component = given("component");
        let scope = || match (all, component) {
            (true, Some(name)) => Err(InvalidInput::new(
                "all",
                "1",
                format!("either the whole pipeline or one component ({name}), not both"),
            )),
            (true, None) => Ok(Scope::All),
            (false, Some(name)) => Ok(Scope::Component(name.to_owned())),
            (false, None) => Err(InvalidInput::new(
                "component",
                "",
                "required: the component to steer (or all=1 for the whole pipeline)",
            )),
        };
        let only_for_pools = |name: &str| match given(name) {
            Some(value) => Err(InvalidInput::new(name, value, format!("only a pool size takes it, not a {text}"))),
            None => Ok(()),
        };
        let action = match text {
            "pause" | "drain" | "resume" | "resume-rerun-failed" => {
                only_for_pools("pool")?;
                only_for_pools("size")?;
                let scope = scope()?;
                match text {
                    "pause" => SteerAction::Pause { scope },
                    "drain" => SteerAction::Drain { scope },
                    "resume" => SteerAction::Resume { scope, rerun_failed: false },
                    _ if scope == Scope::All => {
                        return Err(InvalidInput::new(
                            "action",
                            text,
                            "rerunning the failed batches is for one component's open circuit; the whole pipeline \
                             resumes with resume",
                        )
                        .into());
                    }
                    _ => SteerAction::Resume { scope, rerun_failed: true },
                }
            }
            "pool" => {
                if all {
                    return Err(InvalidInput::new("all", "1", "a pool size names a pool, not the pipeline").into());
                }
                if let Some(name) = component {
                    return Err(
                        InvalidInput::new("component", name, "a pool size names a pool, not a component").into()
                    );
                }
                let pool = given("pool").ok_or_else(|| InvalidInput::new("pool", "", "required: the pool's name"))?;
                let size = field(&fields, "size").unwrap_or_default();
                let parsed = size.trim().parse::<u32>().ok().filter(|n| *n <= MAX_POOL_SIZE);
                let size = parsed.ok_or_else(|| {
                    InvalidInput::new(
                        "size",
                        size,
                        format!("expected a whole number from 0 to {MAX_POOL_SIZE} (0 closes the pool)"),
                    )
                })?;
                SteerAction::SetPool { pool: pool.to_owned(), size }
            }
            other => {
                return Err(InvalidInput::new(
                    "action",
                    other,
                    "expected pause, drain, resume, resume-rerun-failed or pool",
                )
                .into());
            }
        };
        let version = match field(&fields, "confirm") {
            None | Some("") => None,
            Some("1") => {
                let text = field(&fields, "version").unwrap_or_default();
                let version = text.parse::<u64>().map_err(|_| {
                    InvalidInput::new(
                        "version",
                        text,
                        "required to confirm: the steering version the preview planned against (the confirm form of \
                         a preview posts it)",
                    )
                })?;
                Some(version)
            }
            Some(other) => return Err(InvalidInput::new("confirm", other, "expected 1").into()),
        };
        let reason = field(&fields, "reason").unwrap_or_default().to_owned();
        let fields = fields.into_iter().filter(|(name, _)| ACTION_FIELDS.contains(&name.as_str())).collect();
        Ok(Steer { action, reason, version, fields })
    }

    /// The preview's address: the action's fields, then `since` and `key`, each
    /// percent-encoded; the reason checked first in the operator module's words, and any
    /// other field too long for an address refused.
    fn address(&self, since: u64, key: &str) -> Result<String, WebError> {
        check_reason(&self.reason)?;
        let since = since.to_string();
        let extra = [("since", since.as_str()), ("key", key)];
        let pairs = self.fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).chain(extra);
        let query: Vec<String> = pairs.map(|(name, value)| format!("{}={}", encode(name), encode(value))).collect();
        let address = format!("{PATH}?{}", query.join("&"));
        if address.len() > MAX_ADDRESS {
            let (name, value) = self.fields.iter().max_by_key(|(_, v)| v.len()).expect("the action field");
            let words = format!("too long for a preview's address ({} characters)", value.chars().count());
            return Err(InvalidInput::new(name.as_str(), "", words).into());
        }
        Ok(address)
    }

    /// What the action is about, in words: `pause archiver`, `pool set tape`.
    fn title(&self) -> String {
        match &self.action {
            SteerAction::Pause { scope } | SteerAction::Drain { scope } | SteerAction::Resume { scope, .. } => {
                let what = match scope {
                    Scope::All => "the whole pipeline".to_owned(),
                    Scope::Component(name) => name.clone(),
                };
                let rerun = matches!(self.action, SteerAction::Resume { rerun_failed: true, .. });
                format!("{} {what}{}", self.action.name(), if rerun { " and rerun its failed batches" } else { "" })
            }
            SteerAction::SetPool { pool, size } => format!("pool {pool}: size {size}"),
        }
    }

    /// Whether the log's `change` is this action's.
    fn made(&self, change: &SteeringChange) -> bool {
        let named = |scope: &Scope, component: &Option<ComponentName>| match (scope, component) {
            (Scope::All, None) => true,
            (Scope::Component(name), Some(component)) => component.as_str() == name,
            _ => false,
        };
        match (&self.action, change) {
            (SteerAction::Pause { scope }, SteeringChange::Pause { component, drain: false })
            | (SteerAction::Drain { scope }, SteeringChange::Pause { component, drain: true })
            | (SteerAction::Resume { scope, .. }, SteeringChange::Resume { component }) => named(scope, component),
            (SteerAction::SetPool { pool, size }, SteeringChange::SetPool { pool: made, size: made_size }) => {
                made.as_str() == pool && made_size == size
            }
            _ => false,
        }
    }

    /// The log's entry of this action confirmed after `since` by `name` with this reason, if
    /// the newest entries hold one: its preview was confirmed.
    fn done_in<'l>(&self, log: &'l [SteeringEntry], name: &str, since: u64) -> Option<&'l SteeringEntry> {
        let agent = format!("operator:{name}");
        log.iter()
            .filter(|e| e.version > since && e.by.to_string() == agent && e.reason == self.reason.trim())
            .filter(|e| self.made(&e.change))
            .min_by_key(|e| e.version)
    }
}

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
    let steer = Steer::parse(form_fields(form)?, STEER_FIELDS)?;
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
            let mut response = Redirect::to(BACK).into_response();
            response.headers_mut().append(header::SET_COOKIE, flash_cookie(caller.secure, words.trim_end()));
            Ok(response)
        }
        // The steering changed since the preview: nothing was done; a fresh preview says so.
        Err(OperatorError::Refused(words) | OperatorError::AlreadyInState(words)) => {
            let since = operator.steering().await?.0.version;
            let key = fresh_key();
            let mut response = Redirect::to(&steer.address(since, &key)?).into_response();
            response.headers_mut().append(header::SET_COOKIE, note_cookie(caller.secure, PATH, &key, Some(&words)));
            Ok(response)
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
    let steer = Steer::parse(fields.clone(), STEER_QUERY)?;
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
    let note = take_note(headers, caller.secure, PATH, &key);
    let clear = note.as_ref().map(|(_, clear)| clear.clone());
    let note = note.map(|(note, _)| note);
    let title = format!("Preview: {}", steer.title());
    let mut response = match operator.preview_steer(&steer.action, &steer.reason).await {
        Ok(preview) => preview_body(access, name, &steer, &preview, note.as_deref()),
        // Shown again, and refused as the steering is now: say both.
        Err(OperatorError::Refused(words) | OperatorError::AlreadyInState(words)) if note.is_some() => {
            let mut body = String::new();
            w!(
                body,
                "<h1>{}</h1>\n{}<p class=\"verdict\">As the pipeline is steered now, it is refused: {}</p>\n\
                 <p>Nothing was written. <a href=\"{BACK}\">Back to the overview</a></p>\n",
                esc(&title),
                note_html(note.as_deref()),
                esc(words)
            );
            page(access, StatusCode::CONFLICT, &title, &body)
        }
        Err(e) => WebError::from(e).into_response(),
    };
    if let Some(clear) = clear {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    Ok(response)
}

fn page(access: &Access, status: StatusCode, title: &str, body: &str) -> Response {
    let page = Page { title, nav: Nav::Overview, access: Some(access), flash: None, live: false, here: "/" };
    html_response(status, page.render(body))
}

fn preview_body(access: &Access, name: &str, steer: &Steer, preview: &SteerPreview, note: Option<&str>) -> Response {
    let title = format!("Preview: {}", steer.title());
    let mut body = String::new();
    w!(
        body,
        "<h1>{}</h1>\n{}<p>{}</p>\n<p class=\"verdict\">Will record: {}.</p>\n<dl class=\"facts\">\
         <dt>Planned against</dt><dd>steering version {} (if the steering changes before you confirm, nothing is done \
         and this preview is shown again)</dd><dt>As</dt><dd><code>operator:{}</code></dd><dt>Reason</dt><dd>{}</dd>\
         </dl>\n",
        esc(&title),
        note_html(note),
        esc(&preview.summary),
        esc(&preview.would),
        esc(preview.version),
        esc(name),
        esc(steer.reason.trim())
    );
    match &steer.action {
        SteerAction::Pause { .. } | SteerAction::Drain { .. } if preview.running.is_empty() => {
            body.push_str("<p>Nothing of it runs now.</p>\n");
        }
        SteerAction::Pause { .. } | SteerAction::Drain { .. } => {
            w!(
                body,
                "<table class=\"grid\"><caption>Running now: {} runs, which go on to their result</caption><thead><tr>\
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
            body.push_str("</tbody></table>\n");
        }
        SteerAction::Resume { rerun_failed: true, .. } if preview.reruns.is_empty() => {
            body.push_str("<p>No batch to rerun: its breaker remembers no failed batch.</p>\n");
        }
        SteerAction::Resume { rerun_failed: true, .. } => {
            w!(
                body,
                "<table class=\"grid\"><caption>Would rerun {} batches, the ones that failed while its circuit was \
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
            body.push_str("</tbody></table>\n");
        }
        _ => {}
    }
    let mut fields = steer.fields.clone();
    fields.extend([("version".to_owned(), preview.version.to_string()), ("confirm".to_owned(), "1".to_owned())]);
    w!(
        body,
        "<p>Nothing has been written yet.</p>\n<form method=\"post\" action=\"{PATH}\">{}\
         <p><button type=\"submit\">Confirm: {}</button> <a href=\"{BACK}\">Cancel, back to the overview</a></p>\
         </form>\n",
        hidden_fields(&fields),
        esc(steer.title())
    );
    page(access, StatusCode::OK, &title, &body)
}

/// A preview whose confirm was done: what it recorded, by whom and when; nothing to confirm.
fn done_page(access: &Access, steer: &Steer, entry: &SteeringEntry) -> Response {
    let title = format!("Done: {}", steer.title());
    let mut body = String::new();
    w!(
        body,
        "<h1>{}</h1>\n<p class=\"verdict\" role=\"status\">Done: {}, steering version {}, by <code>{}</code> at {}.</p>\n\
         <dl class=\"facts\"><dt>Reason</dt><dd>{}</dd></dl>\n<p>This preview was confirmed, and what it recorded is \
         above: it cannot be confirmed again, and nothing more was written. To do it once more, preview it again from \
         the overview.</p>\n<p><a href=\"{BACK}\">Back to the overview</a></p>\n",
        esc(&title),
        esc(&entry.said),
        esc(entry.version),
        esc(&entry.by),
        esc(entry.at),
        esc(&entry.reason)
    );
    page(access, StatusCode::OK, &title, &body)
}

/// The overview's steering section: the whole pipeline's hold, each component's hold and
/// breaker count, the pools, the newest log entries; an admin's forms beside them.
pub fn section(access: &Access, overview: &Overview, here: &str) -> String {
    let steering = &overview.steering;
    let admin = access.may_steer();
    let mut out = String::from(
        "<section aria-labelledby=\"steering\"><h2 id=\"steering\">Steering</h2>\n<p class=\"help\">A paused or \
         draining component claims no new work; what already runs goes on to its result (a drain is a pause whose \
         point is that it finishes). A component's circuit opens by itself after its <code>break_after</code> \
         consecutive failures. A pool lets at most its size of batches' work run at once, across all hosts.</p>\n",
    );
    match access {
        _ if admin => w!(
            out,
            "<p class=\"help\">Each change is previewed first; nothing is written until you confirm. It is recorded \
             as <code>operator:{}</code> with your reason.</p>\n",
            esc(access.name().unwrap_or_default())
        ),
        Access::ReadOnly => out.push_str("<p>This monitor is read only (started without accounts).</p>\n"),
        Access::SignedOut => w!(
            out,
            "<p><a href=\"/login?next={}\">Sign in</a> as an admin to pause, drain or resume the pipeline or size its \
             pools.</p>\n",
            esc(encode(here))
        ),
        Access::SignedIn { name, role, .. } => w!(
            out,
            "<p>Your account <strong>{}</strong> is {} {}: pausing, draining, resuming and pool sizes need the \
             admin role.</p>\n",
            esc(name),
            if role.as_str().starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" },
            esc(role)
        ),
    }

    out.push_str("<h3>The whole pipeline</h3>\n");
    match &steering.pipeline {
        Some(hold) => w!(
            out,
            "<p>{} by <code>{}</code> since {} ({} ago): {}</p>\n",
            hold_badge(hold.kind),
            esc(&hold.by),
            time(hold.since),
            esc(age(overview.now.since(hold.since))),
            esc(&hold.reason)
        ),
        None => out.push_str("<p>Not held: each component claims work unless it is held on its own.</p>\n"),
    }
    if admin {
        let buttons: &[(&str, &str)] = match steering.pipeline.as_ref().map(|h| h.kind) {
            None => &[("pause", "Pause the whole pipeline"), ("drain", "Drain the whole pipeline")],
            Some(autocomp_model::HoldKind::Pause) => {
                &[("drain", "Drain the whole pipeline"), ("resume", "Resume the whole pipeline")]
            }
            Some(autocomp_model::HoldKind::Drain) => {
                &[("pause", "Pause the whole pipeline"), ("resume", "Resume the whole pipeline")]
            }
            Some(autocomp_model::HoldKind::Circuit) => &[("resume", "Resume the whole pipeline")],
        };
        out.push_str(&form("steer-all", &[("all", "1")], None, buttons));
    }

    out.push_str(
        "<div class=\"scroll\" role=\"region\" aria-labelledby=\"holds-caption\" tabindex=\"0\">\n<table class=\"grid\">\
         <caption id=\"holds-caption\">Each component's hold and circuit breaker</caption><thead><tr>\
         <th scope=\"col\">Component</th><th scope=\"col\">Hold</th><th scope=\"col\">By</th><th scope=\"col\">Since</th>\
         <th scope=\"col\">Why</th><th scope=\"col\">Breaker</th>",
    );
    if admin {
        out.push_str("<th scope=\"col\">Steer</th>");
    }
    out.push_str("</tr></thead><tbody>\n");
    for row in &overview.rows {
        let descriptor = &row.component.descriptor;
        let name = &descriptor.name;
        let own = steering.components.get(name);
        w!(out, "<tr><th scope=\"row\">{}</th>", esc(name));
        match (own, &steering.pipeline) {
            (Some(hold), _) => w!(
                out,
                "<td>{}</td><td><code>{}</code></td><td>{} ({} ago)</td><td>{}</td>",
                hold_badge(hold.kind),
                esc(&hold.by),
                time(hold.since),
                esc(age(overview.now.since(hold.since))),
                esc(&hold.reason)
            ),
            (None, Some(hold)) => {
                w!(out, "<td>{} with the whole pipeline</td><td colspan=\"3\">see above</td>", hold_badge(hold.kind))
            }
            (None, None) => out.push_str("<td>claims work</td><td>–</td><td>–</td><td>–</td>"),
        }
        let breaker = steering.breakers.get(name);
        out.push_str("<td>");
        match (breaker, descriptor.break_after) {
            (Some(b), limit) => {
                w!(out, "{} consecutive failures", esc(b.consecutive));
                if let Some(limit) = limit {
                    w!(out, " (opens at {})", esc(limit));
                }
                if let Some(last) = &b.last {
                    w!(out, "<br><small>last: {}</small>", esc(last));
                }
            }
            (None, Some(limit)) => w!(out, "0 consecutive failures (opens at {})", esc(limit)),
            (None, None) => out.push_str("never opens (no <code>break_after</code>)"),
        }
        out.push_str("</td>");
        if admin {
            let buttons: &[(&str, &str)] = match own.map(|h| h.kind) {
                None => &[("pause", "Pause"), ("drain", "Drain")],
                Some(autocomp_model::HoldKind::Pause) => &[("drain", "Drain"), ("resume", "Resume")],
                Some(autocomp_model::HoldKind::Drain) => &[("pause", "Pause"), ("resume", "Resume")],
                Some(autocomp_model::HoldKind::Circuit) => {
                    &[("resume", "Resume"), ("resume-rerun-failed", "Resume and rerun failed")]
                }
            };
            w!(out, "<td>{}</td>", form(&format!("steer-{name}"), &[("component", name.as_str())], None, buttons));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></div>\n");

    out.push_str("<h3>Pools</h3>\n");
    let mut pools: BTreeSet<String> = steering.pools.keys().map(ToString::to_string).collect();
    pools.extend(overview.rows.iter().flat_map(|r| r.component.descriptor.pools.iter().map(ToString::to_string)));
    if pools.is_empty() {
        out.push_str("<p>No pool is sized, and no component takes a slot of one.</p>\n");
    } else {
        out.push_str(
            "<table class=\"grid\"><caption>Resource pools</caption><thead><tr><th scope=\"col\">Pool</th>\
             <th scope=\"col\" class=\"num\">Size</th><th scope=\"col\" class=\"num\">In use</th>\
             <th scope=\"col\" class=\"num\">Waiting</th><th scope=\"col\">Used by</th><th scope=\"col\">Set by</th>\
             <th scope=\"col\">Since</th><th scope=\"col\">Why</th>",
        );
        if admin {
            out.push_str("<th scope=\"col\">Set its size</th>");
        }
        out.push_str("</tr></thead><tbody>\n");
        for pool in &pools {
            let sized = steering.pools.iter().find(|(p, _)| p.as_str() == pool).map(|(_, sized)| sized);
            let user_rows: Vec<_> = overview
                .rows
                .iter()
                .filter(|r| r.component.descriptor.pools.iter().any(|p| p.as_str() == pool))
                .collect();
            let users: Vec<&str> = user_rows.iter().map(|r| r.component.descriptor.name.as_str()).collect();
            // Each open run of a component declaring the pool holds one of its slots; each
            // batch ready for one waits for a pass and a slot (as the metrics count them).
            let count = |state| user_rows.iter().map(|r| r.count(StateFilter::State(state))).sum::<u64>();
            let (in_use, waiting) = (count(ComponentState::Working), count(ComponentState::Ready));
            w!(out, "<tr><th scope=\"row\">{}</th>", esc(pool));
            match sized {
                Some(sized) => w!(
                    out,
                    "<td class=\"num\">{}</td><td class=\"num\">{in_use}</td><td class=\"num\">{waiting}</td>\
                     <td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>",
                    esc(sized.size),
                    esc(if users.is_empty() { "none".to_owned() } else { users.join(", ") }),
                    esc(&sized.by),
                    time(sized.since),
                    esc(&sized.reason)
                ),
                None => w!(
                    out,
                    "<td class=\"num\">0</td><td class=\"num\">{in_use}</td><td class=\"num\">{waiting}</td>\
                     <td>{}</td><td colspan=\"3\">never sized: no batch gets a slot</td>",
                    esc(if users.is_empty() { "none".to_owned() } else { users.join(", ") })
                ),
            }
            if admin {
                let size = sized.map_or(0, |s| s.size).to_string();
                w!(
                    out,
                    "<td>{}</td>",
                    form(&format!("pool-{pool}"), &[("pool", pool.as_str())], Some(&size), &[("pool", "Set size")])
                );
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody></table>\n");
    }
    if admin {
        out.push_str(&new_pool_form());
    }

    out.push_str("<h3>Steering log</h3>\n");
    if overview.steering_log.is_empty() {
        out.push_str("<p>No steering change recorded yet.</p>\n");
    } else {
        w!(
            out,
            "<table class=\"grid\"><caption>The newest {} steering changes, newest first</caption><thead><tr>\
             <th scope=\"col\" class=\"num\">Version</th><th scope=\"col\">At</th><th scope=\"col\">By</th>\
             <th scope=\"col\">What</th><th scope=\"col\">Why</th></tr></thead><tbody>\n",
            esc(overview.steering_log.len())
        );
        for entry in &overview.steering_log {
            w!(
                out,
                "<tr><th scope=\"row\" class=\"num\">{}</th><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
                 </tr>\n",
                esc(entry.version),
                time(entry.at),
                esc(&entry.by),
                esc(&entry.said),
                esc(&entry.reason)
            );
        }
        out.push_str("</tbody></table>\n");
    }
    out.push_str("</section>\n");
    out
}

/// A steering form: its hidden fields, a size (for a pool), the reason, and one submit
/// button per action (`action`, label).
fn form(id: &str, hidden: &[(&str, &str)], size: Option<&str>, buttons: &[(&str, &str)]) -> String {
    let mut out = format!("<form method=\"post\" action=\"{PATH}\" class=\"steer\">");
    let hidden: Vec<(String, String)> = hidden.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    out.push_str(&hidden_fields(&hidden));
    if let Some(size) = size {
        w!(
            out,
            "<p><label for=\"{0}-size\">Size</label><input id=\"{0}-size\" name=\"size\" type=\"number\" min=\"0\" \
             max=\"{1}\" step=\"1\" required value=\"{2}\"></p>",
            esc(id),
            esc(MAX_POOL_SIZE),
            attr(size)
        );
    }
    w!(
        out,
        "<p><label for=\"{0}-reason\">Reason (required)</label><input id=\"{0}-reason\" name=\"reason\" required \
         maxlength=\"2000\"></p><p>",
        esc(id)
    );
    for (action, label) in buttons {
        w!(out, "<button type=\"submit\" name=\"action\" value=\"{}\">{}</button> ", esc(action), esc(label));
    }
    out.push_str("</p></form>");
    out
}

/// Sizing a pool by name (a new one, or one no component names yet).
fn new_pool_form() -> String {
    let mut out = format!(
        "<form method=\"post\" action=\"{PATH}\" class=\"steer\" aria-labelledby=\"pool-new-legend\">\
         <p id=\"pool-new-legend\"><strong>Size a pool by its name</strong></p>\
         <p><label for=\"pool-new-name\">Pool</label><input id=\"pool-new-name\" name=\"pool\" required \
         maxlength=\"64\"></p><p><label for=\"pool-new-size\">Size</label><input id=\"pool-new-size\" name=\"size\" \
         type=\"number\" min=\"0\" max=\"{MAX_POOL_SIZE}\" step=\"1\" required></p>"
    );
    out.push_str(
        "<p><label for=\"pool-new-reason\">Reason (required)</label><input id=\"pool-new-reason\" name=\"reason\" \
         required maxlength=\"2000\"></p><p><button type=\"submit\" name=\"action\" value=\"pool\">Set size</button>\
         </p></form>\n",
    );
    out
}
