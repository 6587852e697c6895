//! JSON Schemas for the model's types whose JSON is written by hand (durations as text,
//! store timestamps, cron schedules), so the services' OpenAPI documents describe them as
//! they cross the wire. Only with the `json-schema` feature; the names' schemas are beside
//! their grammar in `names`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::{Schedule, Timestamp};

/// A duration as `duration_text` reads and writes it; for `#[schemars(with = ...)]`.
pub struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "As operators write it (\"90s\", \"5m\", \"1h 30m\") or whole seconds; answered as text.",
            "oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}],
        })
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "RFC 3339, UTC, by the store's clock.",
            "type": "string",
            "format": "date-time",
        })
    }
}

impl JsonSchema for Schedule {
    fn schema_name() -> Cow<'static, str> {
        "Schedule".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A five-field cron expression in the host's local time, e.g. `*/5 * * * *`.",
            "type": "string",
        })
    }
}
