//! Statements prepared once per connection and run again from its cache, where
//! `Connection::execute` and `query_row` parse and compile their SQL (the triggers an insert
//! fires included) at every call: that was a quarter to a half of a claim's and an append's
//! CPU on the embedded file. The cache holds more statements than a stage's calls use
//! together, so a watcher's cycle never evicts its own.

use rusqlite::{Connection, Params, Row};

/// Statements a connection keeps prepared (rusqlite's default is 16, fewer than the distinct
/// statements of a registration, a look, a claim and an append, which then evicted each other
/// at every call).
const CACHED_STATEMENTS: usize = 128;

/// Sets a connection of the store to keep `CACHED_STATEMENTS` prepared.
pub(super) fn keep_prepared(conn: &Connection) {
    conn.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
}

/// `execute` and `query_row` through the connection's statement cache.
pub(super) trait Prepared {
    /// `Connection::execute`, its statement prepared once per connection.
    fn execute_prepared<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// `Connection::query_row`, its statement prepared once per connection.
    fn query_row_prepared<T, P, F>(&self, sql: &str, params: P, row: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Prepared for Connection {
    fn execute_prepared<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_prepared<T, P, F>(&self, sql: &str, params: P, row: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;

    /// A stage's calls use a few dozen distinct statements in turn; each must be the one
    /// prepared the first time, run again (an evicted one would be prepared anew, its run
    /// count starting over).
    #[test]
    fn statements_used_in_turn_are_each_prepared_once() {
        let conn = Connection::open_in_memory().unwrap();
        keep_prepared(&conn);
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        let inserts: Vec<String> = (0..60).map(|n| format!("INSERT INTO t (n) VALUES (?1 + {n})")).collect();
        let counts: Vec<String> = (0..60).map(|n| format!("SELECT count(*) + {n} FROM t")).collect();
        for round in 0..3 {
            for (insert, count) in inserts.iter().zip(&counts) {
                conn.execute_prepared(insert, [round]).unwrap();
                let _: i64 = conn.query_row_prepared(count, [], |row| row.get(0)).unwrap();
            }
        }
        for sql in inserts.iter().chain(&counts) {
            let statement = conn.prepare_cached(sql).unwrap();
            assert_eq!(statement.get_status(StatementStatus::Run), 3, "{sql}");
        }
    }
}
