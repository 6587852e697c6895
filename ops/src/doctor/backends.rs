//! The doctor's checks of the three backends (the store and the clock beside it, the index,
//! the lock service): whether each answers, and for one that does not, the fix, chosen by the
//! error's kind (a schema not this release's, a missing file, a URL or a credential refused),
//! never by its words. Apart from the host's files and the components, which need no backend.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autocomp_framework::config::Backends;
use autocomp_framework::locks::LockError;
use autocomp_model::Timestamp;
use autocomp_sboi::IndexError;
use autocomp_store::{ObjectStore, StoreAbout, StoreError, open_store};

use super::{Check, DoctorOptions, files};

/// `url` with `migrate=false`, so opening it never changes the schema (the store service
/// has its own release and schema, and no such option).
fn without_migrating(url: &str) -> String {
    if !(url.starts_with("sqlite://") || url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return url.to_owned();
    }
    autocomp_toolkit::redact::with_option(url, "migrate=false")
}

/// The store (reachable, credentials accepted, schema current, writable by this user) and
/// the clock beside it.
pub(super) async fn store_checks(
    options: &DoctorOptions,
    backends: &Backends,
    checks: &mut Vec<Check>,
) -> Option<Arc<dyn ObjectStore>> {
    let url = backends.store.as_deref()?;
    let shown = autocomp_toolkit::display_url(url);
    let failed = |checks: &mut Vec<Check>, message: String, fix: &'static str| {
        // The option the doctor added is not the user's: leave it out of what it says.
        let message = message.replace("?migrate=false", "").replace("&migrate=false", "");
        checks.push(Check::fail("store", format!("{shown}: {message}"), fix));
        checks.push(Check::skipped("clock", "needs the store"));
    };
    let asked = async {
        let store = open_store(&without_migrating(url)).await?;
        let before = (Instant::now(), Timestamp::now());
        let about = store.about().await?;
        Ok::<_, autocomp_store::StoreError>((store, about, before))
    };
    let (store, about, (asked_at, before)) = match tokio::time::timeout(options.timeout, asked).await {
        Ok(Ok(answered)) => answered,
        Ok(Err(e)) => {
            failed(checks, e.to_string(), store_fix(&e));
            return None;
        }
        Err(_) => {
            failed(checks, format!("no answer within {}", humantime::format_duration(options.timeout)), STORE_OUTAGE);
            return None;
        }
    };
    let round_trip = asked_at.elapsed();
    checks.push(schema_check(&shown, &about));
    if let Some(file) = sqlite_file(url)
        && let Err(reason) = files::writable(file)
    {
        checks.push(Check::fail(
            "store writes",
            reason,
            "the store file and its directory must be writable by the pipeline's user (it also writes \
             the -wal and -shm files beside it): chown them to it",
        ));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        let token = ["AUTOCOMP_TOKEN", "AUTOCOMP_TOKEN_FILE"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        if !token {
            checks.push(Check::fail(
                "store writes",
                "no token ($AUTOCOMP_TOKEN_FILE or $AUTOCOMP_TOKEN): the store service answers reads, but refuses \
                 every write",
                "give this host the service's token file in $AUTOCOMP_TOKEN_FILE (/etc/default/autocomp)",
            ));
        }
    }
    checks.push(clock_check(&about, before, round_trip, options.max_clock_skew, url));
    Some(store)
}

const STORE_OUTAGE: &str =
    "check that the store's server runs and this host reaches it (the URL, the firewall, TLS settings)";

/// The inputs that are credentials: a refused or unreadable one is fixed by checking it
/// against the server's (the store service's token; PostgreSQL's password file).
const CREDENTIALS: [&str; 3] = ["token", "AUTOCOMP_TOKEN_FILE", "password_file"];

/// The fix for a store that did not open or answer, by the error's kind: a schema not this
/// release's, a missing file, the URL refused as input (a PostgreSQL option, a user the server
/// refuses, a database it does not have), a credential refused; else an outage.
fn store_fix(error: &StoreError) -> &'static str {
    match error {
        error if error.is_schema_mismatch() => {
            "migrate it: `autocomp-store migrate --db URL` for PostgreSQL; any component's pass for a SQLite file"
        }
        StoreError::NoStoreFile(_) => {
            "check the path in the store URL; a component's first pass (or `autocomp add`) makes the file"
        }
        StoreError::Invalid(input) if input.field == "store url" => {
            "correct the store URL (README, Backends and Multi-host mode list its forms and options)"
        }
        StoreError::Invalid(input) if CREDENTIALS.contains(&input.field.as_str()) => {
            "check the credentials (password_file=, $AUTOCOMP_TOKEN_FILE) against the server's"
        }
        _ => STORE_OUTAGE,
    }
}

