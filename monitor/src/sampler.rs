//! The backlog sampler: every tick, each pipeline component's batches ready for it (at a
//! human step: waiting for a person), counted by the batch index as the overview counts
//! them, recorded in the store's registry (`ObjectStore::record_backlog`) for the charts.

use std::time::Duration;

use autocomp_model::{BacklogSample, Selection};
use autocomp_ops::operator::{Operator, OperatorError, ready_state};

/// How often the monitor samples the backlog unless told otherwise (`--sample-every`).
pub const DEFAULT_EVERY: Duration = Duration::from_secs(60);

/// One sample: one index tally for every component of the pipeline (retired ones are not
/// in it), then one `record_backlog`. Answers the samples recorded. Several monitors may
/// sample: the newest sample of a minute (and of an hour) is the one kept.
pub async fn sample_once(operator: &Operator) -> Result<Vec<BacklogSample>, OperatorError> {
    let store = operator.store().await?;
    let pipeline = operator.pipeline(store.as_ref()).await?;
    if pipeline.is_empty() {
        return Ok(Vec::new());
    }
    let index = operator.index(&store)?;
    let ready: Vec<Selection> =
        pipeline.iter().map(|step| Selection::component_state(step.descriptor(), ready_state(step))).collect();
    let tallies = index.tally(&ready, false).await?;
    let samples: Vec<BacklogSample> = pipeline
        .iter()
        .zip(&tallies)
        .map(|(step, tally)| BacklogSample { component: step.name().clone(), ready: tally.count })
        .collect();
    store.record_backlog(samples.clone()).await?;
    Ok(samples)
}

/// `--sample-every`: a sample every `every` for as long as the monitor serves. A sample that
/// fails (the store or index down) is logged at warn and taken again at the next tick.
pub async fn run(operator: Operator, every: Duration) {
    let mut ticks = tokio::time::interval(every.max(Duration::from_secs(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match sample_once(&operator).await {
            Ok(samples) => tracing::debug!(components = samples.len(), "backlog sampled"),
            Err(error) => tracing::warn!("backlog sample failed (tried again in {every:?}): {error}"),
        }
    }
}
