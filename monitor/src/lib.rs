//! The web monitor (`autocomp-monitor`): the pipeline at a glance (a component x state grid
//! of counts from the batch index), a batch x component matrix with filters kept in the URL,
//! each batch's log and explanations, and the operator's actions, which are the CLI's own
//! (`autocomp_ops::operator`): same events, same checks, same refusals.
//!
//! `filter` parses what the URL carries; `data` asks the ports (counts and pages from the
//! index, batches from the store); `web` serves it as HTML, CSV and NDJSON.

pub mod data;
pub mod filter;
pub mod web;
