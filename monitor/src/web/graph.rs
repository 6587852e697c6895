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
use super::html::{Nav, esc, w};
use crate::data::{Overview, OverviewRow};
use crate::filter::{Filter, StateFilter};

/// A component's box.
const NODE_W: u32 = 190;
/// A type from outside the pipeline: a smaller box.
const INPUT_W: u32 = 140;
const INPUT_H: u32 = 44;
/// Room between columns, for the edges and their labels.
const GAP_X: u32 = 100;
const GAP_Y: u32 = 18;
const MARGIN: u32 = 12;
/// One line of a node's text.
const LINE: u32 = 16;
const PAD: u32 = 8;
/// The least room between two edges arriving at one node (their labels sit above them).
const PORT_GAP: u32 = 18;
/// Characters shown of a name, a node's second line and an edge's label.
const NAME_CHARS: usize = 21;
const KIND_CHARS: usize = 31;
const LABEL_CHARS: usize = 13;
/// Counts per line of a node, and where the second one starts.
const COUNTS_PER_LINE: usize = 2;
const COUNT_COLUMN: u32 = 88;
/// A graph wider than this scrolls at its own size instead of shrinking to the page.
const WIDE: u32 = 1500;

/// What the layout needs of one component.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub event_type: &'a str,
    pub requires: Vec<&'a str>,
    /// Lines of text in its box.
    pub lines: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// The component of this index in the specs.
    Component(usize),
    /// A required type no component records.
    Input(String),
}

/// A node's box, in the SVG's user units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub kind: NodeKind,
    pub column: u32,
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

#[cfg(test)]
impl Placed {
    /// Whether the two boxes share any area.
    pub fn overlaps(&self, other: &Placed) -> bool {
        self.x < other.x + other.width
            && other.x < self.x + self.width
            && self.y < other.y + other.height
            && other.y < self.y + self.height
    }
}

/// An edge: `event_type` recorded by node `from`, required by node `to` (indexes of
/// `Layout::nodes`), arriving at its `port`-th place of `ports` on `to`'s left side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub event_type: String,
    pub port: u32,
    pub ports: u32,
}

#[derive(Debug, Clone)]
pub struct Layout {
    /// The components in spec order, then the inputs.
    pub nodes: Vec<Placed>,
    pub edges: Vec<Edge>,
    pub width: u32,
    pub height: u32,
}

impl Layout {
    /// Where an edge starts (the producer's right side) and ends (a port on the consumer's left).
    pub fn ends(&self, edge: &Edge) -> ((u32, u32), (u32, u32)) {
        let (from, to) = (&self.nodes[edge.from], &self.nodes[edge.to]);
        let start = (from.x + from.width, from.y + from.height / 2);
        let end = (to.x, to.y + (edge.port + 1) * to.height / (edge.ports + 1));
        (start, end)
    }
}

/// Depth in the `requires` graph, as `pipeline_of` computes it: one more than the deepest
/// producer of a required type, bounded by the number of components (so a cycle ends).
fn depths(specs: &[Spec]) -> Vec<u32> {
    let n = specs.len();
    let mut depth = vec![0u32; n];
    for _ in 0..n {
        for (i, spec) in specs.iter().enumerate() {
            let producers = specs.iter().enumerate().filter(|(_, p)| spec.requires.contains(&p.event_type));
            depth[i] = producers.map(|(j, _)| depth[j] + 1).max().unwrap_or(0).min(n as u32);
        }
    }
    depth
}

