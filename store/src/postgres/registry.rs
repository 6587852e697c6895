//! The component registry on PostgreSQL (`RegistryStore`): a pass's record in one call of
//! `autocomp_record_pass`, the registry read whole, and retirement; none takes a seq.

use async_trait::async_trait;

use super::calls::prepare;
use super::rows::{component_from_json, corrupt, work_json};
use super::text::{self};
use super::{Failure, PgBackend, Retry, classify};
use crate::port::{RegistryStore, StoreResult};
use crate::write_rules::{self};
use autocomp_model::{Agent, ComponentName, PassPhase, PassRecord, RegisteredComponent, WorkTallies};

#[async_trait]
impl RegistryStore for PgBackend {
    /// One call, one round trip: this runs at every cron start of every component. Repeating
    /// it only moves the host's `last_seen` again, so it is retried like a read.
    async fn record_pass(&self, pass: PassRecord) -> StoreResult<()> {
        let descriptor = serde_json::to_value(&pass.descriptor).expect("descriptors always serialize");
        let descriptor = text::json(&descriptor).into_owned();
        let (ended, outcome, summary, duration_ms, work) = match &pass.phase {
            PassPhase::Started => (false, None, None, None, None),
            PassPhase::Ended { outcome, summary, duration_ms, work } => (
                true,
                Some(outcome.as_str()),
                Some(text::text(summary)),
                Some(i64::try_from(*duration_ms).unwrap_or(i64::MAX)),
                (!work.is_empty()).then(|| work_json(&WorkTallies::of(work))),
            ),
        };
        // Repeating a pass that carries work would count its results twice.
        let retry = if pass.carries_work() { Retry::OnlyUnsent } else { Retry::Safe };
        let summary = summary.as_deref();
        let (pass, descriptor, work) = (&pass, &descriptor, &work);
        let (name, event_type) = (pass.descriptor.name.as_str(), pass.descriptor.event_type.as_str());
        let other = self
            .run("record_pass", retry, |client, _| {
                Box::pin(async move {
                    let statement =
                        prepare(client, "SELECT autocomp_record_pass($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)").await?;
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                        &name,
                        &event_type,
                        descriptor,
                        &pass.host,
                        &pass.descriptor.version,
                        &ended,
                        &outcome,
                        &summary,
                        &duration_ms,
                        work,
                    ];
                    match client.query_one(&statement, &params).await {
                        Ok(row) => Ok(row.get::<_, Option<String>>(0)),
                        // Another component took the event type between the function's check
                        // and its insert, and has committed since: name it, as the check would.
                        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                            let clash = prepare(
                                client,
                                "SELECT name FROM components WHERE event_type = $1 AND retired_at IS NULL AND name <> $2",
                            )
                            .await?;
                            match client.query_opt(&clash, &[&event_type, &name]).await {
                                Ok(Some(row)) => Ok(Some(row.get(0))),
                                Ok(None) => Err(Failure::Unsent(super::describe_error(&error))),
                                Err(error) => Err(classify(&self.inner.options, &error, false)),
                            }
                        }
                        Err(error) => Err(classify(&self.inner.options, &error, false)),
                    }
                })
            })
            .await?;
        match other {
            Some(other) => Err(write_rules::event_type_taken(&pass.descriptor.event_type, &other)),
            None => Ok(()),
        }
    }

    async fn components(&self) -> StoreResult<Vec<RegisteredComponent>> {
        self.run("components", Retry::Safe, |client, _| {
            Box::pin(async move {
                let statement =
                    prepare(client, "SELECT autocomp_component(name)::text FROM components ORDER BY name").await?;
                let rows = client.query(&statement, &[]).await.map_err(|e| self.read_failure(e))?;
                rows.iter().map(|row| component_from_json(row.get(0))).collect()
            })
        })
        .await
    }

    async fn retire_component(
        &self,
        name: &ComponentName,
        by: &Agent,
        reason: &str,
    ) -> StoreResult<RegisteredComponent> {
        let reason = text::text(reason);
        let reason = &&*reason;
        let (outcome, answer) = self
            .run("retire_component", Retry::OnlyUnsent, |client, _| {
                Box::pin(async move {
                    let statement = prepare(
                        client,
                        "SELECT r_outcome, r_component::text FROM autocomp_retire_component($1, $2, $3)",
                    )
                    .await?;
                    let row = client
                        .query_one(&statement, &[&name.as_str(), &by.as_str(), reason])
                        .await
                        .map_err(|e| classify(&self.inner.options, &e, false))?;
                    let outcome: String = row.get(0);
                    let answer: String =
                        row.get::<_, Option<String>>(1).ok_or_else(|| corrupt("answer", "no component"))?;
                    Ok((outcome, answer))
                })
            })
            .await?;
        match outcome.as_str() {
            "unknown" => {
                let known: Vec<String> =
                    serde_json::from_str(&answer).map_err(|e| corrupt("answer", e).into_error())?;
                Err(write_rules::unknown_component(name, &known))
            }
            "already" => {
                let component = component_from_json(&answer).map_err(Failure::into_error)?;
                let retirement = component.retired.ok_or_else(|| corrupt("answer", "not retired").into_error())?;
                Err(write_rules::retired_already(name, &retirement))
            }
            _ => component_from_json(&answer).map_err(Failure::into_error),
        }
    }
}
