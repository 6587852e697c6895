//! The lock tables: made on first use where the role may create them, left alone where they
//! exist (so a DBA may create them and grant only row rights), and what `autocomp doctor`
//! says of them.
//!
//! They are the lock service's own tables, not a migration of the store's: the locks URL may
//! name another database than the store (or the store may be SQLite or HTTP), and the store's
//! schema version should not move for a lock backend a site may not use.

use autocomp_model::InvalidInput;
use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;

use super::shared::describe_pool_error;
use super::sql;
use super::url::PgLocksUrl;
use crate::locks::{LockError, LockInspection};

/// A connection of `pool`, or why there is none: refused credentials or a missing database
/// are the URL's fault (`Invalid`); anything else is `Unavailable`.
pub async fn connect(pool: &Pool, url: &PgLocksUrl, shown: &str) -> Result<deadpool_postgres::Object, LockError> {
    let target = &url.options.target;
    pool.get().await.map_err(|e| {
        let code = match &e {
            deadpool_postgres::PoolError::Backend(e) => e.code().cloned(),
            _ => None,
        };
        let why = describe_pool_error(&e);
        match code {
            Some(code)
                if code == SqlState::INVALID_PASSWORD || code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                let reason = format!("PostgreSQL refused user {}: {why}", url.options.user);
                InvalidInput::new("locks url", target.as_str(), reason).into()
            }
            Some(code) if code == SqlState::INVALID_CATALOG_NAME => {
                InvalidInput::new("locks url", target.as_str(), format!("no such database: {why}")).into()
            }
            _ => LockError::Unavailable(format!("cannot reach PostgreSQL at {target} (locks = {shown}): {why}")),
        }
    })
}

