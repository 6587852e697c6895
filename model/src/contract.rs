//! Contracts between steps: whether the structured result a producer publishes (its JSON
//! Schema in the registry) gives a step that reads it what that step expects (the schema it
//! declares with its read). Checked before a reader's pass starts and shown by
//! `autocomp pipeline` and the monitor, so a renamed or loosened field is caught before any
//! batch fails on it.
//!
//! The schemas are JSON Schema as `schemars` 1.x emits it (draft 2020-12). The rule:
//!
//! - every property the reader **requires** must be published and **required** by the
//!   producer (a property the producer may leave out may be absent);
//! - the producer's possible types must all be accepted by the reader (`integer` is a
//!   `number`; a producer that may write `null` where the reader wants a value is not
//!   compatible); when the reader restricts the values (`enum`, `const`), the producer's
//!   values must be among them;
//! - recursively into the properties of objects and the items of arrays; a property the
//!   reader does not require may be missing or optional in the producer, but where both
//!   describe it the types must agree;
//! - anything the reader does not mention is fine: producers may add fields.
//!
//! `$ref`s are resolved within their own document (`#/$defs/...`, any local JSON pointer);
//! `anyOf`/`oneOf` are unions of their branches, and an `Option<T>` (`T` or `null`) is
//! compared through `T`. What the check does not understand (an external `$ref`, `allOf`,
//! tuples, `patternProperties`, `if`/`then`, a schema nested deeper than 64 levels, several
//! object branches in one union) it lets pass: a contract check must not refuse a working
//! pipeline on a construct it cannot read. It checks shapes, not formats, lengths or ranges.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::{ComponentDescriptor, ResultRead};

/// Why a producer's published result does not give a reader what it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatibility {
    /// Where, from the result's root: `fixity.sha256`, `files[].name`; empty for the result
    /// itself.
    pub path: String,
    /// What the reader expects there: `string, required`.
    pub expected: String,
    /// What the producer publishes there, worded to follow "publishes": `it as optional (it
    /// may be absent)`, `no archive_path (renamed or removed?)`, `it as integer or null`.
    pub published: String,
    /// The two in one phrase: `expected string, required; published it as optional (it may
    /// be absent)`.
    pub reason: String,
}

impl Incompatibility {
    fn new(path: &str, expected: String, published: String) -> Self {
        let reason = format!("expected {expected}; published {published}");
        Self { path: path.to_owned(), expected, published, reason }
    }

    /// The path as words: the field's path, or `the result` for the result itself.
    pub fn place(&self) -> &str {
        if self.path.is_empty() { "the result" } else { &self.path }
    }
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place(), self.reason)
    }
}

impl std::error::Error for Incompatibility {}

/// Whether a result published as `published` gives a reader expecting `expected` what it
/// relies on (see the module's rule). The first incompatibility found, by property order.
pub fn check_read(expected: &Value, published: &Value) -> Result<(), Incompatibility> {
    let reader = Doc { root: expected };
    let producer = Doc { root: published };
    compare(&reader, expected, &producer, published, "", None, 0)
}

/// The properties a reader requires at the top of its expected schema, each with its type in
/// words (`archive_path: string`), for `autocomp pipeline` and the monitor.
pub fn required_fields(schema: &Value) -> Vec<String> {
    let doc = Doc { root: schema };
    let Some(object) = doc.object_part(schema, 0) else { return Vec::new() };
    let required = required_of(object);
    properties_of(object)
        .into_iter()
        .flat_map(|props| props.iter())
        .filter(|(name, _)| required.contains(name.as_str()))
        .map(|(name, field)| format!("{name}: {}", doc.describe(field)))
        .collect()
}

/// The top-level properties of a published schema, each with its type in words, optional
/// ones marked (`archive_path: string`, `note: string or null (optional)`).
pub fn published_fields(schema: &Value) -> Vec<String> {
    let doc = Doc { root: schema };
    let Some(object) = doc.object_part(schema, 0) else { return Vec::new() };
    let required = required_of(object);
    properties_of(object)
        .into_iter()
        .flat_map(|props| props.iter())
        .map(|(name, field)| {
            let optional = if required.contains(name.as_str()) { "" } else { " (optional)" };
            format!("{name}: {}{optional}", doc.describe(field))
        })
        .collect()
}

