//! The pipeline as a graph: an inline SVG drawn on the server from the overview's data (no
//! store read of its own, no script). Components are nodes laid out left to right by their
//! depth in the `requires` graph (the rule of `autocomp_ops::operator::pipeline_of`), stacked
//! within a column; each required type is an edge from the component recording it to the one
//! requiring it, labelled with the type; a type no component records is a small input node.
//! Sources, human steps and held components are drawn (and worded) distinctly, and each node
//! lists its non-zero counts by state, each a link to its list. The `/graph` page shows it,
//! and under it the results the steps publish and what reads them (`contracts`).

use std::sync::Arc;

use autocomp_model::HoldKind;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::app::App;
use super::error::WebError;
use super::gate::Caller;
use super::graph_layout::{LINE, Layout, NodeKind, PAD, Placed, Spec, layout};
use super::html::{Nav, esc, w};
use crate::data::{Overview, OverviewRow};
use crate::filter::{Filter, StateFilter};

/// Characters shown of a name, a node's second line and an edge's label.
const NAME_CHARS: usize = 24;
const KIND_CHARS: usize = 31;
const LABEL_CHARS: usize = 22;
/// Counts per line of a node, and where the second one starts.
const COUNTS_PER_LINE: usize = 2;
const COUNT_COLUMN: u32 = 88;
/// A graph wider than this scrolls at its own size instead of shrinking to the page.
const WIDE: u32 = 1500;

/// At most `max` characters, an ellipsis marking a cut.
fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The non-zero counts of a row, in `StateFilter::ALL` order.
fn shown_counts(row: &OverviewRow) -> Vec<(StateFilter, u64)> {
    row.counts.iter().copied().filter(|(_, n)| *n > 0).collect()
}

fn hold_class(kind: HoldKind) -> &'static str {
    match kind {
        HoldKind::Pause => "paused",
        HoldKind::Drain => "draining",
        HoldKind::Circuit => "circuit",
    }
}

/// Lines of a node's text: name, kind, its pools if any, the hold if any, then the counts
/// (or "no batches").
fn lines(row: &OverviewRow, held: bool) -> u32 {
    let counts = shown_counts(row).len().div_ceil(COUNTS_PER_LINE).max(1);
    let pools = !row.component.descriptor.pools.is_empty();
    2 + u32::from(pools) + u32::from(held) + counts as u32
}

