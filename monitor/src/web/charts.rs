//! The `/charts` page: per component, its results stacked by outcome, its p50/p95 work
//! duration and its backlog (ready count) over the last hour (per minute), 24 hours or 30
//! days (per hour), drawn here as inline SVG (no script), each with its numbers in a table.
//! One `work_series` read per view: it grows with components x steps, never with batches.

use std::sync::Arc;

use autocomp_model::{ComponentName, Timestamp, WorkResult, WorkTallies};
use autocomp_ops::operator::{OperatorError, duration_text};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::app::App;
use super::chart_series::{Range, Series, is_empty, plural, ranged_to_data, series, since};
use super::charts_svg::{Kind, backlog_svg, durations_svg, legend, results_svg};
use super::error::WebError;
use super::gate::Caller;
use super::html::{Nav, esc, w};
use super::svg;
use crate::filter::encode;
/// `/charts?component=NAME&range=hour|day|month`; both optional.
#[derive(Debug, Deserialize, Default)]
pub struct ChartQuery {
    component: Option<String>,
    range: Option<String>,
}

/// A row of the tables behind the charts: a step, or for 30 days a day (UTC) of them.
struct Row {
    when: String,
    tallies: WorkTallies,
    backlog: Option<u64>,
}

/// A step's start in a table: `2026-11-27T02:53Z` (UTC; plain text, a table has many).
fn minute_time(at: Timestamp) -> String {
    esc(svg::minute_text(at)).to_string()
}

fn rows(range: Range, series: &Series) -> Vec<Row> {
    if range != Range::Month {
        return series
            .slots
            .iter()
            .map(|s| Row { when: minute_time(s.at), tallies: s.tallies.clone(), backlog: s.backlog })
            .collect();
    }
    let mut rows: Vec<(String, Row)> = Vec::new();
    for slot in &series.slots {
        let date = svg::date_text(slot.at);
        if rows.last().is_none_or(|(d, _)| *d != date) {
            let when = esc(&date).to_string();
            rows.push((date, Row { when, tallies: WorkTallies::default(), backlog: None }));
        }
        let row = &mut rows.last_mut().expect("pushed").1;
        for result in WorkResult::ALL {
            row.tallies.get_mut(result).add(slot.tallies.get(result));
        }
        row.backlog = slot.backlog.or(row.backlog);
    }
    rows.into_iter().map(|(_, row)| row).collect()
}

/// What the whole window came to, in words.
fn summary(range: Range, series: &Series) -> String {
    let mut all = WorkTallies::default();
    for slot in &series.slots {
        for result in WorkResult::ALL {
            all.get_mut(result).add(slot.tallies.get(result));
        }
    }
    let counts = WorkResult::ALL.map(|r| all.get(r).results);
    let total: u64 = counts.iter().sum();
    let mut out = format!(
        "{} in {}: {} success, {} failure, {} transient",
        plural(total, "result"),
        range.span(),
        counts[0],
        counts[1],
        counts[2]
    );
    let combined = all.combined();
    if let (Some(p50), Some(p95)) = (combined.quantile(0.5), combined.quantile(0.95)) {
        w!(out, "; p50 {}, p95 {}", duration_text(p50), duration_text(p95));
    }
    match series.slots.iter().rev().find_map(|s| s.backlog.map(|b| (b, s.at))) {
        Some((ready, at)) => {
            w!(out, "; backlog {ready} ready (sampled in the {} from {} UTC)", range.per(), svg::minute_text(at))
        }
        None => w!(out, "; no backlog sample in {}", range.span()),
    }
    out.push('.');
    out
}