/// One step's read of another step's result, checked against what its producer publishes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadCheck<'a> {
    /// The step that reads.
    pub reader: &'a ComponentDescriptor,
    /// What it reads and expects.
    pub read: &'a ResultRead,
    /// The step that records the event type; `None` when none is registered.
    pub producer: Option<&'a ComponentDescriptor>,
    /// How the check came out: `None` when it could not be made (no producer, or one that
    /// publishes no schema), else the producer's schema checked against the expectation.
    pub verdict: Option<Result<(), Incompatibility>>,
}

impl ReadCheck<'_> {
    /// The incompatibility, when the check found one.
    pub fn incompatibility(&self) -> Option<&Incompatibility> {
        self.verdict.as_ref().and_then(|v| v.as_ref().err())
    }

    /// A broken contract in one sentence naming the field and both versions:
    /// `access-copy 0.2.0 reads Data_Archived's result expecting archive_path (string,
    /// required), but archiver 0.3.0 publishes no archive_path (renamed or removed?)`.
    pub fn broken(&self) -> Option<String> {
        let (incompatible, producer) = (self.incompatibility()?, self.producer?);
        Some(format!(
            "{} {} reads {}'s result expecting {} ({}), but {} {} publishes {}",
            self.reader.name,
            self.reader.version,
            self.read.event_type,
            incompatible.place(),
            incompatible.expected,
            producer.name,
            producer.version,
            incompatible.published,
        ))
    }
}

/// Each read of `reader`, checked against the component among `pipeline` that records its
/// event type (`pipeline`: the current, not retired, descriptors; a read of the reader's own
/// event type is checked against `reader` itself).
/// What to do about a broken contract, said after it wherever it is shown.
pub const CONTRACT_FIX: &str =
    "change what the reader expects or what the producer records; `autocomp pipeline` shows both";

/// Why `reader`'s passes refuse to start, when one of its reads is broken against what its
/// producer in `pipeline` publishes (the first such read): the words of `ReadCheck::broken`.
/// The one judgement of a broken contract, for the pass itself and for every view of it.
pub fn broken_contract(reader: &ComponentDescriptor, pipeline: &[&ComponentDescriptor]) -> Option<String> {
    check_reads(reader, pipeline).iter().find_map(ReadCheck::broken)
}

pub fn check_reads<'a>(reader: &'a ComponentDescriptor, pipeline: &[&'a ComponentDescriptor]) -> Vec<ReadCheck<'a>> {
    let producer_of = |read: &ResultRead| match read.event_type == reader.event_type {
        true => Some(reader),
        false => pipeline.iter().copied().find(|p| p.event_type == read.event_type && p.name != reader.name),
    };
    let checks = reader.reads.iter().map(|read| {
        let producer = producer_of(read);
        let published = producer.and_then(|p| p.result_schema.as_ref());
        let verdict = published.map(|published| check_read(&read.schema, published));
        ReadCheck { reader, read, producer, verdict }
    });
    checks.collect()
}

const MAX_DEPTH: usize = 64;
const MAX_REFS: usize = 32;

static ANY: Value = Value::Bool(true);

/// The JSON types, as bits.
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const OBJECT: u8 = 4;
const ARRAY: u8 = 8;
const NUMBER: u8 = 16;
const STRING: u8 = 32;
const INTEGER: u8 = 64;
const TYPE_NAMES: [(u8, &str); 7] = [
    (STRING, "string"),
    (INTEGER, "integer"),
    (NUMBER, "number"),
    (BOOLEAN, "boolean"),
    (OBJECT, "object"),
    (ARRAY, "array"),
    (NULL, "null"),
];

fn type_bit(name: &str) -> Option<u8> {
    TYPE_NAMES.iter().find(|(_, n)| *n == name).map(|(bit, _)| *bit)
}

fn type_words(types: u8) -> String {
    let names: Vec<&str> = TYPE_NAMES.iter().filter(|(bit, _)| types & bit != 0).map(|(_, n)| *n).collect();
    match names.len() {
        0 => "nothing".to_owned(),
        _ => names.join(" or "),
    }
}

fn value_type(value: &Value) -> u8 {
    match value {
        Value::Null => NULL,
        Value::Bool(_) => BOOLEAN,
        Value::Number(n) if n.is_i64() || n.is_u64() => INTEGER,
        Value::Number(_) => NUMBER,
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
        Value::Object(_) => OBJECT,
    }
}

/// Whether the reader, accepting `accepted`, takes every type in `possible`.
fn unaccepted(accepted: u8, possible: u8) -> u8 {
    let widened = if accepted & NUMBER != 0 { accepted | INTEGER } else { accepted };
    possible & !widened
}

fn required_of(object: &Value) -> BTreeSet<&str> {
    let list = object.get("required").and_then(Value::as_array);
    list.into_iter().flatten().filter_map(Value::as_str).collect()
}

fn properties_of(object: &Value) -> Option<&Map<String, Value>> {
    object.get("properties").and_then(Value::as_object)
}

fn branches(schema: &Value) -> Option<&Vec<Value>> {
    schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array)
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() { name.to_owned() } else { format!("{path}.{name}") }
}

