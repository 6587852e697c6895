//! What a request may do, as plain data: nobody can sign in (no accounts), signed out, or
//! signed in as an account with a role. `gate` decides it once per request; `auth`, the
//! pages and the actions read it; `html` shows it in the header.

use axum::http::StatusCode;

pub use super::accounts::Role;
use super::error::WebError;

/// What the request may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The monitor was started without accounts (`--users`): nobody can sign in or act.
    ReadOnly,
    SignedOut,
    /// An account, signed in with its password or named by the trusted proxy.
    SignedIn {
        name: String,
        role: Role,
        via_proxy: bool,
    },
}

impl Access {
    /// Part of the pages' ETag: what a page shows depends on it.
    pub fn key(&self) -> String {
        match self {
            Access::ReadOnly => "read-only".into(),
            Access::SignedOut => "signed-out".into(),
            Access::SignedIn { name, role, via_proxy } => {
                format!("{}:{role}:{name}", if *via_proxy { "proxy" } else { "session" })
            }
        }
    }

    pub fn name(&self) -> Option<&str> {
        match self {
            Access::SignedIn { name, .. } => Some(name),
            _ => None,
        }
    }

    pub fn role(&self) -> Option<Role> {
        match self {
            Access::SignedIn { role, .. } => Some(*role),
            _ => None,
        }
    }

    /// Whether the pages may be shown at all when reads need sign-in.
    pub fn may_read(&self) -> bool {
        matches!(self, Access::SignedIn { .. })
    }

    /// Whether the account may act on batches.
    pub fn may_act(&self) -> bool {
        self.role().is_some_and(|role| role >= Role::Operator)
    }

    /// The name to act as, or why this request may not act on batches (403 read only or
    /// a viewer, 401 not signed in).
    pub fn writer(&self) -> Result<&str, WebError> {
        self.at_least(Role::Operator, "acting on batches")
    }

    /// Whether the account may steer the whole pipeline (pause, drain, resume, pools).
    pub fn may_steer(&self) -> bool {
        self.role().is_some_and(|role| role >= Role::Admin)
    }

    /// The name of an admin, or why not: what changes the whole pipeline (pause, drain,
    /// resume, pool sizes) asks this.
    pub fn admin(&self) -> Result<&str, WebError> {
        self.at_least(Role::Admin, "steering the whole pipeline (pause, drain, resume, pool sizes)")
    }

    fn at_least(&self, needed: Role, what: &str) -> Result<&str, WebError> {
        match self {
            Access::SignedIn { name, role, .. } if *role >= needed => Ok(name),
            Access::SignedIn { name, role, .. } => Err(WebError::new(
                StatusCode::FORBIDDEN,
                "Not allowed",
                format!(
                    "{what} needs the {needed} role; the account {name} is {} {role}; nothing was changed",
                    if *role == Role::Admin || *role == Role::Operator { "an" } else { "a" }
                ),
            )),
            Access::ReadOnly => Err(WebError::new(
                StatusCode::FORBIDDEN,
                "Read only",
                "this monitor is read only: it was started without accounts (--users FILE); nothing was changed",
            )),
            Access::SignedOut => Err(WebError::new(
                StatusCode::UNAUTHORIZED,
                "Not signed in",
                format!("{what} needs an account with the {needed} role: sign in first; nothing was changed"),
            )
            .with_link("/login", "Sign in")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed_in(role: Role) -> Access {
        Access::SignedIn { name: "Åsa".into(), role, via_proxy: false }
    }

    #[test]
    fn each_role_may_do_what_the_ones_below_it_may() {
        assert!(!signed_in(Role::Viewer).may_act() && signed_in(Role::Viewer).may_read());
        assert_eq!(signed_in(Role::Viewer).writer().unwrap_err().status(), StatusCode::FORBIDDEN);
        assert_eq!(signed_in(Role::Operator).writer().ok(), Some("Åsa"));
        assert_eq!(signed_in(Role::Operator).admin().unwrap_err().status(), StatusCode::FORBIDDEN);
        assert_eq!(signed_in(Role::Admin).writer().ok(), Some("Åsa"));
        assert_eq!(signed_in(Role::Admin).admin().ok(), Some("Åsa"));
        assert!(signed_in(Role::Admin).may_steer() && !signed_in(Role::Operator).may_steer());
        assert!(!Access::ReadOnly.may_steer() && !Access::SignedOut.may_steer());
        assert_eq!(Access::SignedOut.writer().unwrap_err().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Access::ReadOnly.writer().unwrap_err().status(), StatusCode::FORBIDDEN);
        assert!(!Access::SignedOut.may_read() && !Access::ReadOnly.may_read());
        assert_ne!(signed_in(Role::Viewer).key(), signed_in(Role::Operator).key());
    }
}
