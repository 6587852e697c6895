//! Where a catch-up and a query spend their time: the store's per-batch SQL as it runs it and with SQLITE_DBCONFIG_ENABLE_QPSG, and the typical query taken apart.

use super::*;

/// The statements the store's `load_batch` runs per batch (store/src/sqlite/ops.rs).
const LOAD_BATCH_SQL: [&str; 3] = [
    "SELECT type, priority, metadata, created_seq, modified_seq, changed_seq, created_at, modified_at
     FROM batches WHERE id = ?1",
    "SELECT seq, batch_id, type, outcome, agent, at, details, run_component, run_generation, resets
     FROM events WHERE batch_id = ?1 ORDER BY seq",
    "SELECT batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient
     FROM runs WHERE batch_id = ?1 AND state = 'open' ORDER BY batch_id, component, generation",
];
const PROFILE_SAMPLE: usize = 20_000;

pub(super) struct LoadProfile {
    pub(super) micros_per_batch: f64,
    pub(super) reprepared: f64,
}

/// Runs `load_batch`'s statements for the first batches of the feed on a raw connection,
/// as the store does (cached statements), with or without SQLITE_DBCONFIG_ENABLE_QPSG.
pub(super) fn profile_batch_load(store_path: &Path, qpsg: bool) -> LoadProfile {
    use rusqlite::{OpenFlags, StatementStatus, config::DbConfig};
    let conn = Connection::open_with_flags(store_path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open the store");
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, qpsg).expect("qpsg");
    let ids: Vec<String> = conn
        .prepare("SELECT id FROM batches ORDER BY changed_seq LIMIT ?1")
        .and_then(|mut s| s.query_map([PROFILE_SAMPLE as i64], |row| row.get(0))?.collect())
        .expect("ids");
    let run = || {
        let start = Instant::now();
        for id in &ids {
            for sql in LOAD_BATCH_SQL {
                let mut statement = conn.prepare_cached(sql).expect("prepare");
                let mut rows = statement.query([id]).expect("query");
                while let Some(row) = rows.next().expect("step") {
                    std::hint::black_box(row.get_ref(0).expect("column"));
                }
            }
        }
        start.elapsed()
    };
    run();
    let elapsed = run();
    let executions = 2 * ids.len() * LOAD_BATCH_SQL.len();
    let reprepared: i32 = LOAD_BATCH_SQL
        .iter()
        .map(|sql| conn.prepare_cached(sql).expect("prepare").get_status(StatementStatus::RePrepare))
        .sum();
    LoadProfile {
        micros_per_batch: elapsed.as_secs_f64() * 1e6 / ids.len().max(1) as f64,
        reprepared: reprepared as f64 / executions.max(1) as f64,
    }
}

pub(super) struct Profiles {
    pub(super) load_as_store: LoadProfile,
    pub(super) load_qpsg: LoadProfile,
    pub(super) query: QueryProfile,
}

pub(super) struct QueryProfile {
    pub(super) search: Latencies,
    pub(super) ids_fast_column: Latencies,
    pub(super) ids_stored: Latencies,
}

/// The typical trigger's tantivy work taken apart: the search itself (the query
/// `sboi/src/query.rs` builds, ordered top 100), then reading the 100 ids as `ids_of` does
/// (the `id` fast column, one `ord_to_str` per hit) or from the stored documents.
pub(super) fn profile_query(index_dir: &Path, trigger: &Trigger, iterations: usize) -> QueryProfile {
    use tantivy::collector::TopDocs;
    use tantivy::collector::sort_key::SortByStaticFastValue;
    use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, TermQuery};
    use tantivy::schema::{IndexRecordOption, Value as _};
    use tantivy::{Index, Order, TantivyDocument, Term};

    let index = Index::open_in_dir(index_dir).expect("open the index");
    let schema = index.schema();
    let field = |name: &str| schema.get_field(name).expect("field");
    let reader = index.reader().expect("reader");
    let searcher = reader.searcher();
    let term = |name: &str, text: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field(name), text), IndexRecordOption::Basic))
    };
    let query = || {
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, Box::new(AllQuery))];
        let types = trigger.types.iter().map(|t| (Occur::Should, term("type", t.as_str()))).collect();
        clauses.push((Occur::Must, Box::new(BooleanQuery::new(types))));
        clauses.extend(trigger.requires.iter().map(|t| (Occur::Must, term("succeeded", t.as_str()))));
        clauses.extend(trigger.blocked_by.iter().map(|t| (Occur::MustNot, term("present", t.as_str()))));
        BooleanQuery::new(clauses)
    };
    let limit = trigger.limit.unwrap_or(100);
    let search = || {
        let order = (
            (SortByStaticFastValue::<i64>::for_field("priority"), Order::Desc),
            (SortByStaticFastValue::<i64>::for_field("created_seq"), Order::Asc),
        );
        searcher.search(&query(), &TopDocs::with_limit(limit).order_by(order)).expect("search")
    };
    let hits: Vec<tantivy::DocAddress> = search().into_iter().map(|(_, address)| address).collect();
    let warm_up = WARM_UP.min(iterations);
    QueryProfile {
        search: Latencies::measure(iterations, warm_up, None, || search().len()),
        ids_fast_column: Latencies::measure(iterations, warm_up, None, || {
            let mut text = String::new();
            let mut total = 0;
            let mut columns = vec![None; searcher.segment_readers().len()];
            for address in &hits {
                let segment = address.segment_ord as usize;
                if columns[segment].is_none() {
                    columns[segment] =
                        searcher.segment_reader(address.segment_ord).fast_fields().str("id").expect("id");
                }
                let column: &tantivy::columnar::StrColumn = columns[segment].as_ref().expect("id column");
                let ord = column.term_ords(address.doc_id).next().expect("ord");
                text.clear();
                column.ord_to_str(ord, &mut text).expect("ord_to_str");
                total += text.len();
            }
            total
        }),
        ids_stored: Latencies::measure(iterations, warm_up, None, || {
            let mut total = 0;
            for address in &hits {
                let document: TantivyDocument = searcher.doc(*address).expect("doc");
                total += document.get_first(field("id")).and_then(|v| v.as_str()).map_or(0, str::len);
            }
            total
        }),
    }
}
