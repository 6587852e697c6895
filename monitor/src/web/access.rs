//! What a request may do, as plain data: read only, signed out, or signed in as an operator.
//! `auth` decides it from a request and refuses writes by it; `html` shows it in the header.
//! Kept apart from both so each can depend on it without depending on the other.

/// What the request may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The monitor was started without a write token: nobody can act.
    ReadOnly,
    SignedOut,
    /// Acts as `operator:<name>`.
    SignedIn {
        name: String,
        via_proxy: bool,
    },
}

impl Access {
    /// Part of the pages' ETag: what a page shows depends on it.
    pub fn key(&self) -> String {
        match self {
            Access::ReadOnly => "read-only".into(),
            Access::SignedOut => "signed-out".into(),
            Access::SignedIn { name, via_proxy } => format!("{}:{name}", if *via_proxy { "proxy" } else { "cookie" }),
        }
    }

    pub fn name(&self) -> Option<&str> {
        match self {
            Access::SignedIn { name, .. } => Some(name),
            _ => None,
        }
    }
}
