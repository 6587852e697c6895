//! What every autocomp binary shares, services and components alike, none of it HTTP
//! serving: the one function that describes a URL without its secrets (`redact`), the one
//! that makes user text safe to print (`terminal`), the modes a config or secret file must
//! have (`file_modes`), secrets and certificates read again when their files change
//! (`reload`), TLS settings for servers and clients (`tls`), logging set-up (`logging`) with
//! optional OpenTelemetry export and `traceparent` propagation (`telemetry`), and an error
//! with its sources on one line (`error_chain`). The component SDK depends on this crate and
//! not on the HTTP service toolkit.

pub mod error_chain;
pub mod file_modes;
pub mod logging;
pub mod redact;
pub mod reload;
pub mod telemetry;
pub mod terminal;
pub mod tls;

pub use redact::display_url;
pub use terminal::for_terminal;
