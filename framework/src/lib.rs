//! The autocomp framework: what every autonomous component runs when cron starts it, and the
//! `autocomp` admin CLI. The Component trait and runner arrive with issue #4, locks with
//! issues #4-#5; today it holds the CLI and its embedded demo.

pub mod demo;