/// The table of the numbers behind one chart, in a closed `<details>`.
fn table(id: &str, kind: Kind, range: Range, series: &Series, rows: &[Row]) -> String {
    let (first_column, grouping) = match range {
        Range::Hour => ("Minute (UTC)", "per minute".to_owned()),
        Range::Day => ("Hour (UTC)", "per hour".to_owned()),
        Range::Month => (
            "Day (UTC)",
            match kind {
                Kind::Backlog => "per day (UTC): the newest hourly sample of each day".to_owned(),
                _ => "per day (UTC), summed from the hourly tallies; the first and last days are partial".to_owned(),
            },
        ),
    };
    let what = match kind {
        Kind::Results => "Results by outcome",
        Kind::Durations => "Work duration, p50 and p95",
        Kind::Backlog => "Backlog (batches ready)",
    };
    let mut out = String::new();
    w!(
        out,
        "<details class=\"chart-data\" id=\"{id}-data\"><summary>The numbers behind this chart</summary>\n\
         <div class=\"scroll\" role=\"region\" aria-labelledby=\"{id}-caption\" tabindex=\"0\">\n\
         <table class=\"grid chart-table\"><caption id=\"{id}-caption\">{} of {}, {}, {}</caption>\n<thead><tr>\
         <th scope=\"col\">{first_column}</th>",
        esc(what),
        esc(&series.component),
        esc(range.span()),
        esc(grouping)
    );
    match kind {
        Kind::Results => out.push_str(
            "<th scope=\"col\">success</th><th scope=\"col\">failure</th><th scope=\"col\">transient</th>\
             <th scope=\"col\">total</th>",
        ),
        Kind::Durations => {
            out.push_str("<th scope=\"col\">results</th><th scope=\"col\">p50</th><th scope=\"col\">p95</th>")
        }
        Kind::Backlog => out.push_str("<th scope=\"col\">ready</th>"),
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str(&table_row(kind, row));
    }
    out.push_str("</tbody></table>\n</div>\n</details>\n");
    out
}

/// One step's (or day's) numbers of a chart's table.
fn table_row(kind: Kind, row: &Row) -> String {
    let mut out = String::new();
    w!(out, "<tr><th scope=\"row\">{}</th>", row.when);
    match kind {
        Kind::Results => {
            let counts = WorkResult::ALL.map(|r| row.tallies.get(r).results);
            w!(
                out,
                "<td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                counts[0],
                counts[1],
                counts[2],
                counts.iter().sum::<u64>()
            );
        }
        Kind::Durations => {
            let all = row.tallies.combined();
            let q = |q: f64| all.quantile(q).map_or("–".to_owned(), duration_text);
            w!(out, "<td>{}</td><td>{}</td><td>{}</td>", all.results, esc(q(0.5)), esc(q(0.95)));
        }
        Kind::Backlog => match row.backlog {
            Some(ready) => w!(out, "<td>{ready}</td>"),
            None => out.push_str("<td>no sample</td>"),
        },
    }
    out.push_str("</tr>\n");
    out
}

/// One component's three charts, each with its legend and table; `level` is the charts'
/// heading level. Not landmarks: every component has charts of the same names.
fn component_charts(out: &mut String, prefix: &str, range: Range, series: &Series, level: u8) {
    let rows = rows(range, series);
    out.push_str("<div class=\"charts-grid\">\n");
    for kind in Kind::ALL {
        let id = format!("{prefix}-{}", kind.suffix());
        w!(out, "<div class=\"chart\">\n<h{level} id=\"{id}-h\">{}</h{level}>\n", esc(kind.heading(range)));
        out.push_str(&match kind {
            Kind::Results => results_svg(&id, range, series),
            Kind::Durations => durations_svg(&id, range, series),
            Kind::Backlog => backlog_svg(&id, range, series),
        });
        out.push_str(legend(kind));
        out.push_str(&table(&id, kind, range, series, &rows));
        out.push_str("</div>\n");
    }
    out.push_str("</div>\n");
}

fn href(component: Option<&ComponentName>, range: Range) -> String {
    match component {
        Some(c) => format!("/charts?component={}&range={}", encode(c.as_str()), range.as_str()),
        None => format!("/charts?range={}", range.as_str()),
    }
}

/// The range and component switchers: links, the current one marked.
fn switchers(out: &mut String, components: &[ComponentName], chosen: Option<&ComponentName>, range: Range) {
    out.push_str("<nav class=\"chart-switch\" aria-label=\"Range\"><ul>");
    for r in Range::ALL {
        let current = if r == range { " aria-current=\"page\"" } else { "" };
        w!(out, "<li><a href=\"{}\"{current}>{}</a></li>", esc(href(chosen, r)), esc(r.label()));
    }
    out.push_str("</ul></nav>\n<nav class=\"chart-switch\" aria-label=\"Components\"><ul>");
    let current = if chosen.is_none() { " aria-current=\"page\"" } else { "" };
    w!(out, "<li><a href=\"{}\"{current}>All components</a></li>", esc(href(None, range)));
    for c in components {
        let current = if Some(c) == chosen { " aria-current=\"page\"" } else { "" };
        w!(out, "<li><a href=\"{}\"{current}>{}</a></li>", esc(href(Some(c), range)), esc(c));
    }
    out.push_str("</ul></nav>\n");
}

