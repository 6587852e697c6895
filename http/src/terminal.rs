//! The one way user-supplied text (a reason, a report line, a file name, a metadata value)
//! reaches a terminal: control characters and the invisible characters that reorder or hide
//! text are replaced by a visible escape, so a batch cannot recolour the operator's terminal,
//! retitle its window, erase a line or make one name read as another.

use std::borrow::Cow;

pub use autocomp_model::is_concealing;

/// `text` made safe to print: each concealing character becomes `\uXXXX`. That escape is
/// also what JSON writes for the character, so a JSON document printed through this still
/// parses to the same value, and text output shows exactly which character was there.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_concealing) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_concealing(c) {
            safe.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    Cow::Owned(safe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_bells_and_carriage_returns_show_as_escapes() {
        let reason = "bad\u{1b}]0;owned\u{7}\u{1b}[31mred\rover";
        assert_eq!(for_terminal(reason), "bad\\u001b]0;owned\\u0007\\u001b[31mred\\u000dover");
    }

    #[test]
    fn bidi_overrides_and_zero_width_characters_are_visible() {
        assert_eq!(for_terminal("invoice\u{202e}fdp.exe"), "invoice\\u202efdp.exe");
        assert_eq!(for_terminal("a\u{200b}b\u{2066}c\u{feff}"), "a\\u200bb\\u2066c\\ufeff");
        assert_eq!(for_terminal("csi\u{9b}31m"), "csi\\u009b31m");
    }

    #[test]
    fn ordinary_text_in_any_script_passes_unchanged_and_unallocated() {
        for text in ["Åsa Jürgen 佐藤 محمد", "two\nlines\tand a tab", ""] {
            assert!(matches!(for_terminal(text), Cow::Borrowed(_)), "{text:?}");
        }
    }

    #[test]
    fn a_json_document_printed_through_it_parses_to_the_same_value() {
        let value = serde_json::json!({"reason": "a\u{202e}b\u{1b}[2Jc\u{85}d", "name": "Åsa"});
        let printed = for_terminal(&serde_json::to_string_pretty(&value).unwrap()).into_owned();
        assert!(!printed.chars().any(is_concealing), "{printed}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&printed).unwrap(), value);
    }
}
