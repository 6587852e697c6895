//! A work series as the backends read it: rows of tallies and backlog samples, gathered into
//! one point per component and step, in component and time order.

use std::collections::BTreeMap;

use crate::port::{StoreError, StoreResult};
use autocomp_model::{ComponentName, SeriesStep, Timestamp, WorkPoint, WorkTallies};

/// The points of a series as they are read, by component and step.
#[derive(Default)]
pub(crate) struct Points(BTreeMap<(String, i64), WorkPoint>);

impl Points {
    pub(crate) fn at(&mut self, step: SeriesStep, name: String, index: i64) -> StoreResult<&mut WorkPoint> {
        let component = ComponentName::new(&name)
            .map_err(|e| StoreError::Unavailable(format!("the registry holds a bad component name: {e}")))?;
        Ok(self.0.entry((name, index)).or_insert_with(|| WorkPoint {
            component,
            at: Timestamp(index * step.millis()),
            tallies: WorkTallies::default(),
            backlog: None,
        }))
    }

    pub(crate) fn into_points(self) -> Vec<WorkPoint> {
        self.0.into_values().collect()
    }
}
