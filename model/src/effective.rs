//! The effective view of a batch's log: per event type, the newest event not
//! superseded by a later `Reset` marker covering that type. Triggers see only this view;
//! the index and the runner's re-check both compute it here.

use std::collections::BTreeMap;

use super::{Event, EventType};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EffectiveView<'a> {
    by_type: BTreeMap<&'a EventType, &'a Event>,
}

impl<'a> EffectiveView<'a> {
    /// `events` must be in `seq` order, as the store returns them.
    pub fn of(events: &'a [Event]) -> Self {
        debug_assert!(events.windows(2).all(|w| w[0].seq < w[1].seq), "log not in seq order");
        let mut by_type = BTreeMap::new();
        for event in events {
            if event.event_type.is_reset() {
                for covered in &event.resets {
                    by_type.remove(covered);
                }
            } else {
                by_type.insert(&event.event_type, event);
            }
        }
        Self { by_type }
    }

    pub fn get(&self, event_type: &EventType) -> Option<&'a Event> {
        self.by_type.get(event_type).copied()
    }

    /// Effective events, ordered by type name.
    pub fn iter(&self) -> impl Iterator<Item = &'a Event> + '_ {
        self.by_type.values().copied()
    }

    pub fn len(&self) -> usize {
        self.by_type.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}
