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
#[path = "contract_tests.rs"]
mod tests;
