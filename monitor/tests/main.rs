//! The monitor's tests: its pages, forms and charts, through the router and in Chromium.
//! One test binary per crate, each file a module: a test binary links the whole stack, and
//! one per file filled a CI machine's disk. Run one file's tests with a filter: `module::`.

mod batch_log;
mod charts;
mod contracts;
mod graph;
mod looks;
mod needs;
mod output;
mod support;
mod timeline;
mod web;
