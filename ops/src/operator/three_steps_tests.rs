//! The embedded pipeline the read commands' tests share: an operator (`tester`) on a SQLite
//! store, a local index and flock locks in a temp dir, with three steps registered, each
//! requiring the one before and blocked by its own type, as a component is unless its config
//! says otherwise.

use std::sync::Arc;

use autocomp_framework::config::Backends;
use autocomp_model::Trigger;
use autocomp_store::ObjectStore;

use crate::operator::Operator;

/// name, event type, required type.
pub(super) const PIPELINE: [(&str, &str, &str); 3] = [
    ("verifier", "Verified", "Data_Received"),
    ("checker", "Checked", "Verified"),
    ("archiver", "Archived", "Checked"),
];

pub(super) struct ThreeSteps {
    pub operator: Operator,
    pub store: Arc<dyn ObjectStore>,
    pub dir: tempfile::TempDir,
}

pub(super) async fn three_steps() -> ThreeSteps {
    let dir = tempfile::tempdir().unwrap();
    let backends = Backends {
        store: Some(format!("sqlite://{}", dir.path().join("store.db").display())),
        index: Some(format!("local:{}", dir.path().join("index").display())),
        locks: Some(format!("local:{}", dir.path().join("locks").display())),
    };
    let operator = Operator::new(dir.path(), backends, Some("tester".into())).unwrap();
    let store = operator.store().await.unwrap();
    for (name, event_type, requires) in PIPELINE {
        let trigger = Trigger::builder().requires(requires).blocked_by(event_type).build();
        autocomp_framework::testing::register_component(store.as_ref(), name, event_type, trigger).await;
    }
    ThreeSteps { operator, store, dir }
}
