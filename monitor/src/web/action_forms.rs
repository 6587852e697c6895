//! The action forms the pages offer: on a batch's page its actions (rerun, restart, cancel,
//! skip, prioritize) and, while it waits at a human step, the decision there (approve,
//! reject); on the batch list the same actions for every batch of the filter. Each posts to
//! a preview first (`confirm`); for a request that may not act, why there are none.

use autocomp_model::Batch;
use autocomp_ops::operator::RestartFrom;

use super::access::Access;
use super::html::{attr, esc, hidden_fields, w};
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

/// Why the page offers no action forms to this request (read only, signed out, a viewer),
/// or `None` for an operator or an admin.
fn why_no_forms(access: &Access, here: &str) -> Option<String> {
    let mut out = String::new();
    match access {
        Access::ReadOnly => out.push_str("<p>This monitor is read only (started without accounts): no actions.</p>\n"),
        Access::SignedOut => {
            w!(out, "<p><a href=\"/login?next={}\">Sign in</a> to act.</p>\n", esc(encode(here)))
        }
        Access::SignedIn { name, role, .. } if !access.may_act() => w!(
            out,
            "<p>Your account <strong>{}</strong> is a {}: it may read but not act on batches.</p>\n",
            esc(name),
            esc(role)
        ),
        Access::SignedIn { .. } => return None,
    }
    Some(out)
}

/// The decision at a human step: Approve, and Reject with an optional type to restart
/// from (one of `types`), each previewed first like every batch action; or why there are
/// none. For one batch, at the one step it waits at; for a filter's batches, at one of the
/// pipeline's human `steps` (a select when there are several): the preview counts the
/// batches that do not wait there as refused.
pub fn decision_forms(access: &Access, target: &Target, steps: &[String], types: &[String], here: &str) -> String {
    if let Some(why) = why_no_forms(access, here) {
        return why;
    }
    let mut out = String::new();
    let (url, hidden, prefix, scope) = target_parts(target);
    w!(
        out,
        "<p class=\"help\">Each decision is previewed first; nothing is written until you confirm. It acts on {}, is \
         recorded as <code>operator:{}</code> with your reason.</p>\n<div class=\"actions\">\n",
        esc(&scope),
        esc(access.name().unwrap_or_default())
    );
    let at = match steps {
        [step] => step.as_str(),
        _ => "the step",
    };
    let forms: [(&str, &str, String); 2] = [
        ("approve", "Approve", format!("Record {at}'s success, so the steps after it may run.")),
        (
            "reject",
            "Reject",
            format!(
                "Record {at}'s failure (it stays failed until rerun), or send the batch back: restart it from a \
                 step so it is redone and comes to {at} again."
            ),
        ),
    ];
    for (action, label, help) in forms {
        let id = match (target, steps) {
            (Target::One(_), [step]) => format!("decide-{step}-{action}"),
            _ => format!("{prefix}-decide-{action}"),
        };
        let legend = match steps {
            [step] => format!("{label} at {step}"),
            _ => format!("{label} at a human step"),
        };
        w!(
            out,
            "<form method=\"post\" action=\"{}\" class=\"action\"><fieldset><legend id=\"{id}-legend\">{}</legend>\
             <p class=\"help\">{}</p>{hidden}<input type=\"hidden\" name=\"action\" value=\"{}\">",
            esc(&url),
            esc(&legend),
            esc(help),
            esc(action),
            id = esc(&id)
        );
        match steps {
            [step] => w!(out, "<input type=\"hidden\" name=\"step\" value=\"{}\">", attr(step)),
            _ => {
                let options: Vec<(String, String)> = steps.iter().map(|s| (s.clone(), s.clone())).collect();
                select(&mut out, &format!("{id}-step"), ("step", "Human step"), &options, None);
            }
        }
        if action == "reject" {
            restart_select(&mut out, &id, types);
        }
        w!(
            out,
            "<p><label for=\"{0}-reason\">Reason (required)</label><input id=\"{0}-reason\" name=\"reason\" required \
             maxlength=\"2000\"></p><p><button type=\"submit\">Preview {1}</button></p></fieldset></form>\n",
            esc(&id),
            esc(action)
        );
    }
    out.push_str("</div>\n");
    out
}

/// Where a form about `target` posts, its hidden fields (a filter's), the prefix of its
/// element ids and what it acts on, in words.
fn target_parts(target: &Target) -> (String, String, &'static str, String) {
    match target {
        Target::One(batch) => {
            (format!("/batches/{}/act", encode(batch.id.as_str())), String::new(), "one", format!("batch {}", batch.id))
        }
        Target::Bulk { filter, total } => (
            "/bulk".to_owned(),
            hidden_fields(&filter_fields(filter)),
            "bulk",
            format!("all {total} batches of the filter"),
        ),
    }
}

/// A rejection's optional restart: a select of the batch's effective `types`.
fn restart_select(out: &mut String, id: &str, types: &[String]) {
    w!(
        out,
        "<p><label for=\"{0}-restart-from\">Restart from (optional)</label><select id=\"{0}-restart-from\" \
         name=\"restart_from\"><option value=\"\">no restart: record the rejection</option>",
        esc(id)
    );
    for t in types {
        w!(out, "<option value=\"{}\">{}</option>", attr(t), esc(t));
    }
    out.push_str("</select></p>");
}

