//! The HTTP toolkit every autocomp service and client shares, so the store service, the
//! index service and the monitor start, refuse, log and fail over alike: start-up that waits
//! for an upstream (`startup`), the routes, error bodies and access rules of a service
//! (`service`, `error`), the connection loop with its caps and time limits (`serve`) and who
//! holds its slots (`slots`), warnings any client can cause summarized per client
//! (`quiet`), a service binary's launch (`launch`), the client with failover and retry
//! (`client`), what a service of each release offers (`protocol`), and the one declaration of each remote operation that the routes, the client
//! and the OpenAPI document are made from (`api`). What binaries share beyond HTTP (URL
//! redaction, terminal text, TLS, logging) is in `autocomp-toolkit`.
//! It knows nothing of batches beyond the validated names of the model.

pub mod api;
pub mod client;
pub mod error;
pub mod launch;
pub mod protocol;
pub mod quiet;
pub mod serve;
pub mod service;
pub mod slots;
pub mod startup;
