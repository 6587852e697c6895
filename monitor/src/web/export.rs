//! `/batches.csv` and `/batches.ndjson`: every batch of a filter, streamed page by page as
//! the index pages it (never all in memory), with each component's state. The first page is
//! read before answering, so a bad filter is a 400, not a broken download.

use std::sync::Arc;

use autocomp_sboi::PageKey;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, stream};
use serde_json::{Map, Value, json};

use super::app::App;
use super::error::WebError;
use super::list_query::ListQuery;
use crate::data::{Matrix, Monitor, Settings};
use crate::filter::Filter;

/// Batches read per page while exporting.
const EXPORT_PAGE: usize = 500;
/// The most batches one export streams: beyond that, narrow the filter.
const MAX_EXPORT: u64 = 1_000_000;

#[derive(Clone, Copy)]
enum Format {
    Csv,
    Ndjson,
}

pub async fn csv(
    State(app): State<Arc<App>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    export(&app, query, Format::Csv).await
}

pub async fn ndjson(
    State(app): State<Arc<App>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    export(&app, query, Format::Ndjson).await
}

async fn export(
    app: &App,
    query: Result<Query<ListQuery>, QueryRejection>,
    format: Format,
) -> Result<Response, WebError> {
    let query = ListQuery::from(query)?;
    let filter = query.filter()?;
    // The same monitor (and opened store) with larger pages.
    let settings = Settings { page_size: EXPORT_PAGE, ..app.monitor.settings().clone() };
    let monitor = Monitor::new(app.monitor.operator().clone(), settings);
    let first = monitor.matrix(&filter, None).await?;
    if first.total > MAX_EXPORT {
        return Err(WebError::invalid(autocomp_model::InvalidInput::new(
            "q",
            filter.query(),
            format!("selects {} batches; an export streams at most {MAX_EXPORT}: narrow the filter", first.total),
        )));
    }
    let header_text = match format {
        Format::Csv => {
            let mut columns = vec!["id".to_owned(), "type".into(), "priority".into(), "created_at".into()];
            columns.extend(first.components.iter().map(|c| c.to_string()));
            csv_line(&columns.iter().map(|c| csv_cell(c)).collect::<Vec<_>>())
        }
        Format::Ndjson => String::new(),
    };
    let pages = pages(monitor, filter, first, format);
    let head = stream::iter([Ok::<_, std::io::Error>(Bytes::from(header_text))]);
    let body = Body::from_stream(futures_util::StreamExt::chain(head, pages));
    let (content_type, file) = match format {
        Format::Csv => ("text/csv; charset=utf-8", "attachment; filename=\"batches.csv\""),
        Format::Ndjson => ("application/x-ndjson", "attachment; filename=\"batches.ndjson\""),
    };
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_DISPOSITION, file),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response())
}

/// The export's body after its header: the first page, then each next page of the filter
/// read as the client takes the previous one.
fn pages(
    monitor: Monitor,
    filter: Filter,
    first: Matrix,
    format: Format,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    // Bounded: each page moves the cursor forward; at most MAX_EXPORT batches in all.
    let max_pages = MAX_EXPORT as usize / EXPORT_PAGE + 2;
    let state = Some((monitor, filter, Some(first), None::<PageKey>, 0usize));
    stream::unfold(state, move |state| async move {
        let (monitor, filter, ready, after, done) = state?;
        let page = match ready {
            Some(page) => page,
            None => match monitor.matrix(&filter, after).await {
                Ok(page) => page,
                Err(error) => {
                    // The body ends without its last chunk: the client sees a failed download.
                    tracing::warn!("export of {:?} stopped: {error}", filter.query());
                    return Some((Err(std::io::Error::other(error.to_string())), None));
                }
            },
        };
        let chunk = Bytes::from(render(&page, format));
        let next = match page.next {
            Some(key) if done + 1 < max_pages => Some((monitor, filter, None, Some(key), done + 1)),
            _ => None,
        };
        Some((Ok::<_, std::io::Error>(chunk), next))
    })
}

fn render(page: &Matrix, format: Format) -> String {
    let mut out = String::new();
    for row in &page.rows {
        let b = &row.batch;
        match format {
            Format::Csv => {
                let mut cells = vec![
                    csv_cell(b.id.as_str()),
                    csv_cell(b.batch_type.as_str()),
                    // A number the monitor formats itself: never a formula, and `'-3` would not be a number.
                    b.priority.to_string(),
                    csv_cell(&b.created_at.to_string()),
                ];
                cells.extend(row.cells.iter().map(|cell| csv_cell(cell.state.as_str())));
                out.push_str(&csv_line(&cells));
            }
            Format::Ndjson => {
                let components: Map<String, Value> = page
                    .components
                    .iter()
                    .zip(&row.cells)
                    .map(|(c, cell)| (c.to_string(), json!(cell.state.as_str())))
                    .collect();
                let overdue: Vec<String> = page
                    .components
                    .iter()
                    .zip(&row.cells)
                    .filter(|(_, cell)| cell.overdue)
                    .map(|(c, _)| c.to_string())
                    .collect();
                // How long it has been in the pipeline, as the list's column: keys are
                // named, so adding them breaks no reader (the CSV's columns are positional
                // and stay as they were).
                let last_activity = b.listing.summary.last_activity;
                let line = json!({
                    "id": b.id, "type": b.batch_type, "priority": b.priority, "created_at": b.created_at,
                    "last_activity": last_activity,
                    "in_pipeline_seconds": row.in_pipeline_until(page.now).since(b.created_at).as_secs(),
                    "components": components, "overdue": overdue,
                });
                out.push_str(&line.to_string());
                out.push('\n');
            }
        }
    }
    out
}

fn csv_line(cells: &[String]) -> String {
    format!("{}\r\n", cells.join(","))
}

/// One text cell, quoted when it needs to be (RFC 4180); a cell a spreadsheet would run as
/// a formula (starting with `= + - @`, or a tab or carriage return) gets a leading `'`.
fn csv_cell(text: &str) -> String {
    let guarded = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{text}") } else { text.to_owned() };
    if guarded.contains([',', '"', '\n', '\r']) { format!("\"{}\"", guarded.replace('"', "\"\"")) } else { guarded }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_quoted_and_formulas_defused() {
        assert_eq!(csv_cell("B1"), "B1");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_cell("+1"), "'+1");
        assert_eq!(csv_cell("-1"), "'-1");
        assert_eq!(csv_cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_cell("line\nbreak"), "\"line\nbreak\"");
    }
}