fn schema_check(shown: &str, about: &StoreAbout) -> Check {
    let detail = format!("{shown}: {} at schema version {}", about.backend, about.schema_version);
    if about.schema_version == about.schema_wanted {
        Check::ok("store", detail + " (current)")
    } else {
        Check::fail(
            "store",
            format!("{detail}, its release needs {}", about.schema_wanted),
            "migrate it (`autocomp-store migrate --db URL`), or run the store service's release on every host",
        )
    }
}

/// The host's clock against the store's, allowing for half the round trip.
fn clock_check(about: &StoreAbout, before: Timestamp, round_trip: Duration, allowed: Duration, url: &str) -> Check {
    if url.starts_with("sqlite://") {
        return Check::ok("clock", "the store is a file on this host: its clock is this host's");
    }
    let midpoint = before.0 + i64::try_from(round_trip.as_millis() / 2).unwrap_or(i64::MAX);
    let skew_ms = midpoint - about.clock.0;
    let slack = i64::try_from((allowed + round_trip / 2).as_millis()).unwrap_or(i64::MAX);
    let text = humantime::format_duration(Duration::from_millis(skew_ms.unsigned_abs())).to_string();
    let direction = if skew_ms >= 0 { "ahead of" } else { "behind" };
    let detail = format!("this host is {text} {direction} the store's clock ({})", about.backend);
    if skew_ms.abs() <= slack {
        Check::ok("clock", format!("{detail}, within {}", humantime::format_duration(allowed)))
    } else {
        Check::fail(
            "clock",
            format!("{detail}, more than {}", humantime::format_duration(allowed)),
            "synchronise the clocks (chrony or systemd-timesyncd on every host and the database server): \
             silent-component alerts, max_runtime and the work series read the store's clock",
        )
    }
}

/// The index answers; how many store changes it has not taken in yet.
pub(super) async fn index_check(
    options: &DoctorOptions,
    backends: &Backends,
    store: Option<&Arc<dyn ObjectStore>>,
    checks: &mut Vec<Check>,
) {
    let Some(url) = backends.index.as_deref() else { return };
    let Some(store) = store else {
        checks.push(Check::skipped("index", "needs the store"));
        return;
    };
    let shown = autocomp_toolkit::display_url(url);
    let answered = async {
        let index = autocomp_sboi::open_index(url, Arc::clone(store))?;
        let cursor = index.catch_up().await?.cursor();
        let head = store.head().await?;
        Ok::<_, autocomp_sboi::IndexError>((cursor, head))
    };
    let within = humantime::format_duration(options.timeout);
    let answered = match tokio::time::timeout(options.timeout, answered).await {
        Ok(Ok(answered)) => Ok(answered),
        Ok(Err(e)) => Err((e.to_string(), index_url_refused(&e))),
        Err(_) => Err((format!("no answer within {within}"), false)),
    };
    checks.push(match answered {
        Ok((cursor, head)) => {
            let behind = u64::try_from(head.0.saturating_sub(cursor.0)).unwrap_or_default();
            let detail = format!("{shown}: at seq {}, the store at {}: {behind} changes behind", cursor.0, head.0);
            if behind <= options.index_lag {
                Check::ok("index", detail)
            } else {
                Check::fail(
                    "index",
                    format!("{detail}, more than {}", options.index_lag),
                    "see that the index service runs and follows this store (its log), or `autocomp reindex` \
                     for the embedded index",
                )
            }
        }
        Err((e, bad_url)) => {
            let outage = "check that the index service runs and this host reaches it; for the embedded index, that \
                          its directory is the pipeline's and readable";
            let fix = bad_url_or(bad_url, "index", outage);
            Check::fail("index", format!("{shown}: {e}"), fix)
        }
    });
}

pub(super) async fn locks_check(options: &DoctorOptions, backends: &Backends, checks: &mut Vec<Check>) {
    let Some(url) = backends.locks.as_deref() else { return };
    let shown = autocomp_toolkit::display_url(url);
    let within = humantime::format_duration(options.timeout);
    let inspected = match tokio::time::timeout(options.timeout, autocomp_framework::locks::inspect_locks(url)).await {
        Ok(Ok(inspected)) => Ok(inspected),
        Ok(Err(e)) => Err((e.to_string(), locks_url_refused(&e))),
        Err(_) => Err((format!("no answer within {within}"), false)),
    };
    checks.push(match inspected {
        // Only ZooKeeper has a lock tree with ACLs; local and PostgreSQL locks say all in the description.
        Ok(found) if found.problems.is_empty() && !url.starts_with("zk") => Check::ok("locks", found.description),
        Ok(found) if found.problems.is_empty() => {
            Check::ok("locks", found.description + "; the lock tree's ACLs are as autocomp sets them")
        }
        Ok(found) => Check::fail("locks", format!("{}: {}", found.description, found.problems.join("; ")), {
            "do what each problem says (ZooKeeper: SECURITY.md, rotating the ZooKeeper identity; PostgreSQL: the \
             owner of the lock tables runs the SQL it names)"
        }),
        Err((e, bad_url)) => {
            let outage = "check that ZooKeeper runs (PostgreSQL, for a postgres:// URL) and this host reaches \
                          it, and the identity and TLS files (or the user and password) of the URL";
            let fix = bad_url_or(bad_url, "locks", outage);
            Check::fail("locks", format!("{shown}: {e}"), fix)
        }
    });
}

