//! What the component registry is told of a runner's passes: a pass that claims work says
//! so before working, every pass how it ended (a watcher's coalesced). Apart because the
//! source binaries report the same way without a runner.

use autocomp_model::{ComponentDescriptor, PassPhase, PassRecord};
use autocomp_store::{ObjectStore, StoreError};
use tracing::warn;

use super::pass::Claimed;
use super::{Identity, Runner};
use crate::component::Component;
use crate::exit::RunError;
use crate::reports::Write;

/// Tells the registry what a component is and how its pass stands. An event type another
/// component already records is a configuration error (exit 2).
pub(crate) async fn record_pass(
    store: &dyn ObjectStore,
    descriptor: &ComponentDescriptor,
    identity: &Identity,
    phase: PassPhase,
) -> Result<(), RunError> {
    let record = PassRecord { descriptor: descriptor.clone(), host: identity.host.clone(), phase };
    match store.record_pass(record).await {
        Ok(()) => Ok(()),
        Err(StoreError::Conflict(message)) => Err(RunError::Usage(message)),
        Err(e) => Err(e.into()),
    }
}

impl<C: Component> Runner<C> {
    /// From now on the registry hears of this runner's passes as a watcher's: ends written
    /// together at most once a second and before it sleeps, idle ones at its heartbeat.
    pub fn coalesce_reports(&self) {
        self.reports.coalesce();
    }

    /// Writes what the registry has not been told: everything (a heartbeat, shutdown), or
    /// only ends with recorded results. An event type clash is a usage error (exit 2); an
    /// outage is a warning, as for any report.
    pub async fn flush_reports(&self, everything: bool) -> Result<(), RunError> {
        match self.reports.flush(everything) {
            Write::Now(phase) => match self.report_pass(phase).await {
                Err(RunError::Usage(message)) => Err(RunError::Usage(message)),
                _ => Ok(()),
            },
            Write::Nothing => Ok(()),
        }
    }

    /// How soon results not yet written to the registry are due (`flush_reports(false)`
    /// then writes them); `None` when there are none.
    pub fn results_due_in(&self) -> Option<std::time::Duration> {
        self.reports.results_due_in()
    }

    /// Tells the registry what this component is and how its pass stands. An event type
    /// another component already records is a configuration error (exit 2).
    pub(super) async fn report_pass(&self, phase: PassPhase) -> Result<(), RunError> {
        let reported = record_pass(self.pipeline.store.as_ref(), &self.descriptor, &self.identity, phase).await;
        match &reported {
            Ok(()) => self.reports.written(),
            Err(RunError::Usage(_)) => {}
            Err(e) => warn!("cannot report the pass to the component registry: {e}"),
        }
        reported
    }

    /// Tells the registry a pass claimed work, before any work (once a watcher has said so,
    /// not again): a component whose event type another one records must not work.
    pub(super) async fn report_start(&self, claimed: &[Claimed]) -> Result<(), RunError> {
        if !claimed.is_empty()
            && self.reports.report_start()
            && let Err(e @ RunError::Usage(_)) = self.report_pass(PassPhase::Started).await
        {
            return Err(e);
        }
        Ok(())
    }
}
