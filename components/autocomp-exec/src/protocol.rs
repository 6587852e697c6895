//! The command protocol, version 1 (docs/command-protocol.md): the files `autocomp-exec`
//! hands a command (the batch file, the settings file), the result file it reads back and
//! their serde types, the private directory they live in, and the strict reading of a result.
//! `main.rs` maps a read result onto the run's report.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use autocomp_framework::prelude::*;
use serde_json::Map;

/// The protocol version: `AUTOCOMP_PROTOCOL`, the batch file's `protocol`, and the only
/// `protocol` a result file may name.
pub const PROTOCOL: u32 = 1;

/// The largest result file read; a larger one is a `result_file` failure.
pub const MAX_RESULT_FILE_BYTES: u64 = 1024 * 1024;

/// The environment variables the command gets (besides `AUTOCOMP_BATCH_ID` and
/// `AUTOCOMP_BATCH_DIR`).
pub const ENV_PROTOCOL: &str = "AUTOCOMP_PROTOCOL";
pub const ENV_BATCH_FILE: &str = "AUTOCOMP_BATCH_FILE";
pub const ENV_SETTINGS_FILE: &str = "AUTOCOMP_SETTINGS_FILE";
pub const ENV_RESULT_FILE: &str = "AUTOCOMP_RESULT_FILE";

/// `AUTOCOMP_BATCH_FILE`: the batch as the command may read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    pub protocol: u32,
    /// The component's name (`--name`).
    pub component: String,
    pub batch: BatchView,
    /// The checkpoint the run starts from (an earlier attempt's last), or null.
    pub checkpoint: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchView {
    pub id: String,
    #[serde(rename = "type")]
    pub batch_type: String,
    pub priority: i32,
    pub metadata: Map<String, Value>,
    /// Metadata `location` (where the batch's files are), or null.
    pub location: Option<String>,
    /// The batch's effective events by type (a type a `Reset` covers is absent).
    pub events: BTreeMap<String, EventView>,
}

/// One effective event: its outcome and its structured result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventView {
    pub outcome: Outcome,
    pub seq: i64,
    /// The store's clock, RFC 3339 with milliseconds, UTC.
    pub at: String,
    pub agent: String,
    /// The event's summary ("" when it has none).
    pub summary: String,
    /// The step's structured result (details key `result`), or null.
    pub result: Option<Value>,
}

impl BatchFile {
    /// The batch file of a run of `component` on `batch`, starting from `checkpoint`.
    pub fn of(component: &str, batch: &Batch, checkpoint: Option<&Value>) -> Self {
        let events = batch
            .effective()
            .iter()
            .map(|event| {
                let view = EventView {
                    outcome: event.outcome,
                    seq: event.seq.0,
                    at: event.at.to_string(),
                    agent: event.agent.as_str().to_owned(),
                    summary: event.details.get("summary").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    result: event.details.get(autocomp_framework::RESULT_KEY).filter(|r| !r.is_null()).cloned(),
                };
                (event.event_type.as_str().to_owned(), view)
            })
            .collect();
        BatchFile {
            protocol: PROTOCOL,
            component: component.to_owned(),
            batch: BatchView {
                id: batch.id.as_str().to_owned(),
                batch_type: batch.batch_type.as_str().to_owned(),
                priority: batch.priority,
                metadata: batch.metadata.clone(),
                location: batch.location().map(str::to_owned),
                events,
            },
            checkpoint: checkpoint.cloned(),
        }
    }
}

/// `AUTOCOMP_RESULT_FILE`, as the command may write it: every key optional, no other key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultFile {
    /// Must be 1 when given.
    #[serde(default)]
    pub protocol: Option<u32>,
    /// The structured result (any JSON; null is none).
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default, deserialize_with = "objects")]
    pub failures: Vec<ResultFailure>,
    #[serde(default)]
    pub transient: bool,
    /// Saved for the next attempt: a JSON object (null saves none).
    #[serde(default)]
    pub checkpoint: Option<Value>,
}

/// One problem the command found: `type` is required, the rest optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultFailure {
    /// What failed, e.g. a file inside the batch; "" for the batch as a whole.
    #[serde(default)]
    pub reference: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub details: Value,
}

/// Reads the result file at `path`: `Ok(None)` when the command wrote none, `Err` with what
/// is wrong (serde's message, with line and column) when it is not a protocol 1 result.
pub fn read_result(path: &Path) -> Result<Option<ResultFile>, String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open the result file: {e}")),
    };
    let size = file.metadata().map_err(|e| format!("cannot read the result file: {e}"))?.len();
    if size > MAX_RESULT_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // The file may still grow (a process the command left behind): never read past the limit.
    file.take(MAX_RESULT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the result file: {e}"))?;
    if bytes.len() as u64 > MAX_RESULT_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    parse_result(&bytes).map(Some)
}

fn too_large(size: u64) -> String {
    format!("the result file is over {MAX_RESULT_FILE_BYTES} bytes (1 MiB): {size} bytes or more")
}