/// One schema document: `$ref`s resolve within it.
struct Doc<'a> {
    root: &'a Value,
}

impl<'a> Doc<'a> {
    /// The schema with its `$ref`s followed; an unresolvable one is `true` (anything).
    fn resolve(&self, mut schema: &'a Value) -> &'a Value {
        for _ in 0..MAX_REFS {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else { return schema };
            let Some(pointer) = reference.strip_prefix('#') else { return &ANY };
            match self.root.pointer(pointer) {
                Some(target) => schema = target,
                None => return &ANY,
            }
        }
        &ANY
    }

    /// The types a value of the schema may have; `None`: any (or unknown).
    fn types(&self, schema: &'a Value, depth: usize) -> Option<u8> {
        if depth > MAX_DEPTH {
            return None;
        }
        let schema = self.resolve(schema);
        match schema {
            Value::Bool(true) => return None,
            Value::Bool(false) => return Some(0),
            Value::Object(_) => {}
            _ => return None,
        }
        if let Some(declared) = schema.get("type") {
            let names: Vec<&Value> = match declared {
                Value::Array(names) => names.iter().collect(),
                one => vec![one],
            };
            return names.into_iter().try_fold(0, |set, name| Some(set | type_bit(name.as_str()?)?));
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return Some(values.iter().fold(0, |set, v| set | value_type(v)));
        }
        if let Some(value) = schema.get("const") {
            return Some(value_type(value));
        }
        if let Some(branches) = branches(schema) {
            return branches.iter().try_fold(0, |set, branch| Some(set | self.types(branch, depth + 1)?));
        }
        None
    }

    /// The values the schema restricts to (`enum`, `const`, `null`, a union of those);
    /// `None`: not restricted to listed values.
    fn values(&self, schema: &'a Value, depth: usize) -> Option<Vec<&'a Value>> {
        if depth > MAX_DEPTH {
            return None;
        }
        let schema = self.resolve(schema);
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return Some(values.iter().collect());
        }
        if let Some(value) = schema.get("const") {
            return Some(vec![value]);
        }
        if schema.get("type").and_then(Value::as_str) == Some("null") {
            return Some(vec![&Value::Null]);
        }
        let branches = branches(schema)?;
        let mut all = Vec::new();
        for branch in branches {
            all.extend(self.values(branch, depth + 1)?);
        }
        Some(all)
    }

    /// The one object (or array) shape the schema describes, looking through `Option`'s
    /// `null` branch; `None` when there is none or several.
    fn object_part(&self, schema: &'a Value, depth: usize) -> Option<&'a Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        let schema = self.resolve(schema);
        if schema.get("properties").is_some() || schema.get("items").is_some() {
            return Some(schema);
        }
        let branches = branches(schema)?;
        let mut shaped = branches.iter().filter(|b| self.types(b, depth + 1) != Some(NULL));
        match (shaped.next(), shaped.next()) {
            (Some(only), None) => self.object_part(only, depth + 1),
            _ => None,
        }
    }

    /// The schema's type in words: `string`, `integer or null`, `one of "a", "b"`, `any`.
    fn describe(&self, schema: &'a Value) -> String {
        if let Some(values) = self.values(schema, 0).filter(|v| v.iter().any(|v| !v.is_null())) {
            let listed: Vec<String> = values.iter().map(|v| v.to_string()).collect();
            return format!("one of {}", listed.join(", "));
        }
        match self.types(schema, 0) {
            Some(types) => type_words(types),
            None => "any".to_owned(),
        }
    }
}

/// Compares the schema a reader expects at `path` with the one the producer publishes there.
/// `required` is set for a property: whether the reader requires it (for the words only).
fn compare(
    reader: &Doc<'_>,
    expected: &Value,
    producer: &Doc<'_>,
    published: &Value,
    path: &str,
    required: Option<bool>,
    depth: usize,
) -> Result<(), Incompatibility> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let expecting = || {
        let what = reader.describe(expected);
        match required {
            Some(true) => format!("{what}, required"),
            Some(false) => format!("{what}, optional"),
            None => what,
        }
    };
    // Types: everything the producer may write, the reader must accept.
    if let (Some(accepted), Some(possible)) = (reader.types(expected, depth), producer.types(published, depth)) {
        let refused = unaccepted(accepted, possible);
        if refused != 0 {
            let published = match refused == possible {
                true => format!("it as {}", type_words(possible)),
                false => format!("it as {} (it may be {})", type_words(possible), type_words(refused)),
            };
            return Err(Incompatibility::new(path, expecting(), published));
        }
    }
    // Values: a reader that lists them takes no other.
    if let Some(accepted) = reader.values(expected, depth) {
        match producer.values(published, depth) {
            Some(possible) => {
                let refused: Vec<String> =
                    possible.iter().filter(|v| !accepted.contains(v)).map(|v| v.to_string()).collect();
                if !refused.is_empty() {
                    let published = format!("it with {} too", refused.join(", "));
                    return Err(Incompatibility::new(path, expecting(), published));
                }
            }
            None => {
                let published = format!("it as any {}", producer.describe(published));
                return Err(Incompatibility::new(path, expecting(), published));
            }
        }
    }
    let (Some(wanted), Some(given)) = (reader.object_part(expected, depth), producer.object_part(published, depth))
    else {
        return Ok(());
    };
    if let (Some(item), Some(given_item)) = (wanted.get("items"), given.get("items"))
        && (item.is_object() || item.is_boolean())
    {
        compare(reader, item, producer, given_item, &format!("{path}[]"), None, depth + 1)?;
    }
    let (Some(fields), Some(given_fields)) = (properties_of(wanted), properties_of(given)) else {
        return Ok(());
    };
    let needed = required_of(wanted);
    let guaranteed = required_of(given);
    for (name, field) in fields {
        let at = join(path, name);
        let needs = needed.contains(name.as_str());
        match given_fields.get(name) {
            None if needs => {
                let expected = format!("{}, required", reader.describe(field));
                return Err(Incompatibility::new(&at, expected, format!("no {name} (renamed or removed?)")));
            }
            None => {}
            Some(given_field) => {
                if needs && !guaranteed.contains(name.as_str()) {
                    let expected = format!("{}, required", reader.describe(field));
                    let published = "it as optional (it may be absent)".to_owned();
                    return Err(Incompatibility::new(&at, expected, published));
                }
                compare(reader, field, producer, given_field, &at, Some(needs), depth + 1)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn archived_v1() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Archived",
            "type": "object",
            "properties": {
                "archive_path": {"type": "string"},
                "size": {"type": "integer", "format": "uint64", "minimum": 0},
                "fixity": {"$ref": "#/$defs/Fixity"},
                "note": {"type": ["string", "null"]}
            },
            "required": ["archive_path", "size", "fixity", "note"],
            "$defs": {
                "Fixity": {
                    "type": "object",
                    "properties": {"sha256": {"type": "string"}, "md5": {"type": "string"}},
                    "required": ["sha256", "md5"]
                }
            }
        })
    }

