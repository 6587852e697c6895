//! The HTTP toolkit every autocomp service and client shares, so the store service, the
//! index service and the monitor start, refuse, log and fail over alike: start-up that waits
//! for an upstream (`startup`), the routes, error bodies and access rules of a service
//! (`service`), the client with failover and retry (`client`), the one function that
//! describes a URL without its secrets (`redact`), and logging set-up (`logging`).
//! It knows nothing of batches beyond the validated names of the model.

pub mod client;
pub mod logging;
pub mod redact;
pub mod service;
pub mod startup;

pub use redact::display_url;