/// The action forms, or why there are none (read only, not signed in). `choices` fill the
/// selects; `priority` is the batch's current one.
pub fn action_forms(access: &Access, target: &Target, choices: &Choices, priority: Option<i32>, here: &str) -> String {
    if let Some(why) = why_no_forms(access, here) {
        return why;
    }
    let mut out = String::new();
    let (action_url, hidden, prefix, scope) = target_parts(target);
    w!(
        out,
        "<p class=\"help\">Each action is previewed first; nothing is written until you confirm. It acts on {}, is \
         recorded as <code>operator:{}</code> with your reason.</p>\n<div class=\"actions\">\n",
        esc(&scope),
        esc(access.name().unwrap_or_default())
    );
    for (action, label, help) in ACTIONS {
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
        if !action_fields(&mut out, &id, action, choices, priority) {
            continue;
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

/// The batch actions an action form offers: (`action`, label, help).
const ACTIONS: [(&str, &str, &str); 6] = [
    ("rerun", "Rerun", "Supersede the component's result (a Reset) so it runs again."),
    ("restart", "Restart", "Reset the starting step and every step recorded after it."),
    ("cancel", "Cancel", "Stop the component's running worker and record a cancelled failure."),
    ("skip", "Skip", "Record a skipped success so the steps after it may run."),
    (
        "acknowledge",
        "Acknowledge",
        "Close out the component's failure: it stays a failure but needs nobody (a rerun opens it again).",
    ),
    ("prioritize", "Prioritize", "Set the priority (higher runs first)."),
];

/// What the action forms' selects offer: the components, the event types a restart may
/// start from, and the component the component selects start at (a batch page's failed
/// component), else the first.
pub struct Choices<'c> {
    pub components: &'c [String],
    pub types: &'c [String],
    pub preselect: Option<&'c str>,
    /// The component at work on the batch, which a cancel's select starts at.
    pub running: Option<&'c str>,
}

/// The fields of the form for `action` between its hidden fields and its reason; false
/// (the form closed) when it cannot be filled (no components).
fn action_fields(out: &mut String, id: &str, action: &str, choices: &Choices, priority: Option<i32>) -> bool {
    match action {
        "rerun" | "cancel" | "skip" | "acknowledge" => {
            if choices.components.is_empty() {
                out.push_str("<p>No components.</p></fieldset></form>");
                return false;
            }
            let options: Vec<(String, String)> = choices.components.iter().map(|c| (c.clone(), c.clone())).collect();
            let chosen = match action {
                "cancel" => choices.running.or(choices.preselect),
                _ => choices.preselect,
            };
            select(out, &format!("{id}-component"), ("component", "Component"), &options, chosen);
            let checkbox = match action {
                "skip" => Some(("force", "Force: skip even over a success")),
                "cancel" => Some(("record_anyway", "Record the cancelled failure even if it is not running")),
                _ => None,
            };
            if let Some((name, label)) = checkbox {
                w!(
                    out,
                    "<p><label for=\"{0}-{1}\"><input id=\"{0}-{1}\" name=\"{1}\" type=\"checkbox\" value=\"1\"> \
                     {2}</label></p>",
                    esc(id),
                    esc(name),
                    esc(label)
                );
            }
        }
        "restart" => {
            let options: Vec<(String, String)> =
                std::iter::once((RestartFrom::FIRST_FAILURE.to_owned(), "the first failure".to_owned()))
                    .chain(choices.types.iter().map(|t| (t.clone(), t.clone())))
                    .collect();
            select(out, &format!("{id}-from"), ("from", "From"), &options, choices.preselect);
        }
        _ => w!(
            out,
            "<p><label for=\"{0}-priority\">Priority</label><input id=\"{0}-priority\" name=\"priority\" \
             type=\"number\" step=\"1\" required value=\"{1}\"></p>",
            esc(id),
            esc(priority.unwrap_or(0))
        ),
    }
    true
}

/// A required select named `name` (with its label) of `options` (value, text); a component
/// select starts at `preselect` when it offers it.
fn select(
    out: &mut String,
    id: &str,
    (name, label): (&str, &str),
    options: &[(String, String)],
    preselect: Option<&str>,
) {
    w!(
        out,
        "<p><label for=\"{0}\">{1}</label><select id=\"{0}\" name=\"{2}\" required>",
        esc(id),
        esc(label),
        esc(name)
    );
    let chosen = preselect.filter(|p| name == "component" && options.iter().any(|(value, _)| value == p));
    for (value, text) in options {
        let selected = if chosen == Some(value.as_str()) { " selected" } else { "" };
        w!(out, "<option value=\"{}\"{selected}>{}</option>", esc(value), esc(text));
    }
    out.push_str("</select></p>");
}

pub(super) fn filter_fields(filter: &Filter) -> Vec<(String, String)> {
    let order = match filter.order {
        autocomp_sboi::PageOrder::Priority => "priority",
        _ => "oldest",
    };
    vec![("q".into(), filter.query()), ("order".into(), order.into())]
}