/// The index URL refused as input (its scheme, an option), not the index failing to answer.
fn index_url_refused(error: &IndexError) -> bool {
    matches!(error, IndexError::Store(StoreError::Invalid(input)) if input.field == "index url")
}

/// The locks URL refused as input (its scheme, an option, an identity file), not ZooKeeper
/// failing to answer.
fn locks_url_refused(error: &LockError) -> bool {
    matches!(error, LockError::Invalid(input) if input.field == "locks url")
}

/// The fix for a backend that did not answer: a URL refused as input is the URL's fault, not
/// an outage.
fn bad_url_or(bad_url: bool, key: &str, outage: &'static str) -> String {
    if bad_url {
        format!("correct the {key} URL (README, Backends and Multi-host mode list its forms)")
    } else {
        outage.to_owned()
    }
}

/// The file a `sqlite://` store URL names, without its options.
pub(super) fn sqlite_file(url: &str) -> Option<&Path> {
    let path = url.strip_prefix("sqlite://")?;
    Some(Path::new(path.split_once('?').map_or(path, |(path, _)| path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use autocomp_model::InvalidInput;

    #[test]
    fn a_url_refused_as_input_is_the_urls_fault_not_an_outage() {
        let refused = LockError::Invalid(InvalidInput::new("locks url", "bogus://x", "unknown scheme"));
        assert!(locks_url_refused(&refused));
        assert!(!locks_url_refused(&LockError::Unavailable("connection refused".into())));
        let refused = IndexError::Store(StoreError::Invalid(InvalidInput::new("index url", "x://", "unknown scheme")));
        assert!(index_url_refused(&refused));
        let store_url = IndexError::Store(StoreError::Invalid(InvalidInput::new("store url", "x://", "no")));
        assert!(!index_url_refused(&store_url), "the store's URL is not the index's");
        assert!(bad_url_or(true, "locks", "check that ZooKeeper runs").starts_with("correct the locks URL"));
        assert_eq!(bad_url_or(false, "locks", "check that ZooKeeper runs"), "check that ZooKeeper runs");
    }

    #[test]
    fn the_stores_fix_goes_by_the_errors_kind() {
        let fix = |error: StoreError| store_fix(&error).split_once(':').map_or("", |(head, _)| head).to_owned();
        assert_eq!(fix(StoreError::SchemaNewer("v11".into())), "migrate it");
        assert_eq!(fix(StoreError::SchemaOlder("v6".into())), "migrate it");
        assert!(store_fix(&StoreError::NoStoreFile("x".into())).starts_with("check the path"));
        let url = StoreError::Invalid(InvalidInput::new("store url", "u@h/db", "unknown option \"x\""));
        assert!(store_fix(&url).starts_with("correct the store URL"));
        for credential in ["token", "AUTOCOMP_TOKEN_FILE", "password_file"] {
            let refused = StoreError::Invalid(InvalidInput::new(credential, "x", "refused"));
            assert!(store_fix(&refused).starts_with("check the credentials"), "{credential}");
        }
        let down = StoreError::Unavailable("PostgreSQL at u@h/db unreachable: connection refused".into());
        assert_eq!(store_fix(&down), STORE_OUTAGE);
    }

    #[test]
    fn only_the_database_backends_are_opened_without_migrating() {
        assert_eq!(without_migrating("sqlite:///s.db"), "sqlite:///s.db?migrate=false");
        assert_eq!(without_migrating("postgres://u@h/db?pool_size=2"), "postgres://u@h/db?pool_size=2&migrate=false");
        assert_eq!(without_migrating("https://store:7070"), "https://store:7070");
        // A raw `?` in the password is not a query: the option must reach the store's parser.
        let opened = autocomp_store::PgOptions::parse(&without_migrating("postgres://u:pa?ss@h/db")).unwrap();
        assert_eq!((opened.config.get_dbname(), opened.migrate), (Some("db"), false));
    }
}