/// Parses a result file's bytes strictly.
pub fn parse_result(bytes: &[u8]) -> Result<ResultFile, String> {
    let not_a_result = |e: serde_json::Error| format!("the result file is not a protocol 1 result: {e}");
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = Object::<ResultFile>::deserialize(&mut deserializer).map_err(not_a_result)?.0;
    deserializer.end().map_err(not_a_result)?;
    if let Some(other) = parsed.protocol.filter(|p| *p != PROTOCOL) {
        return Err(format!("the result file names protocol {other}; this autocomp-exec speaks protocol {PROTOCOL}"));
    }
    // The store keeps checkpoints as JSON objects.
    if parsed.checkpoint.as_ref().is_some_and(|c| !c.is_object()) {
        return Err("the result file's checkpoint must be a JSON object (or null)".to_owned());
    }
    Ok(parsed)
}

/// A `T` that must be written as a JSON object: serde's derived structs also take an array
/// of their fields in order, which a result file must not be.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Only<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Only(std::marker::PhantomData)).map(Object)
    }
}

/// A list of objects (`failures`).
fn objects<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Vec<T>, D::Error> {
    let list = Vec::<Object<T>>::deserialize(deserializer)?;
    Ok(list.into_iter().map(|object| object.0).collect())
}

/// The private directory of one run: the batch and settings files, and where the result
/// file goes. Removed when dropped, however the run ended.
pub struct RunFiles {
    dir: tempfile::TempDir,
}

impl RunFiles {
    /// Creates the directory (mode 0700) and writes the batch and settings files.
    pub fn create(batch: &BatchFile, settings: &Map<String, Value>) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o700);
        let dir = tempfile::Builder::new().prefix("autocomp-exec-").permissions(private).tempdir()?;
        let files = RunFiles { dir };
        write_json(&files.batch_file(), batch)?;
        write_json(&files.settings_file(), settings)?;
        Ok(files)
    }

    #[cfg(test)]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn batch_file(&self) -> PathBuf {
        self.dir.path().join("batch.json")
    }

    pub fn settings_file(&self) -> PathBuf {
        self.dir.path().join("settings.json")
    }

    pub fn result_file(&self) -> PathBuf {
        self.dir.path().join("result.json")
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_result_file_parses() {
        let text = r#"{"protocol": 1, "result": {"pages": 3}, "summary": "ok",
            "failures": [{"reference": "data/x.tif", "type": "virus", "description": "Eicar", "details": {"a": 1}},
                         {"type": "bare"}],
            "transient": true, "checkpoint": {"done": 2}}"#;
        let parsed = parse_result(text.as_bytes()).unwrap();
        assert_eq!(parsed.result, Some(json!({"pages": 3})));
        assert_eq!(parsed.failures.len(), 2);
        assert_eq!(parsed.failures[1].reference, "");
        assert!(parsed.transient);
        assert_eq!(parse_result(b"{}").unwrap(), ResultFile::default());
    }

    #[test]
    fn a_malformed_result_file_says_what_is_wrong_and_where() {
        let cases = [
            (&br#"{"result": 1,}"#[..], "line 1 column"),
            (br#"[1]"#, "invalid type: sequence, expected a JSON object at line 1"),
            (br#"3"#, "invalid type: integer `3`, expected a JSON object"),
            (br#"{} {}"#, "trailing characters at line 1 column 4"),
            (br#"{"failures": [["x", "virus"]]}"#, "expected a JSON object at line 1"),
            (br#"{"resutl": 1}"#, "unknown field `resutl`"),
            (br#"{"transient": "yes"}"#, "invalid type: string \"yes\", expected a boolean"),
            (br#"{"failures": [{"description": "no type"}]}"#, "missing field `type`"),
            (br#"{"failures": [{"type": "x", "extra": 1}]}"#, "unknown field `extra`"),
            (br#"{"protocol": 2}"#, "protocol 2"),
            (br#"{"checkpoint": [1]}"#, "checkpoint must be a JSON object"),
        ];
        for (bytes, wanted) in cases {
            let error = parse_result(bytes).unwrap_err();
            assert!(error.contains(wanted), "{}: {error}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn a_result_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        assert_eq!(read_result(&path).unwrap(), None, "absent: no result");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_RESULT_FILE_BYTES + 1).unwrap();
        let error = read_result(&path).unwrap_err();
        assert!(error.contains("over 1048576 bytes"), "{error}");
    }

    #[test]
    fn the_run_directory_is_private_and_removed() {
        let batch = autocomp_framework::testing::TestBatch::new("B1").build();
        let file = BatchFile::of("ocr", &batch, None);
        let files = RunFiles::create(&file, &Map::new()).unwrap();
        let dir = files.path().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let read: BatchFile = serde_json::from_slice(&std::fs::read(files.batch_file()).unwrap()).unwrap();
        assert_eq!(read, file);
        assert!(!files.result_file().exists());
        drop(files);
        assert!(!dir.exists());
    }
}
