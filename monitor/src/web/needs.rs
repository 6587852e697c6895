//! The overview's "Needs a person" section, rendered from `crate::needs::Needs`: one line per
//! thing a person has to act on, failures first, each with its next action one click away
//! (the list of those batches, the waiting list, or the steering section where admins act).

use autocomp_model::{ComponentName, Hold};

use super::html::{esc, hold_badge, time, w};
use crate::filter::{Filter, StateFilter};
use crate::needs::{FailuresAt, Needs};

/// The section, to follow the overview's heading.
pub fn section(needs: &Needs) -> String {
    let mut out =
        String::from("<section class=\"needs\" aria-labelledby=\"needs\">\n<h2 id=\"needs\">Needs a person</h2>\n");
    if needs.is_empty() {
        out.push_str("<p class=\"verdict\" id=\"nothing-needed\">Nothing needs a person.</p>\n</section>\n");
        return out;
    }
    out.push_str("<ul class=\"needs-list\">\n");
    for (component, reason) in &needs.contracts {
        w!(
            out,
            "<li class=\"verdict contract-broken\"><strong>{}</strong>: every pass stops before any work, {} — <a \
             href=\"/graph#contracts\">the results and what reads them</a></li>\n",
            esc(component),
            esc(reason)
        );
    }
    for failures in &needs.failures {
        out.push_str(&failed(failures));
    }
    out.push_str(&holds(needs));
    if !needs.person.is_empty() {
        // The words `autocomp` operators know from the waiting list.
        let total: u64 = needs.person.iter().map(|(_, n)| n).sum();
        let each: Vec<String> = needs.person.iter().map(|(step, n)| format!("{step}: {n}")).collect();
        w!(
            out,
            "<li class=\"verdict\">{} batches wait for a person ({}): <a href=\"/waiting\">the list, the longest \
             waiting first</a></li>\n",
            esc(total),
            esc(each.join(", "))
        );
    }
    for (component, count) in &needs.overdue {
        w!(
            out,
            "<li><a href=\"/batches?{}\">{}: {} overdue</a> <small>(ready, waiting for a person or working longer \
             than its threshold)</small></li>\n",
            esc(list(component, StateFilter::Overdue)),
            esc(component),
            esc(count)
        );
    }
    for (component, count) in &needs.stale {
        w!(
            out,
            "<li><a href=\"/batches?{}\">{}: {} stale</a> <small>(worked out from content the batch no longer has; \
             redone once what it requires is current)</small></li>\n",
            esc(list(component, StateFilter::State(autocomp_model::ComponentState::Stale))),
            esc(component),
            esc(count)
        );
    }
    out.push_str("</ul>\n</section>\n");
    out
}

/// The whole pipeline's hold and each component's, with their reasons.
fn holds(needs: &Needs) -> String {
    let mut out = String::new();
    if let Some(hold) = &needs.pipeline_hold {
        w!(
            out,
            "<li class=\"verdict\">The whole pipeline is {}: {} — <a href=\"#steering\">steering</a></li>\n",
            held(hold),
            esc(&hold.reason)
        );
    }
    for (component, hold) in &needs.holds {
        w!(
            out,
            "<li><strong>{}</strong> is {}: {} — <a href=\"#steering\">steering</a></li>\n",
            esc(component),
            held(hold),
            esc(&hold.reason)
        );
    }
    out
}

/// The query of the list of `component`'s batches in `state` (the overview's count links).
fn list(component: &ComponentName, state: StateFilter) -> String {
    Filter::for_state(component, state).url_query()
}

/// `paused by X since T`, the kind as its badge.
fn held(hold: &Hold) -> String {
    format!("{} by <code>{}</code> since {}", hold_badge(hold.kind), esc(&hold.by), time(hold.since))
}

/// One component's failures: the count (a link to their list) and its most frequent reasons.
fn failed(failures: &FailuresAt) -> String {
    let mut out = String::new();
    let component = &failures.component;
    w!(
        out,
        "<li id=\"failed-at-{}\"><a href=\"/batches?{}\">{}: {} failed</a>",
        esc(component),
        esc(list(component, StateFilter::State(autocomp_model::ComponentState::Failed))),
        esc(component),
        esc(failures.total)
    );
    if !failures.reasons.is_empty() {
        out.push_str(" — ");
        for (i, (reason, count)) in failures.reasons.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            match reason {
                Some(text) => w!(out, "<q class=\"failure-summary\">{}</q> ×{}", esc(text), esc(count)),
                None => w!(out, "<em>no summary given</em> ×{}", esc(count)),
            }
        }
        let shown: usize = failures.reasons.iter().map(|(_, n)| n).sum();
        let mut notes = Vec::new();
        if failures.read > shown {
            notes.push(format!("{} with other reasons", failures.read - shown));
        }
        if failures.total > failures.read as u64 {
            notes.push(format!("among the first {} read", failures.read));
        }
        if !notes.is_empty() {
            w!(out, " <small>({})</small>", esc(notes.join(", ")));
        }
    }
    out.push_str("</li>\n");
    out
}
