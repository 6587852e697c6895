//! The index over HTTP: the service that serves an index directory (`server`) kept caught
//! up by the `follower`, the client adapter that implements the `BatchIndex` port against
//! it (`HttpIndex`), and the operations they share, each declared once (`wire`). The routes,
//! errors, tokens, metrics and retries they are built from are `autocomp_http`'s.

pub mod follower;
mod http_index;
pub mod server;
pub mod wire;

pub use follower::{Follower, Progress, Reconciled};
pub use http_index::HttpIndex;
pub use server::IndexService;
