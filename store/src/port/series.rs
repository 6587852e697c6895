//! `SeriesStore`: what components' work came to over time, and the backlog samples beside it,
//! kept per minute and per hour for the monitor's charts.

use autocomp_model::{BacklogSample, ComponentName, SeriesStep, Timestamp, WorkPoint};

use super::StoreResult;
use crate::write_rules;

port_trait! {
    /// The work series.
    pub trait SeriesStore {
        /// What components' work came to over time, per minute (the last `WORK_MINUTES_KEPT`) or
        /// per hour (the last `WORK_HOURS_KEPT`), from the step holding `since` on, of one
        /// component or all: only the steps with results or a backlog sample, by component and
        /// time, in store time.
        async fn work_series(
            &self,
            step: SeriesStep,
            since: Timestamp,
            component: Option<&ComponentName>,
        ) -> StoreResult<Vec<WorkPoint>>;

        /// Records each component's backlog as sampled now (the monitor samples it): the newest
        /// sample of the current minute and of the current hour, by the store's clock. Samples
        /// older than the registry keeps are dropped. Takes no seq.
        #[checked(write_rules::check_backlog(&samples)?)]
        async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()>;
    }
}
