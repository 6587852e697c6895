//! `SteeringStore`: the pipeline's steering state (holds, pools, breakers) and its log, changed by
//! operators and breakers and honoured by every runner.

use autocomp_model::{Steering, SteeringEntry, SteeringRequest};

use super::StoreResult;
use crate::pipeline_state::Steered;
use crate::steering_rules;

port_trait! {
    /// The pipeline's steering state and log.
    pub trait SteeringStore {
        /// The pipeline's steering state: holds (paused, draining, circuit open), resource pools
        /// and breaker counts, as the last change left it (`Steering::default()` before any).
        async fn steering(&self) -> StoreResult<Steering>;

        /// Applies a steering change as `Steering::apply` decides it, in one transaction: the new
        /// state, its entry in the steering log (when it has one), and a seq taken from the
        /// store's counter so the head moves and every watcher wakes to honour it. A change that
        /// leaves the state as it was (a success with no breaker count) writes nothing. Refused
        /// (nothing written) as `Invalid` or `Conflict` as `apply` refuses it.
        #[checked(steering_rules::check_steering(&request)?)]
        async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered>;

        /// The newest `limit` (1 to `MAX_STEERING_LOG_PAGE`) entries of the steering log,
        /// newest first: who paused, resumed, resized a pool or opened a circuit, when and why.
        #[checked(steering_rules::check_log_limit(limit)?)]
        async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>>;
    }
}