    fn reader(properties: Value, required: &[&str]) -> Value {
        json!({"type": "object", "properties": properties, "required": required})
    }

    #[test]
    fn the_same_schema_is_compatible() {
        assert_eq!(check_read(&archived_v1(), &archived_v1()), Ok(()));
    }

    #[test]
    fn a_reader_may_read_a_subset_and_producers_may_add_fields() {
        let expected = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        assert_eq!(check_read(&expected, &archived_v1()), Ok(()));
    }

    #[test]
    fn a_renamed_field_is_not_published() {
        let expected = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        let mut published = archived_v1();
        let props = published["properties"].as_object_mut().unwrap();
        let moved = props.remove("archive_path").unwrap();
        props.insert("path".into(), moved);
        published["required"] = json!(["path", "size", "fixity", "note"]);
        let refused = check_read(&expected, &published).unwrap_err();
        assert_eq!(refused.path, "archive_path");
        assert_eq!(refused.expected, "string, required");
        assert_eq!(refused.published, "no archive_path (renamed or removed?)");
        assert_eq!(
            refused.to_string(),
            "archive_path: expected string, required; published no archive_path (renamed or removed?)"
        );
    }

    #[test]
    fn a_required_field_the_producer_may_leave_out_is_incompatible() {
        let expected = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        let mut published = archived_v1();
        published["required"] = json!(["size", "fixity", "note"]);
        let refused = check_read(&expected, &published).unwrap_err();
        assert_eq!(
            (refused.path.as_str(), refused.published.as_str()),
            ("archive_path", "it as optional (it may be absent)")
        );
    }

