//! The one way user-supplied text (a reason, a report line, a file name, a metadata value)
//! reaches a terminal: control characters and the invisible characters that reorder or hide
//! text are replaced by a visible escape, so a batch cannot recolour the operator's terminal,
//! retitle its window, erase a line or make one name read as another. The invisible ones are
//! the list the monitor marks on its pages too ([`invisible`]), so both show the same text.

use std::borrow::Cow;

pub use autocomp_model::is_concealing;

/// Characters that are invisible or change the order of the text around them: what the
/// model calls concealing (bidi embeddings, overrides, isolates and marks, zero-width
/// characters, the line and paragraph separators) other than the controls, which callers
/// judge on their own, and besides them the other format characters (general category Cf:
/// the soft hyphen, the tag characters U+E0000-E007F, ...) and the blank Hangul fillers
/// (U+115F, U+1160, U+3164, U+FFA0), which a name or a line must not hide behind either.
/// Variation selectors are not among them: emoji need them. The monitor's pages and account
/// names use this list; the terminal marks it too.
pub fn invisible(c: char) -> bool {
    (is_concealing(c) && !c.is_control())
        || matches!(
            c as u32,
            0x00AD
                | 0x0600..=0x0605
                | 0x06DD
                | 0x070F
                | 0x0890..=0x0891
                | 0x08E2
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180E
                | 0x206A..=0x206F
                | 0x3164
                | 0xFFA0
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE007F
        )
}

/// Whether [`for_terminal`] writes `c` as an escape.
pub fn marked(c: char) -> bool {
    is_concealing(c) || invisible(c)
}

/// `text` made safe to print: each concealing or invisible character becomes `\uXXXX` (a tag
/// character beyond the BMP its surrogate pair, `\udb40\udc41`). That escape is also what JSON writes for a BMP character, so
/// a JSON document printed through this still parses to the same value, and text output
/// shows exactly which character was there. Line feeds and tabs stay: a multi-line block
/// (a run's output) keeps its lines, each neutralized.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    escaped(text, marked)
}

/// A single-line field (a reason, a name, a file name printed on one line of `show`, `list`,
/// `status` or a log header): as [`for_terminal`], and a line feed shows as `\u000a`, so the
/// text cannot start a line of its own that reads as the program's.
pub fn one_line(text: &str) -> Cow<'_, str> {
    escaped(text, |c| c == '\n' || marked(c))
}

fn escaped(text: &str, mark: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&mark) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if mark(c) {
            // Beyond the BMP (the tag characters) as JSON spells it: a surrogate pair.
            for unit in c.encode_utf16(&mut [0; 2]) {
                safe.push_str(&format!("\\u{unit:04x}"));
            }
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
    fn the_invisible_characters_the_monitor_marks_show_as_escapes() {
        assert_eq!(for_terminal("ad\u{ad}min"), "ad\\u00admin");
        assert_eq!(for_terminal("\u{115f}\u{1160}\u{3164}\u{ffa0}"), "\\u115f\\u1160\\u3164\\uffa0");
        assert_eq!(for_terminal("ok\u{e0041}"), "ok\\udb40\\udc41");
        for c in ['\u{ad}', '\u{115f}', '\u{3164}', '\u{e0001}', '\u{202e}', '\u{200b}'] {
            assert!(invisible(c) && for_terminal(&c.to_string()) != c.to_string(), "{c:?}");
        }
        assert!(!invisible('\u{fe0f}'), "variation selectors make emoji");
    }

    #[test]
    fn a_single_line_field_shows_a_line_feed_as_an_escape() {
        assert_eq!(one_line("done\nFAKE line"), "done\\u000aFAKE line");
        assert_eq!(one_line("a\r\nb\u{2028}c"), "a\\u000d\\u000ab\\u2028c");
        assert!(matches!(one_line("plain text, a\ttab"), Cow::Borrowed(_)));
        assert_eq!(for_terminal("two\nlines"), "two\nlines", "a block keeps its lines");
    }

    #[test]
    fn ordinary_text_in_any_script_passes_unchanged_and_unallocated() {
        for text in ["Åsa Jürgen 佐藤 محمد", "two\nlines\tand a tab", ""] {
            assert!(matches!(for_terminal(text), Cow::Borrowed(_)), "{text:?}");
        }
    }

    #[test]
    fn a_json_document_printed_through_it_parses_to_the_same_value() {
        let value = serde_json::json!({"reason": "a\u{202e}b\u{1b}[2Jc\u{85}d\u{e0041}\u{ad}", "name": "Åsa"});
        let printed = for_terminal(&serde_json::to_string_pretty(&value).unwrap()).into_owned();
        assert!(!printed.chars().any(marked), "{printed}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&printed).unwrap(), value);
    }
}