/// The page's body: every component compact, or one with its charts at full width.
pub fn body(range: Range, components: &[ComponentName], chosen: Option<&ComponentName>, all: &[Series]) -> String {
    let mut out = String::new();
    match chosen {
        Some(c) => w!(out, "<h1>Charts: {}</h1>\n", esc(c)),
        None => out.push_str("<h1>Charts</h1>\n"),
    }
    w!(
        out,
        "<p>{}: results by outcome, work duration (p50, p95) and backlog per {}, by the store's clock; times UTC. \
         The registry keeps per-minute tallies for 2 hours and per-hour tallies and backlog samples for 31 days; \
         each monitor samples the backlog (batches ready; at a human step, waiting for a person) once a minute \
         unless its <code>--sample-every</code> says otherwise.</p>\n",
        esc(range.label()),
        esc(range.per())
    );
    if components.is_empty() {
        out.push_str("<p>No component has run a pass against this store yet: there is nothing to chart.</p>\n");
        return out;
    }
    switchers(&mut out, components, chosen, range);
    for (i, series) in all.iter().enumerate() {
        if chosen.is_some() {
            w!(out, "<p class=\"chart-summary\">{}</p>\n", esc(summary(range, series)));
            component_charts(&mut out, "c0", range, series, 2);
        } else {
            let prefix = format!("c{i}");
            if is_empty(series) {
                // Nothing to draw (a source records no work): one line, not three empty charts.
                w!(
                    out,
                    "<section class=\"chart-component\" aria-labelledby=\"{prefix}-name\">\n<h2 id=\"{prefix}-name\">\
                     <a href=\"{}\">{}</a></h2>\n<p class=\"chart-summary\">nothing recorded in {}: no results, no \
                     backlog sample</p>\n</section>\n",
                    esc(href(Some(&series.component), range)),
                    esc(&series.component),
                    esc(range.span())
                );
                continue;
            }
            w!(
                out,
                "<section class=\"chart-component\" aria-labelledby=\"{prefix}-name\">\n<h2 id=\"{prefix}-name\">\
                 <a href=\"{}\">{}</a></h2>\n<p class=\"chart-summary\">{}</p>\n",
                esc(href(Some(&series.component), range)),
                esc(&series.component),
                esc(summary(range, series))
            );
            component_charts(&mut out, &prefix, range, series, 3);
            out.push_str("</section>\n");
        }
    }
    out
}

/// `/charts`: every component of the pipeline (or the one asked for) over the range asked for.
pub async fn page(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    query: Result<Query<ChartQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let query =
        query.map(|Query(q)| q).map_err(|e| WebError::unreadable("query string", e.status(), &e.body_text()))?;
    let range = Range::parse(query.range.as_deref())?;
    let operator = app.monitor.operator();
    let store = operator.store().await?;
    let pipeline = operator.pipeline(store.as_ref()).await?;
    let chosen = match query.component.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
        Some(name) => Some(operator.step(&pipeline, name)?.name().clone()),
        None => None,
    };
    let components: Vec<ComponentName> = pipeline.iter().map(|s| s.name().clone()).collect();
    let now = Timestamp::now();
    let points = if components.is_empty() {
        Vec::new()
    } else {
        store.work_series(range.step(), since(range, now), chosen.as_ref()).await.map_err(OperatorError::from)?
    };
    let shown: Vec<ComponentName> = match &chosen {
        Some(c) => vec![c.clone()],
        None => components.clone(),
    };
    let mut all = series(range, now, &shown, points);
    ranged_to_data(range, &mut all);
    let body = body(range, &components, chosen.as_ref(), &all);
    let title = match &chosen {
        Some(c) => format!("Charts: {c}"),
        None => "Charts".to_owned(),
    };
    Ok(super::respond::respond(&headers, &caller, &title, Nav::Charts, &super::respond::here(&uri), &body))
}