/// Places every node: columns by depth (inputs just left of their consumers), each
/// column ordered by where its producers are (fewer crossings) and centred; every box tall
/// enough for its text and for its incoming edges' labels.
pub fn layout(specs: &[Spec]) -> Layout {
    let depth = depths(specs);
    let inputs = inputs(specs, &depth);
    let mut nodes = nodes(specs, &depth, &inputs);
    let mut edges = edges(specs, &depth, &inputs);
    // Ports: the edges into a node, in the order of their producers' columns and rows below.
    let mut incoming = vec![0u32; nodes.len()];
    for edge in &mut edges {
        edge.port = incoming[edge.to];
        incoming[edge.to] += 1;
    }
    for (node, ports) in nodes.iter_mut().zip(&incoming) {
        node.height = node.height.max((ports + 1) * PORT_GAP);
    }
    let columns = nodes.iter().map(|n| n.column + 1).max().unwrap_or(0);
    let tallest = place(&mut nodes, &edges, columns);
    // Ports again: top to bottom by where each edge comes from, so arrivals do not cross.
    for (to, ports) in incoming.iter().enumerate() {
        let mut into: Vec<usize> = (0..edges.len()).filter(|&e| edges[e].to == to).collect();
        into.sort_by_key(|&e| (nodes[edges[e].from].y + nodes[edges[e].from].height / 2, e));
        for (port, e) in into.into_iter().enumerate() {
            edges[e].port = port as u32;
            edges[e].ports = *ports;
        }
    }
    let width = if columns == 0 { 2 * MARGIN } else { 2 * MARGIN + columns * NODE_W + (columns - 1) * GAP_X };
    Layout { nodes, edges, width, height: tallest + 2 * MARGIN }
}

/// Whether a component records `event_type`.
fn produced(specs: &[Spec], event_type: &str) -> bool {
    specs.iter().any(|s| s.event_type == event_type)
}

/// A type no component records: one input node per column of its consumers, just left of
/// them (no long edge from one input across the drawing).
fn inputs<'s>(specs: &'s [Spec], depth: &[u32]) -> Vec<(&'s str, u32)> {
    let mut inputs: Vec<(&str, u32)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        for t in &spec.requires {
            if !produced(specs, t) && !inputs.contains(&(t, depth[i])) {
                inputs.push((t, depth[i]));
            }
        }
    }
    inputs
}

/// The components' and the inputs' boxes, each in its column (no column empty), not yet
/// placed in it.
fn nodes(specs: &[Spec], depth: &[u32], inputs: &[(&str, u32)]) -> Vec<Placed> {
    // Make room in front when a component of the first column requires one.
    let shift = u32::from(inputs.iter().any(|(_, d)| *d == 0));
    let mut nodes: Vec<Placed> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Placed {
            kind: NodeKind::Component(i),
            column: depth[i] + shift,
            x: 0,
            y: 0,
            width: NODE_W,
            height: spec.lines * LINE + 2 * PAD,
        })
        .collect();
    for (t, d) in inputs {
        nodes.push(Placed {
            kind: NodeKind::Input((*t).to_owned()),
            column: d + shift - 1,
            x: 0,
            y: 0,
            width: INPUT_W,
            height: INPUT_H,
        });
    }
    // No empty column (a cycle's bounded depth can leave gaps).
    let mut used: Vec<u32> = nodes.iter().map(|n| n.column).collect();
    used.sort_unstable();
    used.dedup();
    for node in &mut nodes {
        node.column = used.binary_search(&node.column).unwrap_or(0) as u32;
    }
    nodes
}

/// An edge from each producer (or input) of a required type to its consumer.
fn edges(specs: &[Spec], depth: &[u32], inputs: &[(&str, u32)]) -> Vec<Edge> {
    let mut edges = Vec::new();
    for (to, spec) in specs.iter().enumerate() {
        for t in &spec.requires {
            let mut from: Vec<usize> = (0..specs.len()).filter(|&j| j != to && specs[j].event_type == *t).collect();
            if !produced(specs, t) {
                from.extend(inputs.iter().position(|i| *i == (t, depth[to])).map(|k| specs.len() + k));
            }
            for from in from {
                edges.push(Edge { from, to, event_type: (*t).to_owned(), port: 0, ports: 0 });
            }
        }
    }
    edges
}

