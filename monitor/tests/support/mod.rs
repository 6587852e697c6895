//! What the monitor's test files share: a pipeline of its own in a temp dir (a SQLite store,
//! a local index and flock locks, named by `config/autocomp.toml` as a deployment names
//! them) with an operator over it, and batch ids.

#![allow(dead_code)] // each test file uses what it needs

use std::sync::Arc;

use autocomp_framework::config::Backends;
use autocomp_model::BatchId;
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;

/// An empty pipeline in a temp dir (removed when the dir is dropped), read and written by an
/// operator named `name` (`None`: the monitor's own, which acts for each signed-in account).
pub async fn temp_pipeline(name: Option<&str>) -> (Operator, Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("config")).unwrap();
    let shared = format!(
        "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
        root.join("store.db").display(),
        root.join("index").display(),
        root.join("locks").display()
    );
    std::fs::write(root.join("config/autocomp.toml"), shared).unwrap();
    let operator = Operator::new(&root.join("config"), Backends::default(), name.map(str::to_owned)).unwrap();
    let store = operator.store().await.unwrap();
    (operator, store, dir)
}

pub fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}
