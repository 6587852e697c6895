//! The HTTP toolkit every autocomp service and client shares, so the store service, the
//! index service and the monitor start, refuse, log and fail over alike: start-up that waits
//! for an upstream (`startup`), the routes, error bodies and access rules of a service
//! (`service`), the connection loop with its caps and time limits (`serve`) and who
//! holds its slots (`slots`), warnings any client can cause summarized per client
//! (`quiet`), TLS for
//! services and clients (`tls`), the modes a config or secret file must have
//! (`file_modes`), secrets and certificates read again when their files
//! change (`reload`), the client with failover and retry (`client`), the one function that
//! describes a URL without its secrets (`redact`), the one that makes user text safe to
//! print (`terminal`), logging set-up (`logging`) with optional OpenTelemetry export and
//! `traceparent` propagation (`telemetry`), and the one declaration of each remote
//! operation that the routes, the client and the OpenAPI document are made from (`api`).
//! It knows nothing of batches beyond the validated names of the model.

pub mod api;
pub mod client;
pub mod error;
pub mod file_modes;
pub mod launch;
pub mod logging;
pub mod quiet;
pub mod redact;
pub mod reload;
pub mod serve;
pub mod service;
pub mod slots;
pub mod startup;
pub mod telemetry;
pub mod terminal;
pub mod tls;

pub use redact::display_url;
pub use terminal::for_terminal;
