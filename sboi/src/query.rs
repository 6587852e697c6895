//! Translates a `Trigger`, and a monitor's `Selection`, into a tantivy query over the fields
//! of `document.rs`. Each clause maps to exact terms or one range; the property tests hold
//! these equal to `Trigger::select` and `Selection::matches_at`. `blocked_by` reads the
//! vocabulary of the commit being searched (see `document::Vocabulary`). Also the documents
//! of one page of the store's listing, which a reconcile compares with it (`listing_page`).

use std::ops::Bound;

use std::time::Duration;

use autocomp_model::{BatchId, EventType, Selection, Timestamp, Trigger};
use tantivy::Term;
use tantivy::query::{AllQuery, BooleanQuery, EmptyQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::IndexRecordOption;

use crate::document::{Fields, Vocabulary, acknowledged_term};

/// The query shape `blocked_by` takes: the index's own (`Absent`), or the one of schema
/// version 1 kept for the benchmark's before/after comparison on one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockedBy {
    /// `Must absent:T` for a type in the vocabulary; nothing for any other (no document has it).
    Absent,
    /// `MustNot present:T` under `AllQuery`: walks every document the other clauses match.
    MustNotPresent,
}

/// The documents of one page of the store's listing in id order: the ids after `after` up
/// to `through` included, or to the last id without it. Like the store's listing, the first
/// page starts after the empty id, which sorts before every batch id (none is empty): so the
/// range always has a lower end, a term of the id field, whatever the page. A range of
/// tantivy's with neither end names no field, and its search panics.
pub fn listing_page(fields: &Fields, after: Option<&BatchId>, through: Option<&BatchId>) -> RangeQuery {
    let lower = Bound::Excluded(Term::from_field_text(fields.id, after.map_or("", BatchId::as_str)));
    let upper = through.map_or(Bound::Unbounded, |through| Bound::Included(fields.id_term(through)));
    RangeQuery::new(lower, upper)
}

pub fn trigger_query(
    fields: &Fields,
    trigger: &Trigger,
    now: Timestamp,
    vocabulary: &Vocabulary,
    blocked_by: BlockedBy,
) -> Box<dyn Query> {
    let term = |field, text: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, text), IndexRecordOption::Basic))
    };
    let any_of = |field, values: Vec<&str>| -> Box<dyn Query> {
        Box::new(BooleanQuery::new(values.into_iter().map(|v| (Occur::Should, term(field, v))).collect()))
    };

    let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
    if !trigger.types.is_empty() {
        clauses.push((Occur::Must, any_of(fields.batch_type, trigger.types.iter().map(|t| t.as_str()).collect())));
    }
    if !trigger.batches.is_empty() {
        clauses.push((Occur::Must, any_of(fields.id, trigger.batches.iter().map(|b| b.as_str()).collect())));
    }
    for required in &trigger.requires {
        clauses.push((Occur::Must, term(fields.succeeded, required.as_str())));
    }
    for blocking in &trigger.blocked_by {
        match blocked_by {
            BlockedBy::Absent if vocabulary.contains(blocking.as_str()) => {
                clauses.push((Occur::Must, term(fields.absent, blocking.as_str())))
            }
            BlockedBy::Absent => {}
            BlockedBy::MustNotPresent => clauses.push((Occur::MustNot, term(fields.present, blocking.as_str()))),
        }
    }
    // "no effective event, or one older than the content" = "no effective event that is current".
    for repeated in &trigger.repeat_on_change {
        clauses.push((Occur::MustNot, term(fields.current, repeated.as_str())));
    }
    for retried in &trigger.transiently_failed {
        clauses.push((Occur::Must, term(fields.transient, retried.as_str())));
    }
    if let Some(quiet) = trigger.settled_for.filter(|quiet| !quiet.is_zero()) {
        clauses.push((Occur::Must, quiet_for(fields, quiet, now)));
    }
    // A batch whose history was pruned is ready for nothing (`Trigger::failing_clause`).
    clauses.push((Occur::MustNot, term(fields.present, EventType::HISTORY_PRUNED)));
    all_unless_positive(clauses)
}