/// Makes the tables unless they exist. Two processes making them at once is expected: the
/// loser's catalog conflict is followed by a look that finds them.
pub async fn ensure(client: &tokio_postgres::Client, url: &PgLocksUrl) -> Result<(), LockError> {
    let target = &url.options.target;
    let failed = |e: tokio_postgres::Error| {
        let message = autocomp_store::postgres::describe_error(&e);
        if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
            let reason = format!(
                "PostgreSQL user {} may not create the lock tables ({message}); have their owner run:\n{}\
                 GRANT SELECT, INSERT, UPDATE, DELETE ON autocomp_lock_workers, autocomp_locks TO {};",
                url.options.user,
                sql::CREATE_TABLES,
                url.options.user
            );
            LockError::from(InvalidInput::new("locks url", target.as_str(), reason))
        } else {
            LockError::Unavailable(format!("PostgreSQL lock tables at {target}: {message}"))
        }
    };
    for _ in 0..3 {
        let exist = client.query_typed_one(sql::TABLES_EXIST, &[]).await.map_err(failed)?;
        if exist.get::<_, bool>(0) {
            return Ok(());
        }
        match client.batch_execute(sql::CREATE_TABLES).await {
            Ok(()) => return Ok(()),
            Err(e)
                if [SqlState::UNIQUE_VIOLATION, SqlState::DUPLICATE_TABLE, SqlState::DUPLICATE_OBJECT]
                    .iter()
                    .any(|code| e.code() == Some(code)) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Err(LockError::Unavailable(format!("PostgreSQL lock tables at {target}: cannot create them (others keep racing)")))
}

/// What `autocomp doctor` says of a PostgreSQL lock service: who answered, where the tables
/// are (or would be made), how many workers and locks there are, and what keeps this role
/// from using them. Changes nothing.
pub async fn inspect(url: &str) -> Result<LockInspection, LockError> {
    let shown = autocomp_toolkit::display_url(url);
    let parsed = PgLocksUrl::parse(url)?;
    let pool = autocomp_store::postgres::connection_pool(&parsed.options, 1)
        .map_err(|e| LockError::Unavailable(e.to_string()))?;
    let client = connect(&pool, &parsed, &shown).await?;
    let unavailable = |e: tokio_postgres::Error| {
        LockError::Unavailable(format!(
            "PostgreSQL at {}: {}",
            parsed.options.target,
            autocomp_store::postgres::describe_error(&e)
        ))
    };
    let row = client.query_typed_one(sql::PRIVILEGES, &[]).await.map_err(unavailable)?;
    let (user, schema): (String, Option<String>) = (row.get(0), row.get(1));
    let (may_create, may_use_workers, may_use_locks): (bool, bool, bool) = (row.get(2), row.get(3), row.get(4));
    let schema = schema.unwrap_or_else(|| "(none: the search_path names no schema that exists)".into());
    let exist: bool = client.query_typed_one(sql::TABLES_EXIST, &[]).await.map_err(unavailable)?.get(0);
    let mut problems = Vec::new();
    let tables = if exist {
        let counts = client.query_typed_one(sql::COUNTS, &[]).await;
        match counts {
            Ok(counts) => {
                let (workers, locks): (i64, i64) = (counts.get(0), counts.get(1));
                format!("lock tables present: {workers} workers registered, {locks} locks held")
            }
            Err(_) => "lock tables present".to_owned(),
        }
    } else if may_create {
        format!("lock tables absent: the first lock service makes them in schema {schema}")
    } else {
        problems.push(format!(
            "the lock tables do not exist and user {user} may not create them in schema {schema}: have their owner \
             run:\n{}GRANT SELECT, INSERT, UPDATE, DELETE ON autocomp_lock_workers, autocomp_locks TO {user};",
            sql::CREATE_TABLES
        ));
        "lock tables absent".to_owned()
    };
    let synchronous: String = client.query_typed_one(sql::SYNCHRONOUS_COMMIT, &[]).await.map_err(unavailable)?.get(0);
    if let Some(problem) = commit_problem(&user, &synchronous) {
        problems.push(problem);
    }
    if !(may_use_workers && may_use_locks) {
        problems.push(format!(
            "user {user} may not read and write the lock tables: GRANT SELECT, INSERT, UPDATE, DELETE ON \
             autocomp_lock_workers, autocomp_locks TO {user}"
        ));
    }
    Ok(LockInspection {
        description: format!(
            "PostgreSQL {} answered as {user} (locks = {shown}); {tables}; lease {}",
            parsed.options.target,
            humantime::format_duration(parsed.lease)
        ),
        problems,
    })
}

/// Why a lock taken under this `synchronous_commit` may not survive the server, if it may
/// not: acknowledged before it is flushed (`off`: a crash loses it) or before a standby has
/// it (`local`: a failover loses it), a lost lock row lets a second host take the path while
/// its first holder still works.
fn commit_problem(user: &str, synchronous_commit: &str) -> Option<String> {
    let lost_by = match synchronous_commit {
        "off" => "a crash of the server",
        "local" => "a failover to a standby",
        _ => return None,
    };
    Some(format!(
        "synchronous_commit is {synchronous_commit} for user {user}: a lock is acknowledged before it is durable, so \
         {lost_by} can lose it and let a second host take a batch its holder still works on; \
         ALTER ROLE {user} SET synchronous_commit = on"
    ))
}

#[cfg(test)]
mod tests {
    use super::commit_problem;

    #[test]
    fn only_a_commit_setting_that_can_lose_an_acknowledged_lock_is_a_problem() {
        for durable in ["on", "remote_write", "remote_apply"] {
            assert_eq!(commit_problem("autocomp", durable), None, "{durable}");
        }
        let off = commit_problem("autocomp", "off").expect("off loses locks in a crash");
        assert!(
            off.contains("a crash of the server") && off.contains("ALTER ROLE autocomp SET synchronous_commit = on")
        );
        let local = commit_problem("autocomp", "local").expect("local loses locks in a failover");
        assert!(local.contains("a failover to a standby"));
    }
}
