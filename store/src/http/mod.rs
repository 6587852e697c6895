//! The store over HTTP: the service that serves any `ObjectStore` (`server`), the client
//! adapter that implements the port against it (`HttpStore`), the bodies they exchange
//! (`wire`), and the parts every autocomp service and client shares (`service`, `client`).

pub mod client;
mod http_store;
pub mod server;
pub mod service;
pub mod startup;
pub mod wire;

pub use http_store::HttpStore;
pub use server::StoreService;
