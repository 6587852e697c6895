//! Text PostgreSQL refuses to store, made storable: a `text` column cannot hold U+0000 and
//! `jsonb` refuses `\u0000`, yet a report, metadata, a checkpoint or a reason may carry one
//! (a command's output). Every string written (JSON keys and values, and the free-text
//! columns) goes through [`text`] / [`json`], and every one read back through [`untext`] /
//! [`unjson`], so every backend stores and returns the same characters.
//!
//! The encoding: a string holding U+0000, or starting with [`MARK`], is stored as `MARK`
//! followed by the string with U+0000 written `MARK 0` and `MARK` written `MARK MARK`; any
//! other string is stored as it is. So existing rows (written before this encoding) read back
//! unchanged, the JSON structure (keys such as `transient`, which the server-side functions
//! read) stays what it was, and only strings starting with `MARK`, a Unicode noncharacter
//! that text exchanged between programs does not carry, change form. A string stored
//! before this release that started with U+FDD0 would read back altered: none is expected.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// U+FDD0, the first of Unicode's noncharacters, "permanently reserved for internal use".
const MARK: char = '\u{FDD0}';

fn needs_encoding(s: &str) -> bool {
    s.starts_with(MARK) || s.contains('\0')
}

/// A string as stored.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    if !needs_encoding(s) {
        return Cow::Borrowed(s);
    }
    let mut stored = String::with_capacity(s.len() + 8);
    stored.push(MARK);
    for c in s.chars() {
        match c {
            '\0' => {
                stored.push(MARK);
                stored.push('0');
            }
            MARK => {
                stored.push(MARK);
                stored.push(MARK);
            }
            c => stored.push(c),
        }
    }
    Cow::Owned(stored)
}

/// A string as read back: what was given to [`text`].
pub(crate) fn untext(stored: String) -> String {
    let Some(body) = stored.strip_prefix(MARK) else { return stored };
    let mut s = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != MARK {
            s.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => s.push('\0'),
            Some(MARK) => s.push(MARK),
            // Not written by `text`: kept as found.
            Some(other) => {
                s.push(MARK);
                s.push(other);
            }
            None => s.push(MARK),
        }
    }
    s
}

fn json_needs_encoding(value: &Value) -> bool {
    match value {
        Value::String(s) => needs_encoding(s),
        Value::Array(items) => items.iter().any(json_needs_encoding),
        Value::Object(map) => map.iter().any(|(k, v)| needs_encoding(k) || json_needs_encoding(v)),
        _ => false,
    }
}

/// A JSON document as stored: every key and string through [`text`]. Borrowed (no copy)
/// when nothing needs it, the usual case.
pub(crate) fn json(value: &Value) -> Cow<'_, Value> {
    if !json_needs_encoding(value) {
        return Cow::Borrowed(value);
    }
    fn encode(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(text(s).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(encode).collect()),
            Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (text(k).into_owned(), encode(v))).collect()),
            other => other.clone(),
        }
    }
    Cow::Owned(encode(value))
}

/// A JSON document as read back: what was given to [`json`].
pub(crate) fn unjson(value: &mut Value) {
    match value {
        Value::String(s) if s.starts_with(MARK) => *s = untext(std::mem::take(s)),
        Value::Array(items) => items.iter_mut().for_each(unjson),
        Value::Object(map) => {
            if map.keys().any(|k| k.starts_with(MARK)) {
                let decoded: Map<String, Value> =
                    std::mem::take(map).into_iter().map(|(k, mut v)| (untext(k), decode_owned(&mut v))).collect();
                *map = decoded;
            } else {
                map.values_mut().for_each(unjson);
            }
        }
        _ => {}
    }
}

fn decode_owned(value: &mut Value) -> Value {
    unjson(value);
    std::mem::take(value)
}

/// [`unjson`] on an owned document.
pub(crate) fn unjsoned(mut value: Value) -> Value {
    unjson(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_text_is_stored_as_it_is() {
        assert!(matches!(text("a report\n\u{202E}"), Cow::Borrowed(_)));
        let doc = serde_json::json!({"transient": true, "a": ["b", 1]});
        assert!(matches!(json(&doc), Cow::Borrowed(_)));
    }

    #[test]
    fn nul_is_stored_without_nul() {
        let stored = text("a\0b");
        assert!(!stored.contains('\0'));
        assert_eq!(untext(stored.into_owned()), "a\0b");
        let doc = serde_json::json!({"k\0": {"transient": true, "out": ["x\0y", "\u{FDD0}"]}});
        let stored = json(&doc).into_owned();
        assert!(!stored.to_string().contains("\\u0000"));
        assert_eq!(stored["\u{FDD0}k\u{FDD0}0"]["transient"], true, "{stored}");
        assert_eq!(unjsoned(stored), doc);
    }

    proptest! {
        #[test]
        fn any_string_round_trips(s in "[\\x00a\u{FDD0}\u{202E}é]{0,12}") {
            let stored = text(&s);
            prop_assert!(!stored.contains('\0'));
            prop_assert_eq!(untext(stored.into_owned()), s.clone());
            let doc = serde_json::json!({ s.clone(): [s.clone(), {"x": s.clone()}] });
            prop_assert_eq!(unjsoned(json(&doc).into_owned()), doc);
        }
    }
}
