//! What the SQLite store does with a file that is already there: its own store is opened, a
//! new path becomes a new store, and anything else (an empty file, a file that is not
//! SQLite, a SQLite database of something else) is refused as bad input naming the file,
//! left exactly as it was.

use std::process::Command;

use autocomp_store::{SqliteStore, StoreError};

fn refused(path: &std::path::Path) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    match runtime.block_on(SqliteStore::open(path)) {
        Err(StoreError::Invalid(invalid)) => {
            assert_eq!((invalid.field.as_str(), invalid.value.as_str()), ("store file", path.to_str().unwrap()));
            invalid.to_string()
        }
        Err(other) => panic!("{} refused as {other:?}, not as bad input", path.display()),
        Ok(_) => panic!("{} opened as a store", path.display()),
    }
}

#[test]
fn a_file_autocomp_did_not_make_is_refused_naming_it_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    assert!(refused(&empty).contains("is an empty file"));
    assert_eq!(std::fs::read(&empty).unwrap(), b"");

    let text = dir.path().join("notes.db");
    let content = b"these are notes, not a database\n".repeat(200);
    std::fs::write(&text, &content).unwrap();
    assert!(refused(&text).contains("is not a SQLite database"));
    assert_eq!(std::fs::read(&text).unwrap(), content);

    let other = dir.path().join("other.db");
    let connection = rusqlite::Connection::open(&other).unwrap();
    connection
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY); INSERT INTO invoices VALUES (7);")
        .unwrap();
    drop(connection);
    let before = std::fs::read(&other).unwrap();
    assert!(refused(&other).contains("a SQLite database of something else"));
    assert_eq!(std::fs::read(&other).unwrap(), before, "no table of ours was added");

    // The service refuses it at start as configuration (exit 2), naming the file.
    let served = Command::new(env!("CARGO_BIN_EXE_autocomp-store"))
        .args(["serve", "--db", &format!("sqlite://{}", empty.display()), "--listen", "127.0.0.1:0"])
        .env("AUTOCOMP_TOKEN", "a-token-long-enough")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&served.stderr);
    assert_eq!(served.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(empty.to_str().unwrap()) && stderr.contains("is an empty file"), "{stderr}");
}

#[test]
fn a_new_path_becomes_a_store_and_the_store_opens_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    drop(runtime.block_on(SqliteStore::open(&path)).expect("a new store"));
    assert!(std::fs::metadata(&path).unwrap().len() > 0);
    drop(runtime.block_on(SqliteStore::open(&path)).expect("its own store opens again"));
}

/// Each commit appends whom it concerns to `<store>-wake`, as a watcher of this release or of
/// the release before reads it: a batch registered with its first event is announced as `c:`
/// (which the release before reads as concerning everyone, so its waiters for a step that
/// requires nothing still wake) and then its event's type, in one write.
#[test]
fn a_registration_with_its_first_event_is_announced_as_a_registration_and_its_type() {
    use autocomp_model::{Agent, BatchId, BatchType, EventType, NewBatch, NewEvent, Outcome};
    use autocomp_store::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let wake_file = dir.path().join("store.db-wake");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = runtime.block_on(SqliteStore::open(&path)).unwrap();
    let lines_after = |write: &dyn Fn()| {
        let before = std::fs::read(&wake_file).map_or(0, |bytes| bytes.len());
        write();
        let after = std::fs::read(&wake_file).unwrap();
        String::from_utf8(after[before..].to_vec()).unwrap()
    };
    let new = |id: &str| NewBatch::new(BatchId::new(id).unwrap(), BatchType::new("Delivery").unwrap());
    let received =
        || NewEvent::new(EventType::new("Data_Received").unwrap(), Outcome::Success, Agent::new("trigger").unwrap());
    let registered = lines_after(&|| {
        runtime.block_on(store.register_batch(new("B1"), received())).unwrap();
    });
    assert_eq!(registered, "c:\nt:Data_Received\n");
    let created = lines_after(&|| {
        runtime.block_on(store.create_batch(new("B2"))).unwrap();
    });
    assert_eq!(created, "c:\n");
    let appended = lines_after(&|| {
        runtime.block_on(store.append_event(&BatchId::new("B2").unwrap(), received())).unwrap();
    });
    assert_eq!(appended, "t:Data_Received\n");
}