/// Places the nodes column by column: a node's place follows the mean height of its
/// producers placed so far; each column centred on the tallest, whose height it returns.
fn place(nodes: &mut [Placed], edges: &[Edge], columns: u32) -> u32 {
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); columns as usize];
    let mut heights = vec![0u32; columns as usize];
    for c in 0..columns {
        let mut members: Vec<(f64, usize)> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.column == c)
            .map(|(i, _)| {
                let placed: Vec<f64> = edges
                    .iter()
                    .filter(|e| e.to == i && nodes[e.from].column < c)
                    .map(|e| f64::from(nodes[e.from].y) + f64::from(nodes[e.from].height) / 2.0)
                    .collect();
                let key = if placed.is_empty() { f64::MAX } else { placed.iter().sum::<f64>() / placed.len() as f64 };
                (key, i)
            })
            .collect();
        members.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut y = MARGIN;
        for &(_, i) in &members {
            let node = &mut nodes[i];
            node.x = MARGIN + c * (NODE_W + GAP_X) + (NODE_W - node.width);
            node.y = y;
            y += node.height + GAP_Y;
        }
        heights[c as usize] = (y - MARGIN).saturating_sub(GAP_Y);
        order[c as usize] = members.into_iter().map(|(_, i)| i).collect();
    }
    let tallest = heights.iter().copied().max().unwrap_or(0);
    for (c, members) in order.iter().enumerate() {
        let offset = (tallest - heights[c]) / 2;
        for &i in members {
            nodes[i].y += offset;
        }
    }
    tallest
}

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

