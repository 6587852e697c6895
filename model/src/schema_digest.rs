//! Which schema a result was made under: the digest of its producer's published result
//! schema, recorded with the result (`Report::result_schema`) and compared with the schema
//! the producer publishes now, so a result made under an older one can be told apart.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `sha256:` and the 64 hex digits of the schema's canonical JSON (object keys sorted at
/// every level, no whitespace): the same schema gives the same digest whatever order a
/// generator wrote its keys in.
pub fn schema_digest(schema: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(schema, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in digest {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// The digest as people read it beside others: `sha256:` and its first 12 hex digits.
pub fn short_digest(digest: &str) -> &str {
    let end = digest.find(':').map_or(0, |colon| colon + 1) + 12;
    digest.get(..end).unwrap_or(digest)
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_digest_does_not_depend_on_key_order_and_tells_schemas_apart() {
        let one = json!({"type": "object", "properties": {"pages": {"type": "integer"}, "bytes": {"type": "integer"}}});
        let reordered: Value = serde_json::from_str(
            r#"{"properties": {"bytes": {"type": "integer"}, "pages": {"type": "integer"}}, "type": "object"}"#,
        )
        .unwrap();
        let renamed =
            json!({"type": "object", "properties": {"page_count": {"type": "integer"}, "bytes": {"type": "integer"}}});
        assert_eq!(schema_digest(&one), schema_digest(&reordered));
        assert_ne!(schema_digest(&one), schema_digest(&renamed));
        let digest = schema_digest(&one);
        assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
        assert_eq!(short_digest(&digest).len(), 19);
        assert_eq!(short_digest("odd"), "odd");
    }
}