/// tantivy refuses a purely negative query, so one without a positive clause starts from
/// all documents; one with a positive clause does not, since `AllQuery` would make the
/// intersection walk every document.
fn all_unless_positive(mut clauses: Vec<(Occur, Box<dyn Query>)>) -> Box<dyn Query> {
    if !clauses.iter().any(|(occur, _)| *occur == Occur::Must) {
        clauses.push((Occur::Must, Box::new(AllQuery)));
    }
    Box::new(BooleanQuery::new(clauses))
}

/// No content change and no event for at least `quiet` at store time `now`.
fn quiet_for(fields: &Fields, quiet: Duration, now: Timestamp) -> Box<dyn Query> {
    // Store times are whole milliseconds: "at least 1.5 ms ago" means "at least 2 ms ago".
    let quiet_ms = i64::try_from(quiet.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
    let latest = now.millis().saturating_sub(quiet_ms);
    Box::new(RangeQuery::new(Bound::Unbounded, Bound::Included(Term::from_field_i64(fields.last_activity, latest))))
}

pub fn selection_query(
    fields: &Fields,
    selection: &Selection,
    now: Timestamp,
    vocabulary: &Vocabulary,
) -> Box<dyn Query> {
    let term = |field, text: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, text), IndexRecordOption::Basic))
    };
    match selection {
        Selection::All => Box::new(AllQuery),
        Selection::Trigger(trigger) => trigger_query(fields, trigger, now, vocabulary, BlockedBy::Absent),
        Selection::Running(component) => term(fields.running, component.as_str()),
        Selection::Present(t) => term(fields.present, t.as_str()),
        Selection::Succeeded(t) => term(fields.succeeded, t.as_str()),
        Selection::Failed(t) => term(fields.failed, t.as_str()),
        Selection::TransientlyFailed(t) => term(fields.transient, t.as_str()),
        Selection::Skipped(t) => term(fields.skipped, t.as_str()),
        Selection::Acknowledged(t) => term(fields.failed, &acknowledged_term(t.as_str())),
        Selection::Stale(t) => term(fields.stale, t.as_str()),
        Selection::BatchType(t) => term(fields.batch_type, t.as_str()),
        Selection::IdPrefix(prefix) => {
            // Batch ids are ASCII below DEL, so every id starting with the prefix sorts
            // before the prefix followed by DEL.
            let upper = format!("{prefix}\u{7f}");
            Box::new(RangeQuery::new(
                Bound::Included(Term::from_field_text(fields.id, prefix)),
                Bound::Excluded(Term::from_field_text(fields.id, &upper)),
            ))
        }
        Selection::Priority { min: None, max: None } => Box::new(AllQuery),
        Selection::Priority { min, max } => {
            let bound = |value: &Option<i32>| match value {
                Some(v) => Bound::Included(Term::from_field_i64(fields.priority, i64::from(*v))),
                None => Bound::Unbounded,
            };
            Box::new(RangeQuery::new(bound(min), bound(max)))
        }
        Selection::QuietFor(quiet) => quiet_for(fields, *quiet, now),
        Selection::And(all) => all_unless_positive(
            all.iter().map(|s| (Occur::Must, selection_query(fields, s, now, vocabulary))).collect(),
        ),
        Selection::Or(any) if any.is_empty() => Box::new(EmptyQuery),
        Selection::Or(any) => {
            let any = any.iter().map(|s| (Occur::Should, selection_query(fields, s, now, vocabulary)));
            Box::new(BooleanQuery::new(any.collect()))
        }
        // tantivy refuses a purely negative query, so negation starts from all documents.
        Selection::Not(inner) => Box::new(BooleanQuery::new(vec![
            (Occur::Must, Box::new(AllQuery)),
            (Occur::MustNot, selection_query(fields, inner, now, vocabulary)),
        ])),
    }
}
