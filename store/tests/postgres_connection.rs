//! Reaching PostgreSQL as an operator configures it: TLS by `sslmode` (rustls), a password
//! that never shows in an error, several hosts with `target_session_attrs=read-write`, and
//! the error kinds the binaries turn into exit codes. Real servers, real certificates.

use std::path::Path;
use std::process::Command;

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::{NamedDatabase, Options, Postgres, shared};

fn ssl_in_use(server: &Postgres, database: &str) -> String {
    server.psql(database, "SELECT string_agg(ssl::text, ',') FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = 'autocomp'")
}

/// The server's certificate names `localhost` only (see `Options::tls`), so by address
/// (`127.0.0.1`) its name does not match.
#[tokio::test]
async fn each_sslmode_verifies_what_it_promises() {
    let server = Postgres::start_with(Options::default().with_tls());
    let tls = server.tls();
    server.create_database("tls");
    let port = server.port();
    let url = |host: &str, query: &str| format!("postgres://autocomp@{host}:{port}/tls?{query}");
    let with_ca = |mode: &str, ca: &Path| format!("sslmode={mode}&sslrootcert={}", ca.display());

    // require: encrypted, whatever the certificate.
    let encrypted = PgStore::open(&url("127.0.0.1", "sslmode=require")).await.unwrap();
    encrypted.create_batch(NewBatch::new("B1".parse().unwrap(), "RoundTrip".parse().unwrap())).await.unwrap();
    assert!(ssl_in_use(&server, "tls").contains("true"), "the store's connection uses TLS");
    drop(encrypted);

    // verify-full with the CA that signed it, by the name it carries: connects.
    let store = PgStore::open(&url("localhost", &with_ca("verify-full", &tls.ca))).await.unwrap();
    assert_eq!(store.count_batches().await.unwrap(), 1);
    // verify-ca checks the chain only: by address, the name does not matter.
    let store = PgStore::open(&url("127.0.0.1", &with_ca("verify-ca", &tls.ca))).await.unwrap();
    assert_eq!(store.count_batches().await.unwrap(), 1);

    // verify-full by address: a host-name mismatch, refused as configuration.
    let error = PgStore::open(&url("127.0.0.1", &with_ca("verify-full", &tls.ca))).await.err().expect("name mismatch");
    assert!(matches!(&error, StoreError::Invalid(e) if e.field == "sslrootcert"), "{error:?}");
    assert!(error.to_string().contains("host name"), "says why: {error}");

    // Another CA: refused under verify-full and verify-ca, as configuration (exit 2).
    for (host, mode) in [("localhost", "verify-full"), ("127.0.0.1", "verify-ca")] {
        let error = PgStore::open(&url(host, &with_ca(mode, &tls.other_ca))).await.err().expect("unknown issuer");
        assert!(matches!(&error, StoreError::Invalid(e) if e.field == "sslrootcert"), "{mode}: {error:?}");
        let text = error.to_string();
        assert!(
            text.contains(&format!("{host}:{port}")) && text.contains("not signed by a CA in sslrootcert"),
            "{text}"
        );
    }
    let output = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["migrate", "--db", &url("localhost", &with_ca("verify-full", &tls.other_ca))])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));

    // prefer (libpq's default) and require accept the certificate unverified, and say so
    // once per process; verify-full says nothing.
    for (query, warned) in
        [("sslmode=prefer", 1), ("sslmode=require", 1), (with_ca("verify-full", &tls.ca).as_str(), 0)]
    {
        let output = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
            .args(["migrate", "--db", &url("localhost", query)])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{query}: {stderr}");
        assert_eq!(stderr.matches("certificate is not verified").count(), warned, "{query}: {stderr}");
    }

    let missing = PgStore::open(&url("localhost", "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")).await;
    let error = missing.err().expect("a missing CA file is a configuration error");
    assert!(matches!(&error, StoreError::Invalid(e) if e.field == "sslrootcert"), "{error}");
    // sslrootcert with a mode that would ignore it: refused rather than silently unverified.
    let ignored = PgStore::open(&url("localhost", &with_ca("require", &tls.ca))).await;
    assert!(ignored.err().expect("sslrootcert needs verify-*").to_string().contains("verify-ca or verify-full"));
}

