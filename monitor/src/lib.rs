//! The web monitor (`autocomp-monitor`): the pipeline at a glance (a component x state grid
//! of counts from the batch index, and its steering: holds, pools, breakers, the steering
//! log), a batch x component matrix with filters kept in the URL, each batch's log and
//! explanations, the batches waiting for a person at a human step, and the operator's actions
//! (an admin's steering of the whole pipeline among them), which are the CLI's own
//! (`autocomp_ops::operator`): same events, same checks, same refusals.
//!
//! `filter` parses what the URL carries; `data` asks the ports (counts and pages from the
//! index, batches from the store); `web` serves it as HTML, CSV and NDJSON.

pub mod data;
pub mod filter;
pub mod needs;
pub mod sampler;
pub mod web;
