//! Validated names. Batch ids and component names become ZooKeeper node names and file
//! names, so each name type checks its grammar once, at construction and deserialization,
//! and the rest of the code can interpolate them without re-checking.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Bad input, naming the field and the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {}: {reason}", shown(.value))]
pub struct InvalidInput {
    pub field: String,
    pub value: String,
    pub reason: String,
}

impl InvalidInput {
    pub fn new(field: impl Into<String>, value: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), value: value.into(), reason: reason.into() }
    }
}

/// Quotes a value for an error message, shortening huge ones so the message stays readable.
fn shown(value: &str) -> String {
    const MAX: usize = 160;
    if value.chars().count() <= MAX {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(MAX).collect();
        format!("{head:?}... ({} bytes)", value.len())
    }
}

struct Grammar {
    field: &'static str,
    max_len: usize,
    first: fn(char) -> bool,
    rest: fn(char) -> bool,
    description: &'static str,
    /// `first` and `rest` as a regular expression, for the name's JSON Schema.
    #[cfg_attr(not(feature = "json-schema"), allow(dead_code))]
    pattern: &'static str,
}

impl Grammar {
    fn check(&self, value: &str) -> Result<(), InvalidInput> {
        let fail = |reason: String| Err(InvalidInput::new(self.field, value, reason));
        let mut chars = value.chars();
        match chars.next() {
            None => return fail(format!("must not be empty; expected {}", self.description)),
            Some(c) if !(self.first)(c) => {
                return fail(format!("must start with {}; expected {}", self.first_hint(), self.description));
            }
            Some(_) => {}
        }
        if let Some(bad) = chars.find(|c| !(self.rest)(*c)) {
            return fail(format!("character {bad:?} is not allowed; expected {}", self.description));
        }
        let length = value.chars().count();
        if length > self.max_len {
            return fail(format!("is {length} characters long, at most {} allowed", self.max_len));
        }
        Ok(())
    }

    fn first_hint(&self) -> &'static str {
        if (self.first)('0') { "a letter or digit" } else { "a letter" }
    }
}

/// Whether `c` would act on a terminal or a reader instead of showing as itself: C0 controls
/// other than newline and tab (ESC starts colour and title sequences, CR overwrites a line,
/// BEL rings), DEL, the C1 controls (U+009B is a one-byte CSI on some terminals), the bidi
/// embeddings, overrides, isolates and marks (U+202E shows `txt.exe` as `exe.txt`), the
/// zero-width characters, and the line and paragraph separators. Names may not hold them;
/// other text is shown with them escaped.
pub fn is_concealing(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// A character of a person's or a program's name, in any script: visible, not a space.
fn name_char(c: char) -> bool {
    !c.is_whitespace() && !c.is_control() && !is_concealing(c)
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}
fn alpha(c: char) -> bool {
    c.is_ascii_alphabetic()
}
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}
fn word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident, $grammar:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            const GRAMMAR: Grammar = $grammar;

            pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
                let value = value.into();
                Self::GRAMMAR.check(&value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidInput;
            fn try_from(value: String) -> Result<Self, InvalidInput> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(value: &str) -> Result<Self, InvalidInput> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidInput;
            fn from_str(value: &str) -> Result<Self, InvalidInput> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        #[cfg(feature = "json-schema")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let grammar = Self::GRAMMAR;
                schemars::json_schema!({
                    "type": "string",
                    "description": grammar.description,
                    "minLength": 1,
                    "maxLength": grammar.max_len,
                    "pattern": grammar.pattern,
                })
            }
        }
    };
}

validated_name!(
    /// A batch id, e.g. `B400022028241-RT1`: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
    BatchId,
    Grammar {
        field: "batch id",
        max_len: 128,
        first: alnum,
        rest: id_char,
        description: "1-128 characters of [A-Za-z0-9._-] starting with a letter or digit",
        pattern: r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    }
);

validated_name!(
    /// An event type, e.g. `Checksums_Verified`: `[A-Za-z][A-Za-z0-9_]{0,63}`.
    EventType,
    Grammar {
        field: "event type",
        max_len: 64,
        first: alpha,
        rest: word_char,
        description: "1-64 characters of [A-Za-z0-9_] starting with a letter",
        pattern: r"^[A-Za-z][A-Za-z0-9_]*$",
    }
);

validated_name!(
    /// A batch type, e.g. `RoundTrip`: same grammar as an event type.
    BatchType,
    Grammar {
        field: "batch type",
        max_len: 64,
        first: alpha,
        rest: word_char,
        description: "1-64 characters of [A-Za-z0-9_] starting with a letter",
        pattern: r"^[A-Za-z][A-Za-z0-9_]*$",
    }
);

