//! `autocomp status`: per batch, each component's state (or one component's), read from
//! summaries a page at a time and never from logs; as a table, CSV or JSON, each written row
//! by row. The view, its JSON row (`StatusRow`), its text and the command.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use autocomp_model::{BatchId, ComponentName, ComponentState, SummaryAt, Timestamp};
use serde::Serialize;

use super::views::{PAGE, TableFormat};
use super::{Operator, OperatorError, Step};

/// The widest `status` table (in columns) that names its components in its header: a
/// terminal of 100 columns shows it unwrapped.
const MAX_TABLE_WIDTH: usize = 100;

/// `autocomp status`: per batch, each component's state.
#[derive(Debug, Clone)]
pub struct StatusView {
    pub components: Vec<ComponentName>,
    pub rows: Vec<(BatchId, Vec<ComponentState>)>,
    /// The holds on the pipeline (`hold_lines`), written under the table.
    pub held: Vec<String>,
    /// The shown components no pass of which starts, their contract broken: `access-copy:
    /// <why>`, under the table (a batch ready for one stays ready, and is not worked on).
    pub refused: Vec<String>,
}

/// One batch in `status --format json`: its id and each component's state by name.
#[derive(Serialize)]
pub struct StatusRow<'a> {
    pub id: &'a BatchId,
    pub components: BTreeMap<&'a ComponentName, ComponentState>,
}

impl StatusView {
    /// Written row by row into the output, never as a tree of values or cells first: a
    /// store of 200,000 batches renders in tens of megabytes, not hundreds.
    pub fn render(&self, format: TableFormat) -> String {
        match format {
            TableFormat::Json => self.json(),
            TableFormat::Csv => self.csv(),
            TableFormat::Table => self.table(),
        }
    }

    /// The rows as `json_document` would print the array they make, one row at a time: a
    /// row's pretty document indented one level.
    fn json(&self) -> String {
        if self.rows.is_empty() {
            return "[]\n".into();
        }
        let mut out = String::with_capacity(self.rows.len() * (40 + 30 * self.components.len()));
        out.push('[');
        for (n, (id, states)) in self.rows.iter().enumerate() {
            let row = StatusRow { id, components: self.components.iter().zip(states.iter().copied()).collect() };
            let row = serde_json::to_value(row).unwrap_or_default();
            out.push_str(if n == 0 { "\n" } else { ",\n" });
            for (i, line) in format!("{row:#}").lines().enumerate() {
                out.push_str(if i == 0 { "  " } else { "\n  " });
                out.push_str(line);
            }
        }
        out.push_str("\n]\n");
        out
    }

    /// Ids, component names and states are all [A-Za-z0-9._-]: nothing to quote.
    fn csv(&self) -> String {
        let mut out = String::from("id");
        for name in &self.components {
            write!(out, ",{name}").ok();
        }
        out.push('\n');
        for (id, states) in &self.rows {
            out.push_str(id.as_str());
            for state in states {
                write!(out, ",{state}").ok();
            }
            out.push('\n');
        }
        out
    }

    /// As `table` lays it out: left-aligned columns two spaces apart; the holds under it.
    /// A table that would pass `MAX_TABLE_WIDTH` columns with the components' names as its
    /// headers numbers them instead (`1`, `2`, ...), with a legend line above it; one still
    /// too wide is transposed: a block per batch, a line per component.
    fn table(&self) -> String {
        let names: Vec<String> = self.components.iter().map(ComponentName::to_string).collect();
        if self.table_width(&names) <= MAX_TABLE_WIDTH {
            return self.laid_out(&names);
        }
        let numbers: Vec<String> = (1..=names.len()).map(|n| n.to_string()).collect();
        if self.table_width(&numbers) > MAX_TABLE_WIDTH {
            return self.transposed();
        }
        let each: Vec<String> = numbers.iter().zip(&names).map(|(n, name)| format!("{n}={name}")).collect();
        format!("components: {}\n{}", each.join(" "), self.laid_out(&numbers))
    }

    /// The holds on the pipeline and the components refused by a broken contract, under the
    /// table: no new work is claimed, no pass starts.
    fn held_text(&self) -> String {
        let mut out = String::new();
        if !self.held.is_empty() {
            out.push_str("\nheld (no new work is claimed):\n");
            for held in &self.held {
                writeln!(out, "  {held}").ok();
            }
        }
        if !self.refused.is_empty() {
            out.push_str("\nrefused (no pass starts; the batches ready for it stay ready):\n");
            for refused in &self.refused {
                writeln!(out, "  {refused}").ok();
            }
        }
        out
    }

    /// A block per batch: its id, then a line per component with its state; the holds under.
    fn transposed(&self) -> String {
        let width = self.components.iter().map(|c| c.as_str().len()).max().unwrap_or(0);
        let mut out = String::new();
        for (n, (id, states)) in self.rows.iter().enumerate() {
            out.push_str(if n == 0 { "" } else { "\n" });
            writeln!(out, "{id}").ok();
            for (component, state) in self.components.iter().zip(states) {
                writeln!(out, "  {:<width$}  {state}", component.as_str()).ok();
            }
        }
        out.push_str(&self.held_text());
        out
    }

