//! PostgreSQL's steering record and log (`SteeringStore`). A steering change is computed here by
//! `Steering::apply` from the record as read (with the server's clock) and written only if the
//! record's version has not moved (`autocomp_steer`); otherwise it reads again.

use std::time::Duration;

use super::calls::prepare;
use super::rows::corrupt;
use super::text::{self, unjsoned};
use super::{PgBackend, Retry};
use crate::pipeline_state::Steered;
use crate::port::{SteeringStore, StoreError, StoreResult};
use crate::steering_rules;
use autocomp_model::{Steering, SteeringEntry, SteeringRequest, Timestamp};

/// How long a change is computed again after other writers moved the record first, before it
/// is given up as `Unavailable`: long enough for any burst of concurrent changes (a pipeline's
/// runners each counting a failure), which a fixed number of attempts was not.
const STEER_PATIENCE: Duration = Duration::from_secs(30);
/// The longest pause between two attempts; each pause is drawn at random up to a bound that
/// doubles with every lost race, so writers that collided spread out instead of colliding again.
const STEER_MAX_PAUSE_MS: u64 = 64;

/// A pause of 0 to `bound_ms` milliseconds, drawn at random.
fn jitter(bound_ms: u64) -> Duration {
    use std::hash::BuildHasher;
    // Each `RandomState` is keyed anew: a different draw per call, per process.
    let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    Duration::from_micros(random % (bound_ms * 1_000 + 1))
}

impl PgBackend {
    /// The record with its version and the server's clock.
    async fn read_steering(&self) -> StoreResult<(Steering, i64, Timestamp)> {
        self.run("steering", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT state, version, autocomp_now() FROM steering WHERE id = 1").await?;
                let row = client.query_one(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                let mut steering: Steering =
                    serde_json::from_value(unjsoned(row.get(0))).map_err(|e| corrupt("steering record", e))?;
                let version: i64 = row.get(1);
                steering.version = version as u64;
                Ok((steering, version, Timestamp(row.get(2))))
            })
        })
        .await
    }

    pub(super) async fn pg_steering(&self) -> StoreResult<Steering> {
        Ok(self.read_steering().await?.0)
    }

    pub(super) async fn pg_steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        let request = steering_rules::bounded(request);
        let deadline = tokio::time::Instant::now() + STEER_PATIENCE;
        let mut lost = 0u32;
        loop {
            let (mut steering, version, at) = self.read_steering().await?;
            let applied = steering.apply(&request, at).map_err(steering_rules::refused)?;
            if !applied.changed {
                // Nothing to write: the head stays, no watcher wakes.
                return Ok(Steered { steering, entry: None, circuit_opened: false });
            }
            let state = serde_json::to_value(&steering).map_err(|e| StoreError::Unavailable(e.to_string()))?;
            let entry = match &applied.entry {
                Some(entry) => Some(serde_json::to_value(entry).map_err(|e| StoreError::Unavailable(e.to_string()))?),
                None => None,
            };
            let (state, entry) = (text::json(&state).into_owned(), entry.map(|e| text::json(&e).into_owned()));
            let (state, entry) = (&state, &entry);
            let written = self
                .run("steer", Retry::OnlyUnsent, |client, _| {
                    Box::pin(async move {
                        let statement = prepare(client, "SELECT autocomp_steer($1, $2, $3, $4)").await?;
                        let row = client
                            .query_one(&statement, &[&version, state, entry, &at.millis()])
                            .await
                            .map_err(|e| self.read_failure(e))?;
                        Ok(row.get::<_, bool>(0))
                    })
                })
                .await?;
            if written {
                return Ok(Steered { steering, entry: applied.entry, circuit_opened: applied.circuit_opened });
            }
            // Another writer changed the record since it was read: compute the change again.
            lost += 1;
            let pause = jitter((1u64 << lost.min(6)).min(STEER_MAX_PAUSE_MS));
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "the steering record kept changing under {lost} attempts to change it over {}; try again",
                    humantime::format_duration(STEER_PATIENCE)
                )));
            }
            tokio::time::sleep(pause).await;
        }
    }

    pub(super) async fn pg_steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        self.run("steering_log", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT entry FROM steering_log ORDER BY version DESC LIMIT $1").await?;
                let rows = client.query(&statement, &[&(limit as i64)]).await.map_err(|e| self.read_failure(e))?;
                rows.iter()
                    .map(|row| serde_json::from_value(unjsoned(row.get(0))).map_err(|e| corrupt("steering log", e)))
                    .collect()
            })
        })
        .await
    }
}

#[async_trait::async_trait]
impl SteeringStore for PgBackend {
    async fn steering(&self) -> StoreResult<Steering> {
        self.pg_steering().await
    }

    async fn steer(&self, request: SteeringRequest) -> StoreResult<Steered> {
        self.pg_steer(request).await
    }

    async fn steering_log(&self, limit: usize) -> StoreResult<Vec<SteeringEntry>> {
        self.pg_steering_log(limit).await
    }
}
