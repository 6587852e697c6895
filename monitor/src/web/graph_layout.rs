//! Where the pipeline graph's boxes and arrows go: components in columns by their depth in
//! the `requires` graph (the rule of `autocomp_ops::operator::pipeline_of`), a type no
//! component records as a small input node just left of its consumers, each column ordered
//! by where its producers are and centred, every box tall enough for its text and its
//! arrivals. Plain geometry, apart from how `graph` draws it.

/// A component's box.
const NODE_W: u32 = 190;
/// A type from outside the pipeline: a smaller box.
const INPUT_W: u32 = 140;
const INPUT_H: u32 = 44;
/// Room between columns, for the edges and their labels (a type name of 22 characters).
const GAP_X: u32 = 160;
const GAP_Y: u32 = 18;
const MARGIN: u32 = 12;
/// One line of a node's text.
pub(super) const LINE: u32 = 16;
pub(super) const PAD: u32 = 8;
/// The least room between two edges arriving at one node (their labels sit above them).
const PORT_GAP: u32 = 18;
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
    /// For an edge that passes columns between its ends: the height at which it crosses
    /// them, clear of their boxes.
    pub lane: Option<u32>,
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

    /// The edge's SVG path: a curve from its start to its end, or, with a lane, a curve
    /// into the gap after its producer's column, along the lane past the columns between,
    /// and a curve from the gap before its consumer's column to its end.
    pub fn path(&self, edge: &Edge) -> String {
        let ((sx, sy), (ex, ey)) = self.ends(edge);
        match edge.lane {
            None => {
                let bend = ex.abs_diff(sx).max(80) / 2;
                format!("M{sx},{sy} C{},{sy} {},{ey} {ex},{ey}", sx + bend, ex.saturating_sub(bend))
            }
            Some(lane) => {
                let (x1, x2) = (sx + GAP_X / 2, ex.saturating_sub(GAP_X / 2));
                let turn = GAP_X / 5;
                format!(
                    "M{sx},{sy} C{x1},{sy} {x1},{lane} {},{lane} L{},{lane} C{x2},{lane} {x2},{ey} {ex},{ey}",
                    x1 + turn,
                    x2.saturating_sub(turn)
                )
            }
        }
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
    let mut layout = Layout { nodes, edges, width, height: tallest + 2 * MARGIN };
    route_around_boxes(&mut layout);
    layout
}

/// Gives each edge that passes columns between its ends a lane: a height free of every box
/// of those columns (a gap between two, or above or below them all), the one nearest the
/// middle of its ends; lanes below every box grow the drawing. Edges sharing the space
/// below keep `LANE_GAP` apart.
fn route_around_boxes(layout: &mut Layout) {
    let mut below = 0;
    for e in 0..layout.edges.len() {
        let edge = &layout.edges[e];
        let (from, to) = (layout.nodes[edge.from].column, layout.nodes[edge.to].column);
        if to <= from + 1 {
            continue;
        }
        let ((_, sy), (_, ey)) = layout.ends(edge);
        let mut busy: Vec<(u32, u32)> = layout
            .nodes
            .iter()
            .filter(|n| n.column > from && n.column < to)
            .map(|n| (n.y.saturating_sub(LANE_GAP / 2), n.y + n.height + LANE_GAP / 2))
            .collect();
        busy.sort_unstable();
        let target = (sy + ey) / 2;
        let lowest = busy.iter().map(|(_, bottom)| *bottom).max().unwrap_or(0);
        let lane = match free_height_nearest(&busy, target, lowest) {
            Some(y) => y,
            None => {
                below += 1;
                lowest + below * LANE_GAP
            }
        };
        layout.height = layout.height.max(lane + MARGIN);
        layout.edges[e].lane = Some(lane);
    }
}

/// The height nearest `target`, at least 1 and at most just below `lowest`, that no interval of `busy` (sorted)
/// covers, if any.
fn free_height_nearest(busy: &[(u32, u32)], target: u32, lowest: u32) -> Option<u32> {
    let covered = |y: u32| busy.iter().any(|(top, bottom)| y >= *top && y <= *bottom);
    if !covered(target) && target >= 1 {
        return Some(target);
    }
    // The free heights next to each box: just above its top, just below its bottom (below
    // the lowest is free too, and inside the drawing once it grows to it).
    let candidates = busy.iter().flat_map(|(top, bottom)| [top.saturating_sub(1), bottom + 1]);
    candidates.filter(|y| *y >= 1 && *y <= lowest + 1 && !covered(*y)).min_by_key(|y| y.abs_diff(target))
}

/// The least room between a lane and a box, or two lanes below every box.
const LANE_GAP: u32 = 10;

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
                edges.push(Edge { from, to, event_type: (*t).to_owned(), port: 0, ports: 0, lane: None });
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

    /// The demo's shape: a type required two columns on (Structure_Checked by the
    /// catalogue, past the archiver) goes around the archiver's box, not through it.
    #[test]
    fn an_edge_past_a_column_goes_around_its_boxes() {
        let specs = vec![
            Spec { event_type: "Data_Received", requires: vec![], lines: 3 },
            Spec { event_type: "Structure_Checked", requires: vec!["Data_Received"], lines: 3 },
            Spec { event_type: "Checksums_Verified", requires: vec!["Data_Received"], lines: 3 },
            Spec { event_type: "Data_Archived", requires: vec!["Checksums_Verified", "Structure_Checked"], lines: 6 },
            Spec { event_type: "Catalogued", requires: vec!["Data_Archived", "Structure_Checked"], lines: 3 },
        ];
        let layout = layout(&specs);
        assert_legible(&layout);
        let long = layout.edges.iter().find(|e| e.to == 4 && e.event_type == "Structure_Checked").unwrap();
        let lane = long.lane.expect("an edge past a column has a lane");
        let archiver = &layout.nodes[3];
        assert!(lane < archiver.y || lane > archiver.y + archiver.height, "lane {lane} crosses {archiver:?}");
        assert!(lane < layout.height, "the lane is inside the drawing");
        assert!(layout.edges.iter().filter(|e| e.lane.is_some()).count() == 1, "{:?}", layout.edges);
        assert!(layout.path(long).contains('L'), "{}", layout.path(long));
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
}
