//! A component for the contract tests (`tests/tests/contracts.rs`), written as a component
//! author would, with the prelude alone (no `schemars` or `serde_json` dependency of its
//! own). `CONTRACT_ROLE` chooses who it is:
//!
//! - `archiver-v1`: `archiver` 1.0.0, records `Data_Archived` with an `ArchivedV1` result
//!   (`archive_path`, `size`) and publishes its schema;
//! - `archiver-v2`: `archiver` 2.0.0, the same step after a refactoring that renamed
//!   `archive_path` to `path` (`ArchivedV2`);
//! - `access-copy`: `access-copy` 0.1.0, records `Access_Copied` once `Data_Archived`
//!   succeeded, reading the archiver's result as `ArchiveLocation` (it declares so), and
//!   records `{"copied_from": <archive_path>}`.

use autocomp_framework::prelude::*;

#[derive(Serialize, JsonSchema)]
struct ArchivedV1 {
    archive_path: String,
    size: u64,
}

#[derive(Serialize, JsonSchema)]
struct ArchivedV2 {
    path: String,
    size: u64,
}

/// What access-copy needs of the archiver's result; it ignores the rest.
#[derive(Deserialize, JsonSchema)]
struct ArchiveLocation {
    archive_path: String,
    /// Read if present.
    size: Option<u64>,
}

const DATA_ARCHIVED: &str = "Data_Archived";

struct Contracted {
    role: String,
}

impl Contracted {
    fn archiver(&self) -> bool {
        self.role.starts_with("archiver")
    }
}

impl Component for Contracted {
    type Settings = ();

    fn name(&self) -> &str {
        if self.archiver() { "archiver" } else { "access-copy" }
    }

    fn version(&self) -> &str {
        match self.role.as_str() {
            "archiver-v1" => "1.0.0",
            "archiver-v2" => "2.0.0",
            _ => "0.1.0",
        }
    }

    fn event_type(&self) -> &str {
        if self.archiver() { DATA_ARCHIVED } else { "Access_Copied" }
    }

    fn trigger(&self) -> Trigger {
        let requires = if self.archiver() { "Data_Received" } else { DATA_ARCHIVED };
        Trigger::builder().requires(requires).blocked_by(self.event_type()).build()
    }

    fn result_schema(&self) -> Option<Value> {
        match self.role.as_str() {
            "archiver-v1" => Some(result_schema_of::<ArchivedV1>()),
            "archiver-v2" => Some(result_schema_of::<ArchivedV2>()),
            _ => None,
        }
    }

    fn reads(&self) -> Vec<ResultRead> {
        match self.archiver() {
            true => Vec::new(),
            false => vec![reads_result::<ArchiveLocation>(DATA_ARCHIVED)],
        }
    }

    fn work(&self, batch: &Batch, _: &(), context: &mut WorkContext) -> Result<(), WorkError> {
        let archive_path = format!("/archive/{}", batch.id);
        match self.role.as_str() {
            "archiver-v1" => context.set_result(&ArchivedV1 { archive_path, size: 412 }),
            "archiver-v2" => context.set_result(&ArchivedV2 { path: archive_path, size: 412 }),
            _ => {
                let Some(location) = batch.result::<ArchiveLocation>(DATA_ARCHIVED)? else {
                    return Err(WorkError::permanent(format!("no {DATA_ARCHIVED} result to read")));
                };
                // serde_json through the prelude.
                let copied = serde_json::to_value(json!({
                    "copied_from": location.archive_path,
                    "size": location.size,
                }))
                .map_err(|e| WorkError::permanent(e.to_string()))?;
                context.set_result(&copied)
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let role = std::env::var("CONTRACT_ROLE").unwrap_or_else(|_| "access-copy".into());
    autocomp_framework::main(Contracted { role })
}