    #[test]
    fn an_optional_reader_field_may_be_missing_or_optional_but_must_agree_in_type() {
        let expected = reader(json!({"comment": {"type": ["string", "null"]}, "size": {"type": "integer"}}), &[]);
        assert_eq!(check_read(&expected, &archived_v1()), Ok(()));
        let mut published = archived_v1();
        published["required"] = json!(["archive_path"]);
        assert_eq!(check_read(&expected, &published), Ok(()));
        let expected = reader(json!({"size": {"type": "string"}}), &[]);
        let refused = check_read(&expected, &archived_v1()).unwrap_err();
        assert_eq!((refused.path.as_str(), refused.expected.as_str()), ("size", "string, optional"));
        assert_eq!(refused.published, "it as integer");
    }

    #[test]
    fn an_integer_is_a_number_but_not_the_other_way_round() {
        let number = reader(json!({"size": {"type": "number"}}), &["size"]);
        assert_eq!(check_read(&number, &archived_v1()), Ok(()));
        let integer = reader(json!({"size": {"type": "integer"}}), &["size"]);
        let published = reader(json!({"size": {"type": "number", "format": "double"}}), &["size"]);
        let refused = check_read(&integer, &published).unwrap_err();
        assert_eq!((refused.path.as_str(), refused.published.as_str()), ("size", "it as number"));
    }

    #[test]
    fn a_nullable_producer_field_needs_a_reader_that_takes_null() {
        let strict = reader(json!({"note": {"type": "string"}}), &["note"]);
        let refused = check_read(&strict, &archived_v1()).unwrap_err();
        assert_eq!(refused.path, "note");
        assert_eq!(refused.published, "it as string or null (it may be null)");
        let lenient = reader(json!({"note": {"type": ["string", "null"]}}), &[]);
        assert_eq!(check_read(&lenient, &archived_v1()), Ok(()));
        let any = reader(json!({"note": {}}), &["note"]);
        assert_eq!(check_read(&any, &archived_v1()), Ok(()));
    }

    #[test]
    fn nested_objects_are_compared_through_refs_on_both_sides() {
        let expected = json!({
            "type": "object",
            "properties": {"fixity": {"$ref": "#/$defs/Sums"}},
            "required": ["fixity"],
            "$defs": {"Sums": {"type": "object", "properties": {"sha256": {"type": "string"}}, "required": ["sha256"]}}
        });
        assert_eq!(check_read(&expected, &archived_v1()), Ok(()));
        let mut published = archived_v1();
        published["$defs"]["Fixity"]["properties"]["sha256"] = json!({"type": "integer"});
        let refused = check_read(&expected, &published).unwrap_err();
        assert_eq!(refused.path, "fixity.sha256");
        assert_eq!(refused.expected, "string, required");
        assert_eq!(refused.published, "it as integer");
        published["$defs"]["Fixity"]["required"] = json!(["md5"]);
        published["$defs"]["Fixity"]["properties"]["sha256"] = json!({"type": "string"});
        assert_eq!(check_read(&expected, &published).unwrap_err().path, "fixity.sha256");
    }

    #[test]
    fn array_items_are_compared() {
        let expected = reader(
            json!({"files": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}),
            &["files"],
        );
        let good = reader(json!({"files": {"type": "array", "items": {"$ref": "#/$defs/File"}}}), &["files"]);
        let mut good = good;
        good["$defs"] = json!({"File": {"type": "object", "properties": {"name": {"type": "string"}, "bytes": {"type": "integer"}}, "required": ["name", "bytes"]}});
        assert_eq!(check_read(&expected, &good), Ok(()));
        let mut bad = good.clone();
        bad["$defs"]["File"]["properties"]["name"] = json!({"type": ["string", "null"]});
        let refused = check_read(&expected, &bad).unwrap_err();
        assert_eq!(refused.path, "files[].name");
        let scalar = reader(json!({"files": {"type": "string"}}), &["files"]);
        assert_eq!(check_read(&expected, &scalar).unwrap_err().published, "it as string");
    }

