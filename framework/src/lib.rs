//! The autocomp framework: what every autonomous component runs when cron starts it (the
//! `Component` trait, the runner, config, the lock port), and the `autocomp` admin CLI.
//! A component is one small file: implement `Component`, call `cli::main`.

pub mod cli;
pub mod component;
pub mod config;
pub mod demo;
pub mod exit;
pub mod locks;
pub mod operator;
pub mod runner;
pub mod status;

pub use component::{Component, WorkContext, WorkError};