#[cfg(test)]
mod tests {
    use autocomp_model::{WorkDone, WorkPoint};

    use super::*;

    fn name(text: &str) -> ComponentName {
        ComponentName::new(text).unwrap()
    }

    #[test]
    fn ranges_parse_and_a_bad_one_names_the_field() {
        assert_eq!(Range::parse(None).unwrap(), Range::Hour);
        assert_eq!(Range::parse(Some("month")).unwrap().steps(), 720);
        let error = Range::parse(Some("week")).unwrap_err();
        assert_eq!((error.field.as_str(), error.value.as_str()), ("range", "week"));
    }

    #[test]
    fn sparse_points_fill_their_steps_and_the_rest_are_gaps() {
        let now = Timestamp(1_795_000_000_000);
        let a = name("alpha");
        let work = [WorkDone { result: WorkResult::Success, duration_ms: 8 }];
        let points = vec![
            WorkPoint { component: a.clone(), at: now, tallies: WorkTallies::of(&work), backlog: Some(4) },
            WorkPoint { component: name("retired"), at: now, tallies: WorkTallies::default(), backlog: Some(1) },
        ];
        let all = series(Range::Hour, now, std::slice::from_ref(&a), points);
        assert_eq!(all.len(), 1);
        let slots = &all[0].slots;
        assert_eq!(slots.len(), 60);
        assert_eq!(slots[59].backlog, Some(4));
        assert_eq!(slots[59].total(), 1);
        assert!(slots[..59].iter().all(|s| s.backlog.is_none() && s.total() == 0));
        assert_eq!(slots[0].at, since(Range::Hour, now));
        // 30 days: a row per day, the backlog the newest sample of it.
        let month = series(Range::Month, now, std::slice::from_ref(&a), Vec::new());
        let days = rows(Range::Month, &month[0]);
        assert!((30..=31).contains(&days.len()), "{}", days.len());
    }

    #[test]
    fn charts_are_images_with_a_title_and_a_table() {
        let now = Timestamp(1_795_000_000_000);
        let a = name("alpha");
        let all = series(Range::Day, now, std::slice::from_ref(&a), Vec::new());
        let page = body(Range::Day, std::slice::from_ref(&a), Some(&a), &all);
        assert_eq!(page.matches("role=\"img\"").count(), 3);
        assert_eq!(page.matches("<table").count(), 3);
        assert!(page.contains("no results in the last 24 hours"));
        assert!(page.contains("times UTC"));
        // Among all components, one with nothing recorded is one line, not three empty charts.
        let page = body(Range::Day, std::slice::from_ref(&a), None, &all);
        assert_eq!(page.matches("role=\"img\"").count(), 0);
        assert!(page.contains("nothing recorded in the last 24 hours: no results, no backlog sample"), "{page}");
    }

    #[test]
    fn a_short_run_is_charted_across_the_chart_not_as_a_sliver() {
        let now = Timestamp(1_795_000_000_000);
        let a = name("alpha");
        let work = [WorkDone { result: WorkResult::Success, duration_ms: 8 }];
        let minute = 60_000;
        let points = (0..3)
            .map(|k| WorkPoint {
                component: a.clone(),
                at: Timestamp(now.0 - k * minute),
                tallies: WorkTallies::of(&work),
                backlog: None,
            })
            .collect();
        let mut all = series(Range::Hour, now, std::slice::from_ref(&a), points);
        ranged_to_data(Range::Hour, &mut all);
        assert_eq!(all[0].slots.len(), 12, "at least 12 steps, from the data on");
        assert_eq!(all[0].slots.iter().filter(|s| s.total() > 0).count(), 3);
        let mut early = series(
            Range::Hour,
            now,
            std::slice::from_ref(&a),
            vec![WorkPoint {
                component: a.clone(),
                at: Timestamp(now.0 - 50 * minute),
                tallies: WorkTallies::of(&work),
                backlog: None,
            }],
        );
        ranged_to_data(Range::Hour, &mut early);
        assert_eq!(early[0].slots.len(), 51, "from its first step on");
    }
}
