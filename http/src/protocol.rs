//! What a service offers, so clients and services of different releases can talk while hosts
//! are upgraded one at a time: `GET /protocol` answers the service's release, its protocol
//! version and every operation it answers (`Offered`); every request carries the client's
//! protocol version (header `autocomp-protocol`), and every answer the service's.
//!
//! A client reads the service's offer once (`HttpClient::offered`) and never sends an
//! operation the service does not offer: it falls back to what the service does offer where
//! the port has a way (`HttpStore`'s reads with a default), and otherwise refuses with one
//! message naming the upgrade order (`CallError::Older`). A service of a release before
//! protocol 2 answers `GET /protocol` with 404: nothing is known of it but that, and an
//! operation it lacks is found out by its `unknown_operation` answer, which says the same.
//! Protocol versions: 1, the releases before `GET /protocol`; 2, this one (it added the
//! retention operations to the store service).

use serde::{Deserialize, Serialize};

/// This release's protocol version.
pub const PROTOCOL: u32 = 2;

/// The header every request and every answer carries: the sender's protocol version.
pub const PROTOCOL_HEADER: &str = "autocomp-protocol";

/// What the upgrade order is, as every refusal names it.
pub const UPGRADE_ORDER: &str = "upgrade the services first (the store service, then sboi), then each host's \
                                 components, then the operator's tools and the monitor (README: Upgrading)";

/// `GET /protocol`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Offered {
    /// What the service is ("store", "index").
    pub service: String,
    /// Its release (the version of its package).
    pub release: String,
    /// Its protocol version.
    pub protocol: u32,
    /// Every operation it answers (`POST /v1/<operation>`), in declaration order.
    pub operations: Vec<String>,
}

impl Offered {
    /// This release's offer of a service with these operations.
    pub fn of(service: &str, operations: impl IntoIterator<Item = &'static str>) -> Offered {
        Offered {
            service: service.to_owned(),
            release: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: PROTOCOL,
            operations: operations.into_iter().map(str::to_owned).collect(),
        }
    }

    pub fn offers(&self, operation: &str) -> bool {
        self.operations.iter().any(|offered| offered == operation)
    }
}

/// What a client knows of a service's offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// The service said what it offers.
    Listed(Offered),
    /// The service is of a release before protocol 2 (`GET /protocol` is not found there).
    BeforeProtocol,
}

impl Handshake {
    /// Whether the service answers `operation`: `None` when it cannot be known in advance (a
    /// service of a release before protocol 2).
    pub fn offers(&self, operation: &str) -> Option<bool> {
        match self {
            Handshake::Listed(offered) => Some(offered.offers(operation)),
            Handshake::BeforeProtocol => None,
        }
    }

    /// The refusal of an operation the service does not offer, in one line.
    pub fn refusal(&self, what: &str, shown: &str, operation: &str) -> String {
        let release = match self {
            Handshake::Listed(offered) if offered.protocol > PROTOCOL => {
                return format!(
                    "the {what} at {shown} runs release {} (protocol {}), newer than this host's {} (protocol \
                     {PROTOCOL}), and no longer offers {operation}: upgrade this host's autocomp",
                    offered.release,
                    offered.protocol,
                    env!("CARGO_PKG_VERSION")
                );
            }
            Handshake::Listed(offered) => format!("release {} (protocol {})", offered.release, offered.protocol),
            Handshake::BeforeProtocol => "a release before protocol 2".to_owned(),
        };
        format!(
            "the {what} at {shown} runs {release}, which does not offer {operation}; this host runs release {} \
             (protocol {PROTOCOL}): {UPGRADE_ORDER}",
            env!("CARGO_PKG_VERSION")
        )
    }
}
