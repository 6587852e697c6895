//! The registry's history of each component's work on PostgreSQL: reading a work series
//! (tallies per minute or hour, with the backlog samples) and recording backlog samples. The
//! tallies themselves are written by `autocomp_record_pass` with the pass.

use super::calls::prepare;
use super::rows::corrupt;
use super::{PgBackend, Retry};
use crate::port::{SeriesStore, StoreResult};
use crate::series::Points;
use autocomp_model::{BacklogSample, ComponentName, SeriesStep, Timestamp, WorkPoint, WorkResult, WorkTally};

impl PgBackend {
    pub(super) async fn pg_work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        let (table, column) = match step {
            SeriesStep::Minute => ("component_work_minutes", "minute"),
            SeriesStep::Hour => ("component_work_hours", "hour"),
        };
        let from = step.index_of(since);
        let only = component.map(ComponentName::as_str);
        self.run("work_series", Retry::Safe, |client, _| {
            Box::pin(async move {
                let tallies = prepare(
                    client,
                    &format!(
                        "SELECT component, {column}, result, results, duration_ms_sum, buckets FROM {table}
                         WHERE ($1::text IS NULL OR component = $1) AND {column} >= $2"
                    ),
                )
                .await?;
                let backlog = prepare(
                    client,
                    "SELECT component, at, ready FROM component_backlog
                     WHERE ($1::text IS NULL OR component = $1) AND step = $2 AND at >= $3",
                )
                .await?;
                let mut points = Points::default();
                let rows = client.query(&tallies, &[&only, &from]).await.map_err(|e| self.read_failure(e))?;
                for row in &rows {
                    let result = WorkResult::parse(row.get(2)).map_err(|e| corrupt("component work", e))?;
                    let count = |n: i64| n.max(0) as u64;
                    let tally = WorkTally {
                        results: count(row.get(3)),
                        duration_ms_sum: count(row.get(4)),
                        buckets: row.get::<_, Vec<i64>>(5).into_iter().map(count).collect(),
                    };
                    let point = points.at(step, row.get(0), row.get(1)).map_err(super::Failure::Final)?;
                    point.tallies.get_mut(result).add(&tally);
                }
                let rows =
                    client.query(&backlog, &[&only, &step.as_str(), &from]).await.map_err(|e| self.read_failure(e))?;
                for row in &rows {
                    let point = points.at(step, row.get(0), row.get(1)).map_err(super::Failure::Final)?;
                    point.backlog = Some(row.get::<_, i64>(2).max(0) as u64);
                }
                Ok(points.into_points())
            })
        })
        .await
    }

    pub(super) async fn pg_record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        let components: Vec<&str> = samples.iter().map(|s| s.component.as_str()).collect();
        let ready: Vec<i64> = samples.iter().map(|s| i64::try_from(s.ready).unwrap_or(i64::MAX)).collect();
        let (components, ready) = (&components, &ready);
        // A sample replaces the step's last one: sending it again changes nothing.
        self.run("record_backlog", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement = prepare(client, "SELECT autocomp_record_backlog($1, $2)").await?;
                client.execute(&statement, &[components, ready]).await.map_err(|e| self.read_failure(e))?;
                Ok(())
            })
        })
        .await
    }
}

#[async_trait::async_trait]
impl SeriesStore for PgBackend {
    async fn work_series(
        &self,
        step: SeriesStep,
        since: Timestamp,
        component: Option<&ComponentName>,
    ) -> StoreResult<Vec<WorkPoint>> {
        self.pg_work_series(step, since, component).await
    }

    async fn record_backlog(&self, samples: Vec<BacklogSample>) -> StoreResult<()> {
        self.pg_record_backlog(samples).await
    }
}
