//! The contract of output saved apart from a result, run by the shared suite
//! (`operations.rs`) against every backend: a running run's output so far reads back and is
//! replaced, a cancelled run keeps saving, any other run is fenced, a result's run removes it,
//! nothing moves a seq, and bad output is refused by name.

use autocomp_model::*;
use autocomp_store::*;
use serde_json::json;

use super::{Fixture, agent, component, holder, id, register, ty};

fn printed(line: &str) -> RunOutput {
    RunOutput { streams: vec![OutputStream { name: "stdout".into(), head: line.into(), ..Default::default() }] }
}

pub(crate) async fn a_runs_output_is_saved_while_it_runs_and_after_a_cancel_and_goes_with_its_result(f: Fixture) {
    register(&f.store, "B1").await;
    let (b, c) = (id("B1"), component("archiver"));
    assert!(f.store.run_outputs(&b).await.unwrap().is_empty());
    let first = f.store.claim(&b, &c, &holder("a")).await.unwrap();
    let head = f.store.head().await.unwrap();
    f.store.set_run_output(&b, &c, first.generation(), Some(printed("page 1\n")), false).await.unwrap();
    f.store.set_run_output(&b, &c, first.generation(), Some(printed("page 1\npage 2\u{0}\n")), false).await.unwrap();
    assert_eq!(f.store.head().await.unwrap(), head, "saving output moves no seq");
    let saved = f.store.run_outputs(&b).await.unwrap();
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!((saved[0].component.as_str(), saved[0].generation, saved[0].state), ("archiver", 1, RunState::Open));
    assert_eq!(saved[0].output, printed("page 1\npage 2\u{0}\n"), "replaced, every character kept");

    assert!(!saved[0].whole, "what it printed so far");

    // An operator cancels: a snapshot of the output so far is fenced from now on (it would
    // land after the whole), while the fenced runner saves what the work printed until it
    // stopped, whole.
    let cancel = NewEvent::new(ty("Data_Archived"), Outcome::Failure, agent("operator:alice"))
        .with_details(json!({"cancelled": true, "reason": "hung"}));
    f.store.cancel_run(&b, &c, cancel).await.unwrap();
    let late = f.store.set_run_output(&b, &c, first.generation(), Some(printed("page 1\n")), false).await.unwrap_err();
    assert!(matches!(&late, StoreError::Fenced { reason, .. } if reason.contains("cancelled")), "{late}");
    f.store.set_run_output(&b, &c, first.generation(), Some(printed("page 1\npage 2\nkilled\n")), true).await.unwrap();
    let saved = f.store.run_outputs(&b).await.unwrap();
    assert_eq!((saved[0].state, saved[0].output.clone()), (RunState::Cancelled, printed("page 1\npage 2\nkilled\n")));
    assert!(saved[0].whole);

    // The next run records a result: what it saved goes, the cancelled run's stays; a run
    // with its result recorded, or one never claimed, is fenced.
    let second = f.store.claim(&b, &c, &holder("b")).await.unwrap();
    f.store.set_run_output(&b, &c, second.generation(), Some(printed("again\n")), false).await.unwrap();
    assert_eq!(f.store.run_outputs(&b).await.unwrap().len(), 2);
    let done = NewEvent::new(ty("Data_Archived"), Outcome::Success, agent("b")).in_run(c.clone(), second.generation());
    f.store.append_event(&b, done).await.unwrap();
    let late = f.store.set_run_output(&b, &c, second.generation(), Some(printed("late\n")), true).await.unwrap_err();
    assert!(matches!(&late, StoreError::Fenced { reason, .. } if reason.contains("recorded")), "{late}");
    f.store.set_run_output(&b, &c, second.generation(), None, false).await.unwrap();
    f.store.set_run_output(&b, &c, second.generation(), None, false).await.expect("removing twice is a no-op");
    let never = f.store.set_run_output(&b, &c, 9, Some(printed("x")), true).await.unwrap_err();
    assert!(never.is_fenced(), "{never}");
    let saved = f.store.run_outputs(&b).await.unwrap();
    assert_eq!(saved.iter().map(|s| (s.generation, s.state)).collect::<Vec<_>>(), [(1, RunState::Cancelled)]);

    // Unknown batches and bad output are refused by name; nothing is written.
    let unknown = f.store.run_outputs(&id("NOPE")).await.unwrap_err();
    assert!(matches!(unknown, StoreError::NotFound(_)), "{unknown}");
    let unknown = f.store.set_run_output(&id("NOPE"), &c, 1, Some(printed("x")), false).await.unwrap_err();
    assert!(matches!(unknown, StoreError::NotFound(_)), "{unknown}");
    let third = f.store.claim(&b, &c, &holder("c")).await.unwrap();
    let huge = printed(&"x".repeat(MAX_OUTPUT_BYTES + 1));
    let refused = f.store.set_run_output(&b, &c, third.generation(), Some(huge), false).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "output"), "{refused}");
    let many = RunOutput {
        streams: (0..=MAX_OUTPUT_STREAMS)
            .map(|i| OutputStream { name: format!("s{i}"), head: "x".into(), ..Default::default() })
            .collect(),
    };
    let refused = f.store.set_run_output(&b, &c, third.generation(), Some(many), false).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Invalid(e) if e.field == "output.streams"), "{refused}");
    assert_eq!(f.store.run_outputs(&b).await.unwrap().len(), 1, "nothing written");
}