/// Lines of a node's text: name, kind, the hold if any, then the counts (or "no batches").
fn lines(row: &OverviewRow, held: bool) -> u32 {
    let counts = shown_counts(row).len().div_ceil(COUNTS_PER_LINE).max(1);
    2 + u32::from(held) + counts as u32
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
         circuit open); a dotted box: a type recorded outside the pipeline.</figcaption>\n\
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
    for edge in &layout.edges {
        let ((sx, sy), (ex, ey)) = layout.ends(edge);
        let bend = (i64::from(ex) - i64::from(sx)).abs().max(80) / 2;
        let from = match &layout.nodes[edge.from].kind {
            NodeKind::Component(i) => rows[*i].component.name().to_string(),
            NodeKind::Input(_) => "outside the pipeline".to_owned(),
        };
        let to = match &layout.nodes[edge.to].kind {
            NodeKind::Component(i) => rows[*i].component.name().to_string(),
            NodeKind::Input(t) => t.clone(),
        };
        w!(
            out,
            "<g class=\"edge\"><title>{}: recorded by {}, required by {}</title><path d=\"M{sx},{sy} C{},{sy} {},{ey} \
             {ex},{ey}\" marker-end=\"url(#graph-arrow)\"/><text class=\"label\" x=\"{}\" y=\"{}\" \
             text-anchor=\"end\">{}</text></g>\n",
            esc(&edge.event_type),
            esc(from),
            esc(to),
            i64::from(sx) + bend,
            i64::from(ex) - bend,
            ex.saturating_sub(8),
            ey.saturating_sub(4),
            esc(truncate(&edge.event_type, LABEL_CHARS))
        );
    }
    for node in &layout.nodes {
        match &node.kind {
            NodeKind::Component(i) => node_svg(&mut out, node, &rows[*i], held[*i]),
            NodeKind::Input(t) => w!(
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
            ),
        }
    }
    out.push_str("</svg>\n</div>\n</figure>\n");
    out
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
    let (x, y, width, height) = (node.x, node.y, node.width, node.height);
    w!(
        out,
        "<g class=\"{classes}\" data-component=\"{}\"><title>{}: {}{}</title>\
         <rect class=\"box\" x=\"{x}\" y=\"{y}\" width=\"{width}\" height=\"{height}\" rx=\"{}\"/>",
        esc(name),
        esc(name),
        esc(&kind),
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
    out.push_str("</g>\n");
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

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("T{i}")).collect()
    }

    /// Specs of `types` where component i records `types[i]` and requires `requires(i)`.
    fn specs<'a>(
        types: &'a [String],
        requires: impl Fn(usize) -> Vec<&'a str>,
        lines: impl Fn(usize) -> u32,
    ) -> Vec<Spec<'a>> {
        (0..types.len()).map(|i| Spec { event_type: &types[i], requires: requires(i), lines: lines(i) }).collect()
    }

    /// No two boxes share area, every box and every edge end is inside the drawing, and the
    /// labels arriving at one node are at least a line apart.
    fn assert_legible(layout: &Layout) {
        let mut columns: Vec<u32> = layout.nodes.iter().map(|n| n.column).collect();
        columns.sort_unstable();
        columns.dedup();
        assert!(columns.iter().enumerate().all(|(i, c)| *c == i as u32), "an empty column: {columns:?}");
        for (i, a) in layout.nodes.iter().enumerate() {
            assert!(a.x + a.width <= layout.width && a.y + a.height <= layout.height, "{a:?} outside the drawing");
            for b in &layout.nodes[i + 1..] {
                assert!(!a.overlaps(b), "{a:?} overlaps {b:?}");
            }
        }
        for edge in &layout.edges {
            let (_, (ex, ey)) = layout.ends(edge);
            let to = &layout.nodes[edge.to];
            assert!(ex == to.x && ey > to.y && ey < to.y + to.height, "{edge:?} ends outside {to:?}");
            for other in layout.edges.iter().filter(|o| o.to == edge.to && o.port != edge.port) {
                let (_, (_, oy)) = layout.ends(other);
                assert!(ey.abs_diff(oy) >= PORT_GAP - 1, "labels of {edge:?} and {other:?} collide");
            }
        }
    }

    #[test]
    fn twenty_components_in_a_chain_a_fan_and_a_lattice_never_overlap() {
        let types = names(20);
        // A chain: each requires the one before; the first requires a type from outside.
        let chain =
            layout(&specs(&types, |i| if i == 0 { vec!["Outside"] } else { vec![types[i - 1].as_str()] }, |_| 4));
        assert_eq!(chain.nodes.len(), 21);
        assert_eq!(chain.edges.len(), 20);
        assert_eq!(chain.nodes[20].kind, NodeKind::Input("Outside".into()));
        assert_eq!(chain.nodes[20].column, 0);
        for i in 0..20 {
            assert_eq!(chain.nodes[i].column, i as u32 + 1);
        }
        assert_legible(&chain);
        // A fan: one source, nineteen consumers of it in one column, all with counts of
        // every state (7 lines).
        let fan = layout(&specs(&types, |i| if i == 0 { vec![] } else { vec![types[0].as_str()] }, |_| 7));
        assert_eq!(fan.nodes.iter().filter(|n| n.column == 1).count(), 19);
        assert_legible(&fan);
        // A lattice: each requires the two before it, and one needs many types.
        let lattice = layout(&specs(
            &types,
            |i| match i {
                0 => vec![],
                1 => vec![types[0].as_str()],
                19 => types[..19].iter().map(String::as_str).collect(),
                _ => vec![types[i - 1].as_str(), types[i - 2].as_str()],
            },
            |i| 2 + (i % 4) as u32,
        ));
        assert_legible(&lattice);
        let last = &lattice.nodes[19];
        assert!(last.height >= 20 * PORT_GAP, "room for 19 arrivals: {last:?}");
    }

    #[test]
    fn depth_follows_pipeline_of_and_a_cycle_ends() {
        let types = names(4);
        // 0 -> 1 -> 2 -> 1 (a cycle between 1 and 2); 3 independent.
        let cycle = layout(&specs(
            &types,
            |i| match i {
                1 => vec![types[0].as_str(), types[2].as_str()],
                2 => vec![types[1].as_str()],
                _ => vec![],
            },
            |_| 3,
        ));
        assert_legible(&cycle);
        assert_eq!(cycle.nodes[0].column, 0);
        assert_eq!(cycle.nodes[3].column, 0);
        assert!(cycle.nodes.iter().all(|n| n.column <= 4), "{:?}", cycle.nodes);
        // A type recorded by two components: an edge from each.
        let two = vec![
            Spec { event_type: "A", requires: vec![], lines: 3 },
            Spec { event_type: "A", requires: vec![], lines: 3 },
            Spec { event_type: "B", requires: vec!["A"], lines: 3 },
        ];
        let both = layout(&two);
        assert_eq!(both.edges.iter().filter(|e| e.to == 2).count(), 2);
        assert_legible(&both);
        assert!(layout(&[]).nodes.is_empty());
        // A type from outside required late: its node just left of its consumer, no column
        // added in front.
        let late = vec![
            Spec { event_type: "A", requires: vec![], lines: 3 },
            Spec { event_type: "B", requires: vec!["A"], lines: 3 },
            Spec { event_type: "C", requires: vec!["B", "Outside"], lines: 3 },
        ];
        let late = layout(&late);
        assert_legible(&late);
        assert_eq!(late.nodes.iter().map(|n| n.column).collect::<Vec<_>>(), vec![0, 1, 2, 1]);
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghijk", 5), "abcd…");
        assert_eq!(truncate("ünïcödé-ñåmé", 4), "ünï…");
    }
}
