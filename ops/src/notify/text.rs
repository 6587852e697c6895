//! User text (summaries, reasons, report lines) as a notice shows it: on one line, with
//! control, bidi and zero-width characters escaped the way a terminal shows them
//! (`for_terminal`), and cut to a bound. A subject made of it cannot add a mail header, and a
//! mail's text cannot hide or reorder what it says.

use autocomp_toolkit::for_terminal;

use crate::operator::cut;

/// Longest subject a notice gets (the outbox takes 500).
pub const MAX_SUBJECT_CHARS: usize = 200;
/// Longest piece of user text a notice quotes.
pub const MAX_QUOTE_CHARS: usize = 1_000;

/// `text` on one line (line breaks and tabs become spaces), concealing characters escaped,
/// at most `max` characters (cut with `…`).
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if matches!(c, '\n' | '\r' | '\t') { ' ' } else { c }).collect();
    cut(&for_terminal(flat.trim()), max)
}

/// Quoted user text in a notice: one line, bounded.
pub fn quote(text: &str) -> String {
    one_line(text, MAX_QUOTE_CHARS)
}

/// A subject: one line, bounded, never empty.
pub fn subject(text: &str) -> String {
    let line = one_line(text, MAX_SUBJECT_CHARS);
    if line.is_empty() { "autocomp".to_owned() } else { line }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_one_visible_line() {
        let hostile = "disk full\r\nBcc: everyone@example.org\u{1b}[31m\u{202e}gpj.exe";
        let shown = subject(hostile);
        assert!(!shown.contains(['\r', '\n', '\u{1b}', '\u{202e}']), "{shown:?}");
        assert_eq!(shown, "disk full  Bcc: everyone@example.org\\u001b[31m\\u202egpj.exe");
        assert_eq!(subject("x".repeat(500).as_str()).chars().count(), MAX_SUBJECT_CHARS + 1);
        assert_eq!(subject(" \n "), "autocomp");
    }
}
