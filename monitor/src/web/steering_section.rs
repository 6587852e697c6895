//! The overview's steering section: the whole pipeline's hold, each component's hold
//! (paused, draining, circuit open: by whom, since when, why) and breaker count, the
//! resource pools and their sizes, the newest entries of the steering log; and for an admin
//! the forms that post to `/steer` (`steering`).

use std::collections::BTreeSet;

use autocomp_model::{ComponentState, HoldKind, MAX_POOL_SIZE};

use super::access::Access;
use super::html::{age, attr, esc, hidden_fields, hold_badge, time, w};
use super::steer_input::PATH;
use crate::data::{Overview, OverviewRow};
use crate::filter::{StateFilter, encode};

/// The overview's steering section: the whole pipeline's hold, each component's hold and
/// breaker count, the pools, the newest log entries; an admin's forms beside them.
pub fn section(access: &Access, overview: &Overview, here: &str) -> String {
    let admin = access.may_steer();
    let mut out = String::from(
        "<section aria-labelledby=\"steering\"><h2 id=\"steering\">Steering</h2>\n<p class=\"help\">A paused or \
         draining component claims no new work; what already runs goes on to its result (a drain is a pause whose \
         point is that it finishes). A component's circuit opens by itself after its <code>break_after</code> \
         consecutive failures. A pool lets at most its size of batches' work run at once, across all hosts.</p>\n",
    );
    out.push_str(&who(access, here));
    out.push_str(&pipeline(overview, admin));
    out.push_str(&holds(overview, admin));
    out.push_str(&pools(overview, admin));
    out.push_str(&log(overview));
    out.push_str("</section>\n");
    out
}

/// What this request may do here: an admin's note on the forms, or why there are none.
fn who(access: &Access, here: &str) -> String {
    let admin = access.may_steer();
    let mut out = String::new();
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

    out
}

/// The whole pipeline's hold, and an admin's forms for it.
fn pipeline(overview: &Overview, admin: bool) -> String {
    let steering = &overview.steering;
    let mut out = String::new();
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
            Some(HoldKind::Pause) => &[("drain", "Drain the whole pipeline"), ("resume", "Resume the whole pipeline")],
            Some(HoldKind::Drain) => &[("pause", "Pause the whole pipeline"), ("resume", "Resume the whole pipeline")],
            Some(HoldKind::Circuit) => &[("resume", "Resume the whole pipeline")],
        };
        out.push_str(&form("steer-all", &[("all", "1")], None, buttons));
    }

    out
}

/// Each component's hold and breaker, with an admin's forms.
fn holds(overview: &Overview, admin: bool) -> String {
    let mut out = String::new();
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
        out.push_str(&hold_row(overview, row, admin));
    }
    out.push_str("</tbody></table></div>\n");
    out
}

/// One component's hold (its own, or the whole pipeline's), its breaker, an admin's form.
fn hold_row(overview: &Overview, row: &OverviewRow, admin: bool) -> String {
    let steering = &overview.steering;
    let mut out = String::new();
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
    out.push_str(&breaker_cell(steering.breakers.get(name), descriptor.break_after));
    if admin {
        let buttons: &[(&str, &str)] = match own.map(|h| h.kind) {
            None => &[("pause", "Pause"), ("drain", "Drain")],
            Some(HoldKind::Pause) => &[("drain", "Drain"), ("resume", "Resume")],
            Some(HoldKind::Drain) => &[("pause", "Pause"), ("resume", "Resume")],
            Some(HoldKind::Circuit) => &[("resume", "Resume"), ("resume-rerun-failed", "Resume and rerun failed")],
        };
        w!(out, "<td>{}</td>", form(&format!("steer-{name}"), &[("component", name.as_str())], None, buttons));
    }
    out.push_str("</tr>\n");
    out
}

/// A component's breaker: its consecutive failures, where it opens, the last failure.
fn breaker_cell(breaker: Option<&autocomp_model::Breaker>, break_after: Option<u32>) -> String {
    let mut out = String::new();
    out.push_str("<td>");
    match (breaker, break_after) {
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
    out
}

/// The pools sized or named by a component, and an admin's forms to size them.
fn pools(overview: &Overview, admin: bool) -> String {
    let steering = &overview.steering;
    let mut out = String::new();
    out.push_str("<h3>Pools</h3>\n");
    let mut pools: BTreeSet<String> = steering.pools.keys().map(ToString::to_string).collect();
    pools.extend(overview.rows.iter().flat_map(|r| r.component.descriptor.pools.iter().map(ToString::to_string)));
    if pools.is_empty() {
        out.push_str("<p>No pool is sized, and no component takes a slot of one.</p>\n");
    } else {
        out.push_str(
            "<div class=\"scroll\" role=\"region\" aria-label=\"Resource pools\" tabindex=\"0\"><table class=\"grid\"><caption>Resource pools</caption><thead><tr><th scope=\"col\">Pool</th>\
             <th scope=\"col\" class=\"num\">Size</th><th scope=\"col\" class=\"num\">In use</th>\
             <th scope=\"col\" class=\"num\">Waiting</th><th scope=\"col\">Used by</th><th scope=\"col\">Set by</th>\
             <th scope=\"col\">Since</th><th scope=\"col\">Why</th>",
        );
        if admin {
            out.push_str("<th scope=\"col\">Set its size</th>");
        }
        out.push_str("</tr></thead><tbody>\n");
        for pool in &pools {
            out.push_str(&pool_row(overview, pool, admin));
        }
        out.push_str("</tbody></table></div>\n");
    }
    if admin {
        out.push_str(&new_pool_form());
    }
    out
}

/// One pool: its size, slots in use and batches waiting, who uses it, who sized it.
fn pool_row(overview: &Overview, pool: &str, admin: bool) -> String {
    let steering = &overview.steering;
    let mut out = String::new();
    let sized = steering.pools.iter().find(|(p, _)| p.as_str() == pool).map(|(_, sized)| sized);
    let user_rows: Vec<_> =
        overview.rows.iter().filter(|r| r.component.descriptor.pools.iter().any(|p| p.as_str() == pool)).collect();
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
        w!(out, "<td>{}</td>", form(&format!("pool-{pool}"), &[("pool", pool)], Some(&size), &[("pool", "Set size")]));
    }
    out.push_str("</tr>\n");
    out
}

/// The newest entries of the steering log, newest first.
fn log(overview: &Overview) -> String {
    let mut out = String::new();
    out.push_str("<h3>Steering log</h3>\n");
    if overview.steering_log.is_empty() {
        out.push_str("<p>No steering change recorded yet.</p>\n");
    } else {
        w!(
            out,
            "<div class=\"scroll\" role=\"region\" aria-label=\"Steering changes\" tabindex=\"0\"><table class=\"grid\"><caption>The newest {} steering changes, newest first</caption><thead><tr>\
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
        out.push_str("</tbody></table></div>\n");
    }
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
