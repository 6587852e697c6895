//! Translates a `Trigger` into a tantivy query over the fields of `document.rs`.
//! Each clause maps to exact terms; the property test holds this equal to `Trigger::select`.

use std::ops::Bound;

use autocomp_store::{Timestamp, Trigger};
use tantivy::Term;
use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::IndexRecordOption;

use crate::document::Fields;

pub fn trigger_query(fields: &Fields, trigger: &Trigger, now: Timestamp) -> Box<dyn Query> {
    let term = |field, text: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, text), IndexRecordOption::Basic))
    };
    let any_of = |field, values: Vec<&str>| -> Box<dyn Query> {
        Box::new(BooleanQuery::new(values.into_iter().map(|v| (Occur::Should, term(field, v))).collect()))
    };

    // tantivy refuses a purely negative query, so every query starts from all documents.
    let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, Box::new(AllQuery))];
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
        clauses.push((Occur::MustNot, term(fields.present, blocking.as_str())));
    }
    // "no effective event, or one older than the content" = "no effective event that is current".
    for repeated in &trigger.repeat_on_change {
        clauses.push((Occur::MustNot, term(fields.current, repeated.as_str())));
    }
    for retried in &trigger.transiently_failed {
        clauses.push((Occur::Must, term(fields.transient, retried.as_str())));
    }
    if let Some(quiet) = trigger.settled_for.filter(|quiet| !quiet.is_zero()) {
        // Store times are whole milliseconds: "at least 1.5 ms ago" means "at least 2 ms ago".
        let quiet_ms = i64::try_from(quiet.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
        let latest = now.millis().saturating_sub(quiet_ms);
        clauses.push((
            Occur::Must,
            Box::new(RangeQuery::new(
                Bound::Unbounded,
                Bound::Included(Term::from_field_i64(fields.last_activity, latest)),
            )),
        ));
    }
    Box::new(BooleanQuery::new(clauses))
}