    #[test]
    fn an_option_of_a_struct_is_compared_through_its_struct() {
        let expected = json!({
            "type": "object",
            "properties": {"fixity": {"anyOf": [{"$ref": "#/$defs/F"}, {"type": "null"}]}},
            "$defs": {"F": {"type": "object", "properties": {"md5": {"type": "string"}}, "required": ["md5"]}}
        });
        assert_eq!(check_read(&expected, &archived_v1()), Ok(()));
        let mut published = archived_v1();
        published["$defs"]["Fixity"]["properties"].as_object_mut().unwrap().remove("md5");
        assert_eq!(check_read(&expected, &published).unwrap_err().path, "fixity.md5");
        // The producer's Option<Fixity> may be null: a reader that needs it is refused.
        let strict = reader(json!({"fixity": {"type": "object"}}), &["fixity"]);
        let mut optional = archived_v1();
        optional["properties"]["fixity"] = json!({"anyOf": [{"$ref": "#/$defs/Fixity"}, {"type": "null"}]});
        let refused = check_read(&strict, &optional).unwrap_err();
        assert_eq!(
            (refused.path.as_str(), refused.published.as_str()),
            ("fixity", "it as object or null (it may be null)")
        );
    }

    #[test]
    fn enums_compare_their_values() {
        let status = |values: Value| reader(json!({"status": {"type": "string", "enum": values}}), &["status"]);
        assert_eq!(check_read(&status(json!(["ok", "partial"])), &status(json!(["ok"]))), Ok(()));
        let refused = check_read(&status(json!(["ok"])), &status(json!(["ok", "partial"]))).unwrap_err();
        assert_eq!(refused.expected, "one of \"ok\", required");
        assert_eq!(refused.published, "it with \"partial\" too");
        let free = reader(json!({"status": {"type": "string"}}), &["status"]);
        assert_eq!(check_read(&status(json!(["ok"])), &free).unwrap_err().published, "it as any string");
        // Variants with doc comments: a oneOf of consts.
        let documented = reader(
            json!({"status": {"oneOf": [{"type": "string", "const": "ok"}, {"type": "string", "const": "partial"}]}}),
            &["status"],
        );
        assert_eq!(check_read(&status(json!(["ok", "partial"])), &documented), Ok(()));
        assert_eq!(check_read(&documented, &status(json!(["ok"]))), Ok(()));
    }

