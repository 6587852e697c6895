//! `RegistryStore`: the component registry (who runs in the pipeline, on which hosts, how their
//! passes went), written by every runner's pass report and read by the operator and the monitor.

use autocomp_model::{Agent, ComponentName, PassRecord, RegisteredComponent};

use super::StoreResult;
use crate::write_rules;

port_trait! {
    /// The component registry.
    pub trait RegistryStore {
        /// Records a component's pass in the component registry, stamped with the store's clock:
        /// the descriptor is written only when it differs from the one held, the host's record
        /// (last seen, last pass start or end, outcome) always. A retired component that runs
        /// again is back in the pipeline. Refused as a `Conflict` when another component in the
        /// pipeline (not retired) already records the same event type.
        #[checked(pass.validate()?)]
        async fn record_pass(&self, pass: PassRecord) -> StoreResult<()>;

        /// Every component in the registry, retired ones included, by name.
        async fn components(&self) -> StoreResult<Vec<RegisteredComponent>>;

        /// An operator's `pipeline forget`: marks the component retired (by whom, why) and
        /// returns it. Unknown names are `Invalid` naming the component; retiring a retired
        /// component again is a `Conflict` saying when and by whom it was retired.
        #[checked(let reason = write_rules::retirement_reason(reason)?; let reason = reason.as_str())]
        async fn retire_component(
            &self,
            name: &ComponentName,
            by: &Agent,
            reason: &str,
        ) -> StoreResult<RegisteredComponent>;
    }
}
