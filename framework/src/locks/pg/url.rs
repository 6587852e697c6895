//! The syntax of a `postgres://` (or `postgresql://`) locks URL: the store's URL (libpq's
//! syntax, TLS, `password_file`, ... parsed by autocomp-store's `PgOptions`, so the same URL
//! works for both) plus one option of the lock service's own, `lease=` (how long a holder's
//! locks outlive its last renewal, default 10 s).

use std::time::Duration;

use autocomp_model::InvalidInput;
use autocomp_store::{PgOptions, StoreError};
use autocomp_toolkit::redact::{display_url, query_start};

use crate::locks::LockError;

/// The lease when the URL does not say `?lease=...`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The shortest lease a URL may ask for: a renewal must be answered within a tenth of it
/// (100 ms) to keep a holder connected.
const MIN_LEASE: Duration = Duration::from_secs(1);
/// The longest: a dead holder's locks are free only after a lease.
const MAX_LEASE: Duration = Duration::from_secs(600);

/// A parsed PostgreSQL locks URL.
#[derive(Clone)]
pub struct PgLocksUrl {
    /// The connection, as the store would make it (the `lease` option taken out).
    pub options: PgOptions,
    /// How long after its last renewal a holder's locks may be taken from it.
    pub lease: Duration,
}

impl PgLocksUrl {
    /// `postgres[ql]://user@host[:port][,host2...]/database[?option=value&...]`: every option
    /// of the store's PostgreSQL URL, plus `lease=<duration>` (1 s to 10 min; `10s`, `2s`,
    /// `1m` or whole seconds).
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let shown = display_url(url);
        let invalid = |reason: String| LockError::from(InvalidInput::new("locks url", shown.clone(), reason));
        // The query starts after the credentials, which may hold a raw `?`.
        let (without_query, query) = match query_start(url) {
            Some(i) => (&url[..i], &url[i + 1..]),
            None => (url, ""),
        };
        let mut lease = DEFAULT_LEASE;
        let mut passed_on = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("lease", value)) => lease = parse_lease(value).map_err(invalid)?,
                _ => passed_on.push(pair),
            }
        }
        let store_url = if passed_on.is_empty() {
            without_query.to_owned()
        } else {
            format!("{without_query}?{}", passed_on.join("&"))
        };
        let options = PgOptions::parse(&store_url).map_err(|e| as_locks_url_error(e, &shown))?;
        Ok(Self { options, lease })
    }
}

/// The store's URL errors name a "store url": this one is a locks URL.
fn as_locks_url_error(error: StoreError, shown: &str) -> LockError {
    match error {
        StoreError::Invalid(input) if input.field == "store url" => InvalidInput::new(
            "locks url",
            shown,
            format!("{} (lease=<duration> is the lock service's own)", input.reason),
        )
        .into(),
        StoreError::Invalid(input) => input.into(),
        other => LockError::Unavailable(other.to_string()),
    }
}

fn parse_lease(value: &str) -> Result<Duration, String> {
    let lease = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(value).map_err(|e| format!("lease={value:?}: {e}"))?,
    };
    if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
        return Err(format!("lease={value:?} is not between 1s and 10m"));
    }
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_taken_out_and_the_rest_is_the_stores_url() {
        let url = PgLocksUrl::parse("postgres://u@db.example:5433/pipeline?lease=2s&sslmode=disable").unwrap();
        assert_eq!(url.lease, Duration::from_secs(2));
        assert_eq!(url.options.target, "u@db.example:5433/pipeline");
        let url = PgLocksUrl::parse("postgresql://u@h/db?listen=off").unwrap();
        assert_eq!(url.lease, DEFAULT_LEASE);
        assert_eq!(PgLocksUrl::parse("postgres://u@h/db?lease=30").unwrap().lease, Duration::from_secs(30));
    }

    #[test]
    fn a_password_holding_a_question_mark_is_not_a_query() {
        let url = PgLocksUrl::parse("postgres://u:pa?ss=w@h/db?lease=3s").unwrap();
        assert_eq!(url.lease, Duration::from_secs(3));
        assert_eq!(url.options.target, "u@h:5432/db");
    }

    #[test]
    fn bad_leases_and_options_are_refused_naming_the_locks_url_never_the_password() {
        for bad in [
            "postgres://u:secret@h/db?lease=0s",
            "postgres://u:secret@h/db?lease=1h",
            "postgres://u:secret@h/db?lease=soon",
        ] {
            match PgLocksUrl::parse(bad) {
                Err(LockError::Invalid(input)) => {
                    assert_eq!(input.field, "locks url");
                    assert!(!input.to_string().contains("secret"), "{input}");
                }
                other => panic!("{bad}: {:?}", other.err()),
            }
        }
        match PgLocksUrl::parse("postgres://u:secret@h/db?frobnicate=1") {
            Err(LockError::Invalid(input)) => {
                assert_eq!(input.field, "locks url");
                assert!(input.reason.contains("frobnicate"), "{input}");
                assert!(!input.to_string().contains("secret"), "{input}");
            }
            other => panic!("{:?}", other.err()),
        }
    }
}
