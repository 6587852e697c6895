//! The contract check against the schemas `schemars` emits: compatible and incompatible
//! reads, each incompatibility naming its field, and what the check lets pass.

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
    let expected = reader(json!({"archive_path": {"type": "string"}, "size": {"type": "number"}}), &["archive_path"]);
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