validated_name!(
    /// A component name, e.g. `checksum-verifier`; it names lock nodes and claims.
    ComponentName,
    Grammar {
        field: "component",
        max_len: 64,
        first: alnum,
        rest: id_char,
        description: "1-64 characters of [A-Za-z0-9._-] starting with a letter or digit",
        pattern: r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    }
);

validated_name!(
    /// A resource pool's name, e.g. `tape`: a shared resource that takes so many batches'
    /// work at a time across all hosts; it names the pool's slot locks.
    PoolName,
    Grammar {
        field: "pool",
        max_len: 64,
        first: alnum,
        rest: id_char,
        description: "1-64 characters of [A-Za-z0-9._-] starting with a letter or digit",
        pattern: r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    }
);

validated_name!(
    /// A client-chosen key that makes a retried append return the first one's event.
    IdempotencyKey,
    Grammar {
        field: "idempotency key",
        max_len: 128,
        first: alnum,
        rest: |c| c.is_ascii_graphic(),
        description: "1-128 printable ASCII characters starting with a letter or digit",
        pattern: r"^[A-Za-z0-9][!-~]*$",
    }
);

validated_name!(
    /// Who wrote an event: `component/version@host#pid` or `operator:<name>`.
    Agent,
    Grammar {
        field: "agent",
        max_len: 256,
        first: name_char,
        rest: |c| name_char(c) || c == ' ',
        description: "1-256 visible characters of any script (inner spaces allowed; no control, bidi or \
                      zero-width characters)",
        pattern: r"^[^ \u0000-\u001f\u007f-\u00a0\u061c\u1680\u2000-\u200f\u2028-\u202f\u205f-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u00a0\u061c\u1680\u2000-\u200f\u2028-\u202f\u205f-\u2069\u3000\ufeff]*$",
    }
);

impl EventType {
    /// The reserved type of operator reset markers.
    pub const RESET: &'static str = "Reset";

    pub fn reset() -> Self {
        Self(Self::RESET.to_owned())
    }

    pub fn is_reset(&self) -> bool {
        self.0 == Self::RESET
    }

    /// The reserved type of the event that stands for a pruned history: a batch whose history
    /// was exported and removed keeps its effective events and this one, whose details name
    /// the export. Such a batch is ready for no component (`Trigger::failing_clause`) until
    /// its history is imported again.
    pub const HISTORY_PRUNED: &'static str = "History_Pruned";

    pub fn history_pruned() -> Self {
        Self(Self::HISTORY_PRUNED.to_owned())
    }

    pub fn is_history_pruned(&self) -> bool {
        self.0 == Self::HISTORY_PRUNED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_follow_the_grammar() {
        for ok in ["B400022028241-RT1", "a", "0.x_y-z", &"a".repeat(128)] {
            assert!(BatchId::new(ok).is_ok(), "{ok} should be valid");
        }
        for bad in ["", "-a", ".hidden", "a/b", "a b", "ø", "../x", &"a".repeat(129), "a\n"] {
            let err = BatchId::new(bad).unwrap_err();
            assert_eq!(err.field, "batch id");
            assert_eq!(err.value, bad);
        }
    }

    #[test]
    fn agents_are_names_in_any_script_without_hidden_characters() {
        for ok in ["operator:Åsa", "operator:Jürgen", "operator:佐藤", "operator:محمد", "bagit-verifier/1.0@host#42"]
        {
            assert!(Agent::new(ok).is_ok(), "{ok} should be valid");
        }
        assert!(Agent::new("operator:".to_string() + &"é".repeat(247)).is_ok(), "256 characters, more bytes");
        for bad in [
            "",
            " operator:x",
            "operator:\u{1b}[31mred",
            "operator:a\u{202e}b",
            "operator:a\u{200b}b",
            "operator:a\u{2066}b",
            "operator:a\tb",
            "operator:a\nb",
            "operator:a\u{85}b",
            "operator:a\u{3000}b",
        ] {
            let err = Agent::new(bad).unwrap_err();
            assert_eq!((err.field.as_str(), err.value.as_str()), ("agent", bad));
        }
    }

    #[test]
    fn event_types_follow_the_grammar() {
        assert!(EventType::new("Checksums_Verified").is_ok());
        for bad in ["", "1abc", "a-b", "a.b", &"a".repeat(65)] {
            let err = EventType::new(bad).unwrap_err();
            assert_eq!(err.field, "event type");
            assert!(err.to_string().contains("event type"), "{err}");
        }
    }

    #[test]
    fn deserialization_validates() {
        let err = serde_json::from_str::<BatchId>("\"../etc/passwd\"").unwrap_err();
        assert!(err.to_string().contains("batch id"), "{err}");
    }

    #[test]
    fn long_values_are_shortened_in_messages() {
        let err = BatchId::new("x/".repeat(10_000)).unwrap_err();
        assert!(err.to_string().len() < 400, "{}", err.to_string().len());
    }
}