    #[test]
    fn what_the_check_cannot_read_it_lets_pass() {
        let expected = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        // A producer publishing anything, an external ref, an allOf, a map without properties.
        for published in [
            json!(true),
            json!({}),
            json!({"$ref": "https://example.org/archived.json"}),
            json!({"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"type": "object"}}}),
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            json!({"type": "object", "properties": {"archive_path": {"$ref": "#/$defs/Missing"}}, "required": ["archive_path"]}),
        ] {
            assert_eq!(check_read(&expected, &published), Ok(()), "{published}");
        }
        // A reader expecting anything.
        assert_eq!(check_read(&json!(true), &archived_v1()), Ok(()));
        assert_eq!(check_read(&json!({}), &archived_v1()), Ok(()));
        // A recursive definition does not loop.
        let list = json!({"$ref": "#/$defs/L", "$defs": {"L": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}}}}});
        assert_eq!(check_read(&list, &list), Ok(()));
        let cycle = json!({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}});
        assert_eq!(check_read(&cycle, &cycle), Ok(()));
    }

    #[test]
    fn a_result_of_another_kind_is_refused_at_the_root() {
        let expected = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        let refused = check_read(&expected, &json!({"type": "array", "items": {"type": "string"}})).unwrap_err();
        assert_eq!((refused.place(), refused.published.as_str()), ("the result", "it as array"));
        assert!(refused.to_string().starts_with("the result: expected object; published it as array"));
    }

    #[test]
    fn fields_are_listed_with_their_types() {
        assert_eq!(
            published_fields(&archived_v1()),
            ["archive_path: string", "fixity: object", "note: string or null", "size: integer"]
        );
        let expected =
            reader(json!({"archive_path": {"type": "string"}, "size": {"type": "number"}}), &["archive_path"]);
        assert_eq!(required_fields(&expected), ["archive_path: string"]);
        assert!(published_fields(&json!(true)).is_empty());
    }

    #[test]
    fn each_read_is_checked_against_the_current_producer_of_its_type() {
        use crate::fixtures::{descriptor, ty};
        use crate::{ComponentName, ResultRead};
        let expects = reader(json!({"archive_path": {"type": "string"}}), &["archive_path"]);
        let mut copier = descriptor();
        copier.name = ComponentName::new("access-copy").unwrap();
        copier.version = "0.2.0".into();
        copier.reads = vec![
            ResultRead { event_type: ty("Data_Archived"), schema: expects.clone() },
            ResultRead { event_type: ty("Catalogued"), schema: expects.clone() },
            ResultRead { event_type: ty("Pages_Counted"), schema: expects },
        ];
        let mut archiver = descriptor();
        archiver.name = ComponentName::new("archiver").unwrap();
        archiver.version = "0.3.0".into();
        archiver.event_type = ty("Data_Archived");
        let checks = check_reads(&copier, &[&archiver, &copier]);
        // No schema published: not checked; no producer: not checked; its own earlier
        // result: checked against itself (publishing nothing either).
        assert_eq!(checks.iter().map(|c| c.verdict.is_none()).collect::<Vec<_>>(), [true, true, true]);
        assert_eq!(checks[0].producer.map(|p| p.name.as_str()), Some("archiver"));
        assert_eq!(checks[1].producer, None);
        assert_eq!(checks[2].producer.map(|p| p.name.as_str()), Some("access-copy"));
        assert!(checks.iter().all(|c| c.broken().is_none()));
        let mut moved = archived_v1();
        moved["required"] = json!(["size"]);
        archiver.result_schema = Some(moved);
        let checks = check_reads(&copier, &[&archiver]);
        assert_eq!(
            checks[0].broken().as_deref(),
            Some(
                "access-copy 0.2.0 reads Data_Archived's result expecting archive_path (string, required), but \
                 archiver 0.3.0 publishes it as optional (it may be absent)"
            )
        );
        archiver.result_schema = Some(archived_v1());
        assert_eq!(check_reads(&copier, &[&archiver])[0].verdict, Some(Ok(())));
    }

    /// Schemas as `schemars` derives them (a dev-dependency).
    mod derived {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        use super::*;

        fn serialized<T: JsonSchema>() -> Value {
            schemars::generate::SchemaSettings::draft2020_12()
                .for_serialize()
                .into_generator()
                .into_root_schema_for::<T>()
                .to_value()
        }

        fn deserialized<T: JsonSchema>() -> Value {
            schemars::generate::SchemaSettings::draft2020_12()
                .for_deserialize()
                .into_generator()
                .into_root_schema_for::<T>()
                .to_value()
        }

        #[derive(Serialize, JsonSchema)]
        #[allow(dead_code)]
        struct ArchivedV1 {
            archive_path: String,
            size: u64,
            fixity: Fixity,
            files: Vec<File>,
            note: Option<String>,
            kind: Kind,
        }

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Fixity {
            sha256: String,
        }

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct File {
            name: String,
            bytes: u64,
        }

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[allow(dead_code)]
        enum Kind {
            Tape,
            Disk,
        }

        #[derive(Serialize, JsonSchema)]
        #[allow(dead_code)]
        struct ArchivedV2 {
            path: String,
            size: f64,
            fixity: Option<Fixity>,
        }

        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Reads {
            archive_path: String,
            size: f64,
            fixity: Fixity,
            files: Vec<File>,
            note: Option<String>,
            kind: Option<Kind>,
            extra: Option<u32>,
        }

        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct ReadsSize {
            size: u64,
        }

        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct ReadsNote {
            note: String,
        }

        #[test]
        fn schemars_output_is_read() {
            assert_eq!(check_read(&deserialized::<Reads>(), &serialized::<ArchivedV1>()), Ok(()));
            let refused = check_read(&deserialized::<Reads>(), &serialized::<ArchivedV2>()).unwrap_err();
            assert_eq!(refused.path, "archive_path", "{refused}");
            assert_eq!(check_read(&deserialized::<ReadsSize>(), &serialized::<ArchivedV2>()).unwrap_err().path, "size");
            let refused = check_read(&deserialized::<ReadsNote>(), &serialized::<ArchivedV1>()).unwrap_err();
            assert_eq!(
                (refused.path.as_str(), refused.published.as_str()),
                ("note", "it as string or null (it may be null)")
            );
        }
    }
}