    /// How wide the table is with `headers` over the component columns.
    fn table_width(&self, headers: &[String]) -> usize {
        self.widths(headers).iter().map(|w| w + 2).sum::<usize>().saturating_sub(2)
    }

    /// Each column's width: the batch ids', then each component's (its header or its states).
    fn widths(&self, headers: &[String]) -> Vec<usize> {
        let mut widths: Vec<usize> = std::iter::once("batch".len()).chain(headers.iter().map(String::len)).collect();
        for (id, states) in &self.rows {
            widths[0] = widths[0].max(id.as_str().len());
            for (width, state) in widths[1..].iter_mut().zip(states) {
                *width = (*width).max(state.as_str().len());
            }
        }
        widths
    }

    /// The table with `headers` over the component columns.
    fn laid_out(&self, headers: &[String]) -> String {
        let widths = self.widths(headers);
        let line_length = widths.iter().map(|w| w + 2).sum::<usize>();
        let mut out = String::with_capacity((self.rows.len() + 1) * line_length);
        let mut line = |cells: &mut dyn Iterator<Item = &str>| {
            let start = out.len();
            for (cell, width) in cells.zip(&widths) {
                write!(out, "{cell:<width$}  ").ok();
            }
            out.truncate(out[start..].trim_end().len() + start);
            out.push('\n');
        };
        line(&mut std::iter::once("batch").chain(headers.iter().map(String::as_str)));
        for (id, states) in &self.rows {
            line(&mut std::iter::once(id.as_str()).chain(states.iter().map(|s| s.as_str())));
        }
        out.push_str(&self.held_text());
        out
    }

    /// Every batch (or those where the component, or any component, is in `state`), with
    /// each component's state (or only `component`'s).
    pub async fn read(
        operator: &Operator,
        component: Option<&ComponentName>,
        state: Option<ComponentState>,
    ) -> Result<StatusView, OperatorError> {
        let store = operator.store().await?;
        let pipeline = operator.pipeline(store.as_ref()).await?;
        let steps: Vec<&Step> = match component {
            Some(name) => vec![operator.step_named(&pipeline, name)?],
            None => pipeline.iter().collect(),
        };
        // Summaries a page at a time, never a log: a summary holds all a state depends on.
        // Time-based clauses are evaluated at this host's clock as the page is read.
        let (mut rows, mut after) = (Vec::new(), None::<BatchId>);
        loop {
            let page = store.list_summaries(after.as_ref(), PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            let at = Timestamp::now();
            rows.extend(
                page.iter()
                    .map(|summary| {
                        let facts = SummaryAt { summary, at };
                        (summary.id.clone(), steps.iter().map(|step| step.state_of(&facts)).collect::<Vec<_>>())
                    })
                    .filter(|(_, states)| state.is_none_or(|wanted| states.contains(&wanted))),
            );
        }
        let held = super::hold_lines(&store.steering().await?);
        let refused = steps
            .iter()
            .filter_map(|step| Some(format!("{}: {}", step.name(), step.broken_contract(&pipeline)?)))
            .collect();
        Ok(StatusView { components: steps.iter().map(|s| s.name().clone()).collect(), rows, held, refused })
    }
}

impl Operator {
    /// `autocomp status`: see `StatusView::read`.
    pub async fn status(
        &self,
        component: Option<&ComponentName>,
        state: Option<ComponentState>,
    ) -> Result<StatusView, OperatorError> {
        StatusView::read(self, component, state).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch in the states of a pipeline at work (the longest, `acknowledged`, aside).
    fn view(names: &[&str]) -> StatusView {
        let components: Vec<ComponentName> = names.iter().map(|n| ComponentName::new(*n).unwrap()).collect();
        let cycle = [ComponentState::Success, ComponentState::Failed, ComponentState::Waiting, ComponentState::Working];
        let states = (0..components.len()).map(|i| cycle[i % cycle.len()]).collect();
        let rows = vec![(BatchId::new("B400022028244-RT1").unwrap(), states)];
        StatusView { components, rows, held: Vec::new(), refused: Vec::new() }
    }

    #[test]
    fn a_table_too_wide_even_numbered_is_a_block_per_batch() {
        let mut seven = view(&["a1", "b2", "c3", "d4", "e5", "f6", "g7", "h8"]);
        seven.rows[0].1 = vec![ComponentState::Acknowledged; 8];
        let text = seven.render(TableFormat::Table);
        assert!(text.starts_with("B400022028244-RT1\n  a1  acknowledged\n"), "{text}");
        assert!(text.lines().all(|line| line.chars().count() <= 100), "{text}");
    }

    #[test]
    fn a_table_too_wide_for_100_columns_numbers_its_components() {
        let seven = view(&[
            "batch-trigger",
            "checksum-verifier",
            "structure-checker",
            "virus-scanner",
            "archiver",
            "catalogue",
            "roundtrip-qa",
        ]);
        let table = seven.render(TableFormat::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("components: 1=batch-trigger 2=checksum-verifier"), "{table}");
        assert!(lines[1].starts_with("batch              1        2       3        4  "), "{table}");
        assert!(lines[1..].iter().all(|line| line.chars().count() <= 100), "{table}");

        let two = view(&["archiver", "catalogue"]).render(TableFormat::Table);
        assert!(two.starts_with("batch              archiver  catalogue\n"), "names fit: {two}");
    }
}