/// The pools a component's work takes a slot of, named: `tape, robot`.
fn pool_names(row: &OverviewRow) -> Option<String> {
    let names: Vec<&str> = row.component.descriptor.pools.iter().map(|p| p.as_str()).collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// What the second line of a node says it is.
fn kind_words(row: &OverviewRow) -> String {
    let d = &row.component.descriptor;
    let what = match (d.source, d.manual) {
        (true, _) => "source · ",
        (_, true) => "human step · ",
        _ => "",
    };
    format!("{what}records {}", d.event_type)
}

/// The pipeline graph of `overview` as a figure: a caption with the key, and the SVG in a
/// region that scrolls when the graph is wider than the page. Empty without components.
pub fn svg(overview: &Overview) -> String {
    if overview.rows.is_empty() {
        return String::new();
    }
    let rows = &overview.rows;
    let held: Vec<Option<HoldKind>> =
        rows.iter().map(|r| overview.steering.hold_of(r.component.name()).map(|h| h.kind)).collect();
    let specs: Vec<Spec> = rows
        .iter()
        .zip(&held)
        .map(|(row, hold)| {
            let d = &row.component.descriptor;
            Spec {
                event_type: d.event_type.as_str(),
                requires: d.trigger.requires.iter().map(|t| t.as_str()).collect(),
                lines: lines(row, hold.is_some()),
            }
        })
        .collect();
    let layout = layout(&specs);
    let mut out = String::new();
    w!(
        out,
        "<figure class=\"graph\" id=\"graph\">\n<figcaption id=\"graph-caption\">Pipeline graph: {} components, left to \
         right in the order their events are required; each arrow is a required event type. Each count lists its \
         batches. Rounded ends: a source; a double border: a human step; a dashed border: held (paused, draining or \
         circuit open); a dotted box: a type recorded outside the pipeline; ▣ the resource pools its work takes a \
         slot of. An arrow passing other steps goes around them.</figcaption>\n\
         <div class=\"scroll\" role=\"region\" aria-labelledby=\"graph-caption\" tabindex=\"0\">\n\
         <svg class=\"{}\" role=\"group\" aria-labelledby=\"graph-title\" \
         width=\"{2}\" height=\"{3}\" viewBox=\"0 0 {2} {3}\">\n<title id=\"graph-title\">Pipeline graph of {0} \
         components</title>\n<defs><marker id=\"graph-arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" \
         markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path class=\"arrow\" d=\"M0,0 L10,5 L0,10 z\"/>\
         </marker></defs>\n",
        esc(rows.len()),
        if layout.width > WIDE { "wide" } else { "fits" },
        esc(layout.width),
        esc(layout.height)
    );
    // Edges first, so boxes and labels are drawn over them.
    edges_svg(&mut out, &layout, rows);
    for node in &layout.nodes {
        match &node.kind {
            NodeKind::Component(i) => node_svg(&mut out, node, &rows[*i], held[*i]),
            NodeKind::Input(t) => input_svg(&mut out, node, t),
        }
    }
    out.push_str("</svg>\n</div>\n</figure>\n");
    out
}

/// The arrows, each a required type from the node recording it to the one requiring it,
/// labelled with the type.
fn edges_svg(out: &mut String, layout: &Layout, rows: &[OverviewRow]) {
    // The reads whose contract is broken, as (reader, event type): their arrow is drawn so.
    let descriptors: Vec<&autocomp_model::ComponentDescriptor> = rows.iter().map(|r| &r.component.descriptor).collect();
    let broken: Vec<(String, String)> = descriptors
        .iter()
        .flat_map(|reader| autocomp_model::check_reads(reader, &descriptors))
        .filter(|check| check.broken().is_some())
        .map(|check| (check.reader.name.to_string(), check.read.event_type.to_string()))
        .collect();
    for edge in &layout.edges {
        let (_, (ex, ey)) = layout.ends(edge);
        let from = match &layout.nodes[edge.from].kind {
            NodeKind::Component(i) => rows[*i].component.name().to_string(),
            NodeKind::Input(_) => "outside the pipeline".to_owned(),
        };
        let to = match &layout.nodes[edge.to].kind {
            NodeKind::Component(i) => rows[*i].component.name().to_string(),
            NodeKind::Input(t) => t.clone(),
        };
        let is_broken = broken.iter().any(|(reader, t)| *reader == to && *t == edge.event_type);
        let (class, note) = match is_broken {
            true => ("edge broken", "; contract broken: the reader's passes stop before any work"),
            false => ("edge", ""),
        };
        w!(
            out,
            "<g class=\"{}\"><title>{}: recorded by {}, required by {}{}</title><path d=\"{}\" \
             marker-end=\"url(#graph-arrow)\"/><text class=\"label\" x=\"{}\" y=\"{}\" \
             text-anchor=\"end\">{}</text></g>\n",
            class,
            esc(&edge.event_type),
            esc(from),
            esc(&to),
            note,
            layout.path(edge),
            ex.saturating_sub(8),
            ey.saturating_sub(4),
            esc(truncate(&edge.event_type, LABEL_CHARS))
        );
    }
}

/// A type no component records: a small box saying it comes from outside.
fn input_svg(out: &mut String, node: &Placed, t: &str) {
    w!(
        out,
        "<g class=\"node input\"><title>{0}: recorded by no component of the pipeline</title>\
         <rect x=\"{1}\" y=\"{2}\" width=\"{3}\" height=\"{4}\" rx=\"6\"/>\
         <text class=\"name\" x=\"{5}\" y=\"{6}\">{7}</text>\
         <text class=\"kind\" x=\"{5}\" y=\"{8}\">from outside</text></g>\n",
        esc(t),
        node.x,
        node.y,
        node.width,
        node.height,
        node.x + PAD,
        node.y + PAD + 10,
        esc(truncate(t, 20)),
        node.y + PAD + 10 + LINE
    );
}

/// One component's box: shape by kind, name, what it records, its hold, its counts as links.
fn node_svg(out: &mut String, node: &Placed, row: &OverviewRow, hold: Option<HoldKind>) {
    let d = &row.component.descriptor;
    let name = row.component.name();
    let mut classes = String::from("node component");
    if d.source {
        classes.push_str(" source");
    }
    if d.manual {
        classes.push_str(" human");
    }
    if hold.is_some() {
        classes.push_str(" held");
    }
    let kind = kind_words(row);
    let hold_words = hold.map(|k| format!("; {}", k.as_str())).unwrap_or_default();
    let pool_words = pool_names(row).map(|p| format!("; takes a slot of {p}")).unwrap_or_default();
    let (x, y, width, height) = (node.x, node.y, node.width, node.height);
    w!(
        out,
        "<g class=\"{classes}\" data-component=\"{}\"><title>{}: {}{}{}</title>\
         <rect class=\"box\" x=\"{x}\" y=\"{y}\" width=\"{width}\" height=\"{height}\" rx=\"{}\"/>",
        esc(name),
        esc(name),
        esc(&kind),
        esc(pool_words),
        esc(hold_words),
        if d.source { 18 } else { 4 }
    );
    if d.manual {
        w!(
            out,
            "<rect class=\"inner\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"2\"/>",
            x + 3,
            y + 3,
            width - 6,
            height - 6
        );
    }
    let left = x + PAD + if d.source { 6 } else { 0 };
    let mut line = y + PAD + 12;
    w!(out, "<text class=\"name\" x=\"{left}\" y=\"{line}\">{}</text>", esc(truncate(name.as_str(), NAME_CHARS)));
    line += LINE;
    w!(out, "<text class=\"kind\" x=\"{left}\" y=\"{line}\">{}</text>", esc(truncate(&kind, KIND_CHARS)));
    if let Some(pools) = pool_names(row) {
        line += LINE;
        let pools = format!("▣ pool {pools}");
        w!(out, "<text class=\"pools\" x=\"{left}\" y=\"{line}\">{}</text>", esc(truncate(&pools, KIND_CHARS)));
    }
    if let Some(kind) = hold {
        line += LINE;
        w!(
            out,
            "<text class=\"hold-text hold-{}\" x=\"{left}\" y=\"{line}\">{} {}</text>",
            hold_class(kind),
            match kind {
                HoldKind::Pause => "‖",
                HoldKind::Drain => "⤓",
                HoldKind::Circuit => "⊘",
            },
            esc(kind.as_str())
        );
    }
    counts_svg(out, row, left, line);
    out.push_str("</g>\n");
}

/// A node's counts by state, from the line after `line`, each a link to its batches; or
/// "no batches".
fn counts_svg(out: &mut String, row: &OverviewRow, left: u32, mut line: u32) {
    let name = row.component.name();
    let counts = shown_counts(row);
    if counts.is_empty() {
        line += LINE;
        w!(out, "<text class=\"none\" x=\"{left}\" y=\"{line}\">no batches</text>");
    }
    for (k, (state, count)) in counts.iter().enumerate() {
        if k % COUNTS_PER_LINE == 0 {
            line += LINE;
        }
        let cx = left + (k % COUNTS_PER_LINE) as u32 * COUNT_COLUMN;
        let class = match state {
            StateFilter::State(s) => format!("state-{}", s.as_str()),
            StateFilter::Overdue => "overdue-text".to_owned(),
        };
        w!(
            out,
            "<a href=\"/batches?{}\" aria-label=\"{} {} at {}\"><text class=\"count {class}\" x=\"{cx}\" \
             y=\"{line}\">{} {}</text></a>",
            esc(Filter::for_state(name, *state).url_query()),
            esc(count),
            esc(state.as_str()),
            esc(name),
            esc(count),
            esc(state.as_str())
        );
    }
}

/// `/graph`: the pipeline graph alone, from the overview's own reads.
pub async fn page(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, WebError> {
    let overview = app.monitor.overview().await?;
    let mut body = String::from("<h1>Pipeline graph</h1>\n");
    if overview.rows.is_empty() {
        body.push_str("<p>No component has run a pass against this store yet: the pipeline is empty.</p>\n");
    } else {
        w!(
            body,
            "<p>{} batches in the store; store head seq {}. The same counts as the <a href=\"/\">overview</a>.</p>\n",
            esc(overview.batches),
            esc(overview.head)
        );
        body.push_str(&svg(&overview));
        body.push_str(&super::contracts::section(&overview));
    }
    Ok(super::respond::respond(&headers, &caller, "Pipeline graph", Nav::Graph, &super::respond::here(&uri), &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghijk", 5), "abcd…");
        assert_eq!(truncate("ünïcödé-ñåmé", 4), "ünï…");
    }
}