#[tokio::test]
async fn a_wrong_password_is_a_configuration_error_that_never_shows_the_password() {
    let server = shared();
    let database = server.unique_named_database().name;
    server.psql(&database, "CREATE ROLE pw_user LOGIN PASSWORD 'right-horse-battery'");
    // As the README asks: the role owns its database.
    server.psql("postgres", &format!("ALTER DATABASE {database} OWNER TO pw_user"));
    // Ask for the password from this role only (the harness trusts every other).
    let hba = server.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all pw_user 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
    server.psql("postgres", "SELECT pg_reload_conf()");

    let host = server.host_port();
    let wrong = format!("postgres://pw_user:staple-hunter2@{host}/{database}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let error = loop {
        match PgStore::open(&wrong).await {
            Err(error) => break error,
            Ok(_) => assert!(std::time::Instant::now() < deadline, "the reloaded pg_hba.conf never applied"),
        }
    };
    assert!(matches!(error, StoreError::Invalid(_)), "credentials are configuration: {error}");
    let text = format!("{error} {error:?}");
    assert!(text.contains("pw_user") && text.contains(&host), "names user and host: {text}");
    assert!(!text.contains("staple-hunter2"), "never the password: {text}");

    // The right password, from the environment as libpq reads it, works.
    let right = format!("postgres://pw_user@{host}/{database}");
    // SAFETY: this test alone reads PGPASSWORD; no other test sets or reads it.
    unsafe { std::env::set_var("PGPASSWORD", "right-horse-battery") };
    let opened = PgStore::open(&right).await;
    unsafe { std::env::remove_var("PGPASSWORD") };
    let store = opened.unwrap();
    assert_eq!(store.count_batches().await.unwrap(), 0);
}

/// As the README sets a role up: it owns its database, and nothing more (no superuser, no
/// grant on a parameter). It migrates to the last schema and works. (The writer functions
/// once named a parameter of their own in a `SET` clause, which PostgreSQL 15 lets only a
/// superuser or a granted role do: such a role stayed on schema 19.)
#[tokio::test]
async fn a_role_owning_its_database_and_nothing_more_migrates_to_the_last_schema() {
    let server = shared();
    let database = server.unique_named_database().name;
    let role = format!("owner_{database}");
    server.psql("postgres", &format!("CREATE ROLE {role} LOGIN; ALTER DATABASE {database} OWNER TO {role}"));
    let url = format!("postgres://{role}@{}/{database}", server.host_port());

    let (_, now) = PgStore::migrate(&url).await.expect("the owner migrates");
    assert_eq!(now, postgres::LATEST_VERSION);
    let store = PgStore::open(&url).await.unwrap();
    let batch = BatchId::new("B1").unwrap();
    let agent = Agent::new("a").unwrap();
    let registered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent.clone());
    store.register_batch(NewBatch::new(batch.clone(), BatchType::new("T").unwrap()), registered).await.unwrap();
    let step = ComponentName::new("step").unwrap();
    let holder = RunHolder {
        agent: Agent::new("step/1.0@host#1").unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: None,
    };
    let generation = store.claim(&batch, &step, &holder).await.unwrap().generation();
    let done = NewEvent::new("Step_Done".parse().unwrap(), Outcome::Success, agent).in_run(step, generation);
    store.append_event(&batch, done).await.unwrap();
    let summary = store.get_summaries(std::slice::from_ref(&batch)).await.unwrap().remove(0);
    assert_eq!(summary, BatchSummary::of(&store.get_batch(&batch).await.unwrap()));
    assert_eq!(summary.effective.len(), 2, "{summary:?}");
    let superuser = server.psql("postgres", &format!("SELECT rolsuper FROM pg_roles WHERE rolname = '{role}'"));
    assert_eq!(superuser.trim(), "f", "not a superuser");
    // Grants on parameters exist from PostgreSQL 15 (13 and 14 have none to give).
    let version: u32 = server.psql("postgres", "SHOW server_version_num").trim().parse().unwrap();
    if version >= 150_000 {
        let grants = server.psql("postgres", "SELECT count(*) FROM pg_parameter_acl");
        assert_eq!(grants.trim(), "0", "no grant on a parameter");
    }
}

#[tokio::test]
async fn unreachable_hosts_are_unavailable_at_once_naming_host_and_user() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://someone:pw-secret@127.0.0.1:{port}/autocomp?connect_timeout=2");
    let started = std::time::Instant::now();
    let error = open_store(&url).await.err().expect("nothing listens there");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "fails at once, not after retry_for");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    let text = error.to_string();
    assert!(text.contains(&format!("someone@127.0.0.1:{port}/autocomp")), "{text}");
    assert!(!text.contains("pw-secret"), "{text}");

    let missing = shared().url("no_such_database");
    let error = open_store(&missing).await.err().expect("no such database");
    assert!(matches!(&error, StoreError::Invalid(e) if e.reason.contains("no such database")), "{error}");
}

#[tokio::test]
async fn several_hosts_with_read_write_reach_the_primary_whichever_comes_first() {
    let primary = Postgres::start();
    let url = primary.create_database("pair");
    let store = PgStore::open(&url).await.unwrap();
    store.create_batch(NewBatch::new("B1".parse().unwrap(), "RoundTrip".parse().unwrap())).await.unwrap();
    let standby = primary.standby(false);
    // The standby first: it is read-only, so the client moves on to the primary.
    let both = format!(
        "postgres://autocomp@{},{}/pair?target_session_attrs=read-write",
        standby.host_port(),
        primary.host_port()
    );
    let store = PgStore::open(&both).await.unwrap();
    let event = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, "test".parse().unwrap());
    store.append_event(&"B1".parse().unwrap(), event).await.unwrap();
    assert!(store.target().contains(&standby.host_port()) && store.target().contains(&primary.host_port()));
}

