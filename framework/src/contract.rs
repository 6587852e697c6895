//! Contracts between steps, from the component's side: publishing the JSON Schema of the
//! structured result it records ([`result_schema_of`]), declaring the results of earlier
//! steps it reads ([`reads_result`]), and the check at the start of every pass of a component
//! that reads some: each producer's published schema (from the component registry) must give
//! what the reader expects (`autocomp_model::check_read`), or the pass does not start (exit 2).

use autocomp_model::{ComponentDescriptor, EventType, ResultRead};
use autocomp_store::ObjectStore;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;
use tracing::debug;

/// The JSON Schema of `T` as the component writes it (`set_result` serializes a `T`): what
/// [`crate::Component::result_schema`] returns for a component whose result is a `T`. It is
/// the *serialized* form: a field with `#[serde(default)]` is still always written (so
/// required), an `Option` without `skip_serializing_if` is written as `null` when unset.
///
/// ```
/// use autocomp_framework::prelude::*;
///
/// #[derive(Serialize, Deserialize, JsonSchema)]
/// struct Archived {
///     archive_path: String,
///     size: u64,
/// }
///
/// let schema = autocomp_framework::result_schema_of::<Archived>();
/// assert_eq!(schema["required"], json!(["archive_path", "size"]));
/// ```
pub fn result_schema_of<T: JsonSchema>() -> Value {
    SchemaSettings::draft2020_12().for_serialize().into_generator().into_root_schema_for::<T>().to_value()
}

/// A read of the result recorded as `event_type`, expecting a `T`: one entry of
/// [`crate::Component::reads`] for a component whose work calls
/// `batch.result::<T>(event_type)`. The schema is the *deserialized* form of `T`: what
/// reading it accepts (an `Option` or a `#[serde(default)]` field may be missing).
///
/// # Panics
///
/// When `event_type` is not a valid event type name (a constant in the component's code).
pub fn reads_result<T: JsonSchema>(event_type: &str) -> ResultRead {
    let event_type =
        EventType::new(event_type).unwrap_or_else(|e| panic!("reads_result::<{}>: {e}", std::any::type_name::<T>()));
    let schema = SchemaSettings::draft2020_12().for_deserialize().into_generator().into_root_schema_for::<T>();
    ResultRead { event_type, schema: schema.to_value() }
}

/// Checks each result the component reads against what its producer publishes, as the
/// registry has it: the refusal (naming the field and both versions) of the first one that
/// does not give what the reader expects. A producer not registered (or retired), or one that
/// publishes no schema, is not checked; nor is anything when the registry cannot be read
/// (the pass then meets the store itself). Reads the registry only when there are reads.
pub(crate) async fn check_reads(store: &dyn ObjectStore, reader: &ComponentDescriptor) -> Result<(), String> {
    if reader.reads.is_empty() {
        return Ok(());
    }
    let registered = match store.components().await {
        Ok(registered) => registered,
        Err(e) => {
            debug!("cannot read the component registry to check the results {} reads: {e}", reader.name);
            return Ok(());
        }
    };
    let producers: Vec<&ComponentDescriptor> =
        registered.iter().filter(|c| !c.is_retired()).map(|c| &c.descriptor).collect();
    refusal(reader, &producers)
}

/// The pure part of [`check_reads`]: `producers` are the registry's current descriptors (a
/// read of the reader's own event type is checked against `reader`, as this pass describes
/// it).
pub(crate) fn refusal(reader: &ComponentDescriptor, producers: &[&ComponentDescriptor]) -> Result<(), String> {
    if let Some(broken) = autocomp_model::broken_contract(reader, producers) {
        return Err(format!("contract broken: {broken}: the pass is not started ({})", autocomp_model::CONTRACT_FIX));
    }
    for check in autocomp_model::check_reads(reader, producers) {
        match check.producer {
            None => debug!(
                "no registered component records {}: what {} reads of it is not checked",
                check.read.event_type, reader.name
            ),
            Some(producer) if check.verdict.is_none() => {
                debug!("{} publishes no result schema: what {} reads of it is not checked", producer.name, reader.name)
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use autocomp_model::{ComponentName, Trigger};
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Serialize, JsonSchema)]
    #[allow(dead_code)]
    struct ArchivedV1 {
        archive_path: String,
        size: u64,
        #[serde(default)]
        note: Option<String>,
    }

    #[derive(Serialize, JsonSchema)]
    #[allow(dead_code)]
    struct ArchivedV2 {
        path: String,
        size: u64,
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Expected {
        archive_path: String,
        note: Option<String>,
    }

    /// A component as its config's defaults describe it (the runner's own descriptor).
    fn descriptor(name: &str, version: &str, event_type: &str) -> ComponentDescriptor {
        let (name, event_type) = (ComponentName::new(name).unwrap(), EventType::new(event_type).unwrap());
        crate::config::ComponentConfig::default().descriptor(name, version, event_type, Trigger::default(), false)
    }

    #[test]
    fn the_published_schema_is_the_serialized_form_and_the_read_the_deserialized() {
        let published = result_schema_of::<ArchivedV1>();
        assert_eq!(published["required"], serde_json::json!(["archive_path", "size", "note"]));
        let read = reads_result::<Expected>("Data_Archived");
        assert_eq!(read.event_type.as_str(), "Data_Archived");
        assert_eq!(read.schema["required"], serde_json::json!(["archive_path"]));
    }

    #[test]
    #[should_panic(expected = "reads_result")]
    fn an_invalid_event_type_is_a_programming_error() {
        reads_result::<Expected>("not a type");
    }

    #[test]
    fn a_pass_is_refused_naming_the_field_and_both_versions() {
        let mut reader = descriptor("access-copy", "0.2.0", "Access_Copied");
        reader.reads = vec![reads_result::<Expected>("Data_Archived")];
        let mut v1 = descriptor("archiver", "0.2.0", "Data_Archived");
        v1.result_schema = Some(result_schema_of::<ArchivedV1>());
        assert_eq!(refusal(&reader, &[&v1]), Ok(()));
        let mut v2 = descriptor("archiver", "0.3.0", "Data_Archived");
        v2.result_schema = Some(result_schema_of::<ArchivedV2>());
        let refused = refusal(&reader, &[&v2]).unwrap_err();
        assert!(
            refused.starts_with(
                "contract broken: access-copy 0.2.0 reads Data_Archived's result expecting archive_path (string, required), but \
                 archiver 0.3.0 publishes no archive_path (renamed or removed?)"
            ),
            "{refused}"
        );
    }

    #[test]
    fn an_unknown_producer_or_one_without_a_schema_is_not_checked() {
        let mut reader = descriptor("access-copy", "0.2.0", "Access_Copied");
        reader.reads = vec![reads_result::<Expected>("Data_Archived")];
        assert_eq!(refusal(&reader, &[]), Ok(()));
        assert_eq!(refusal(&reader, &[&descriptor("archiver", "0.1.0", "Data_Archived")]), Ok(()));
    }
}
