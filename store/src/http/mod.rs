//! The store over HTTP: the service that serves any `ObjectStore` (`server`), the client
//! adapter that implements the port against it (`HttpStore`), the operations they share, each
//! declared once with how the service answers it and whether it wakes the long polls
//! (`operations`), their bodies (`wire`), the answers bounded in items and bytes (`bounded`,
//! `stream`), and how a `StoreError` crosses the wire both ways (`errors`). The routes, access
//! rules and client are `autocomp_http`'s.

mod bounded;
mod errors;
mod http_store;
pub mod operations;
pub mod server;
mod stream;
pub mod wire;

pub use errors::store_error_is_permanent;
pub use http_store::HttpStore;
pub use server::StoreService;