/// The feed reads the horizon, then the batches up to it, each in a statement (and so a
/// transaction and a snapshot) of its own: whatever isolation a database's transactions
/// default to, the read after the horizon sees every writer the horizon waited for.
#[tokio::test(flavor = "multi_thread")]
async fn the_change_feed_answers_the_same_whatever_the_databases_default_isolation() {
    let server = shared();
    for isolation in ["read committed", "repeatable read", "serializable"] {
        let database = format!("feed_{}_{}", isolation.replace(' ', "_"), std::process::id());
        let url = server.create_database(&database);
        let store = PgStore::open(&url).await.unwrap();
        for n in 1..=3 {
            store
                .create_batch(NewBatch::new(format!("B{n}").parse().unwrap(), "RoundTrip".parse().unwrap()))
                .await
                .unwrap();
        }
        let psql = |sql: &str| tokio::task::block_in_place(|| server.psql(&database, sql));
        psql(&format!("ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{isolation}'"));
        // New connections take the setting.
        let store = PgStore::open(&url).await.unwrap();
        assert_eq!(psql("SHOW default_transaction_isolation").trim(), isolation);
        let page = store.changes(Seq(0), 10).await.unwrap();
        let ids: Vec<&str> = page.changes.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(ids, ["B1", "B2", "B3"], "{isolation}");
        assert_eq!((page.head, page.next), (store.head().await.unwrap(), page.head), "{isolation}");
        let after = store.changes(page.changes[1].0, 10).await.unwrap();
        assert_eq!(after.changes.len(), 1, "{isolation}");
    }
}

#[test]
fn autocomp_store_migrate_brings_a_database_up_once_and_refuses_what_it_cannot_migrate() {
    let migrate = |db: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_autocomp-store")).args(["migrate", "--db", db]).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code(), text)
    };
    let url = shared().unique_database();
    let (code, text) = migrate(&url);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("schema version {LATEST_SCHEMA_VERSION_PG}: applied")), "{text}");
    let (code, text) = migrate(&url);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("already current"), "{text}");

    let (code, text) = migrate("sqlite:///tmp/x.db");
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("PostgreSQL"), "{text}");
    let (code, text) = migrate(&format!("postgres://autocomp:pw-secret@{}/no_such_db", shared().host_port()));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("no such database") && !text.contains("pw-secret"), "{text}");
}

const LATEST_SCHEMA_VERSION_PG: i32 = autocomp_store::postgres::LATEST_VERSION;

/// A judged claim whose read the server refuses (here a role without the grant the read
/// needs) reports that refusal, not the aborted transaction's complaint about the statements
/// sent after it in the same round trip; and nothing is claimed.
#[tokio::test]
async fn a_judged_claim_whose_read_is_refused_reports_that_refusal_and_claims_nothing() {
    let server = shared();
    let NamedDatabase { name: database, url } = server.unique_named_database();
    let owner = PgStore::open(&url).await.unwrap();
    let id: BatchId = "J1".parse().unwrap();
    let agent = Agent::new("trigger/1.0@host#1").unwrap();
    let received = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, agent.clone());
    owner.register_batch(NewBatch::new(id.clone(), "Item".parse().unwrap()), received).await.unwrap();
    let stamp = owner.get_summaries(std::slice::from_ref(&id)).await.unwrap()[0].changed_seq;
    let version = owner.steering().await.unwrap().version;
    let role = format!("{database}_no_runs");
    server.psql(
        &database,
        &format!(
            "CREATE ROLE {role} LOGIN; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; \
             GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}; \
             REVOKE SELECT ON runs FROM {role}"
        ),
    );
    let store = PgStore::open(&format!("postgres://{role}@{}/{database}", server.host_port())).await.unwrap();
    let component: ComponentName = "probe".parse().unwrap();
    let trigger = Trigger { requires: vec!["Data_Received".parse().unwrap()], ..Trigger::default() };
    let request = ReadyClaimRequest {
        batches: vec![id.clone()],
        descriptor: ComponentDescriptor::new(component.clone(), "1.0", "Probed".parse().unwrap(), trigger),
        holder: RunHolder { agent, host: "host".into(), pid: 1, claim_key: None, liveness: Some("pg:worker-1".into()) },
        force: false,
        known_steering: Some(version),
        exclusive: true,
        takeovers: Vec::new(),
    };
    let error = store.claim_ready_judged(&request, &[stamp]).await.unwrap_err();
    assert!(error.to_string().contains("permission denied for table runs"), "the read's own refusal: {error}");
    assert_eq!(owner.run_state(&id, &component).await.unwrap(), None, "nothing claimed");
}
