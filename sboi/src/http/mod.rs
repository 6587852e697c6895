//! The index over HTTP: the service that serves an index directory (`server`) kept caught
//! up by the `follower`, the client adapter that implements the `BatchIndex` port against
//! it (`HttpIndex`), and the bodies they exchange (`wire`). The shared server and client
//! parts (errors, tokens, metrics, retries) are the store's `autocomp_store::http`.

pub mod follower;
mod http_index;
pub mod server;
pub mod wire;

pub use follower::{Follower, Progress, Reconciled};
pub use http_index::HttpIndex;
pub use server::IndexService;
