//! HTML building: [`esc`], the one escaping function every interpolated value goes through
//! (with [`attr`], its twin for form values that are posted back),
//! the page layout (landmarks, skip link, assets, the sign-in line) and the small pieces
//! several pages share (a state or a hold with its icon, times, JSON blocks).

use std::fmt::{self, Display, Write as _};
use std::time::Duration;

use autocomp_model::{ComponentState, HoldKind, Timestamp};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::access::Access;
use super::accounts::invisible;
use super::assets;
use crate::filter::encode;

/// Appends formatted text to a `String` (writing to a `String` cannot fail).
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        use ::std::fmt::Write as _;
        let _ = $out.write_fmt(format_args!($($arg)*));
    }};
}
pub(crate) use w;

/// A value as HTML text: `& < > " '` escaped, and every character that could hide or
/// reorder what the page shows (controls, bidi overrides and isolates, zero-width and other
/// format characters) written out as a visible marker such as `⟨U+202E⟩`. Line feeds and
/// tabs stay (JSON blocks and messages are preformatted).
pub struct Esc<T>(T, Mode);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Text,
    Attribute,
}

/// The one way a value gets into a page's text: anything `Display`, escaped as it is
/// formatted. Also safe in an attribute, but a form field's value that is posted back must
/// use [`attr`], which keeps the characters `esc` marks.
pub fn esc<T: Display>(value: T) -> Esc<T> {
    Esc(value, Mode::Text)
}

/// A value for a form field's `value` attribute (or any attribute whose value travels
/// back): escaped like [`esc`], but hidden characters become character references, so the
/// browser posts back exactly the value it was given.
pub fn attr<T: Display>(value: T) -> Esc<T> {
    Esc(value, Mode::Attribute)
}

/// A character `esc` does not write as itself.
fn special(c: char) -> bool {
    match c {
        '&' | '<' | '>' | '"' | '\'' => true,
        '\n' | '\t' => false,
        c if c.is_ascii() => c.is_ascii_control(),
        c => c.is_control() || invisible(c),
    }
}

impl<T: Display> Display for Esc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Escaper<'a, 'b>(&'a mut fmt::Formatter<'b>, Mode);
        impl fmt::Write for Escaper<'_, '_> {
            fn write_str(&mut self, text: &str) -> fmt::Result {
                let mut rest = text;
                while let Some((at, c)) = rest.char_indices().find(|(_, c)| special(*c)) {
                    self.0.write_str(&rest[..at])?;
                    match (c, self.1) {
                        ('&', _) => self.0.write_str("&amp;")?,
                        ('<', _) => self.0.write_str("&lt;")?,
                        ('>', _) => self.0.write_str("&gt;")?,
                        ('"', _) => self.0.write_str("&quot;")?,
                        ('\'', _) => self.0.write_str("&#39;")?,
                        // A carriage return and NUL cannot be written as a reference.
                        ('\r' | '\0', Mode::Attribute) => {}
                        (c, Mode::Attribute) => write!(self.0, "&#x{:X};", c as u32)?,
                        (c, Mode::Text) => write!(self.0, "\u{27E8}U+{:04X}\u{27E9}", c as u32)?,
                    }
                    rest = &rest[at + c.len_utf8()..];
                }
                self.0.write_str(rest)
            }
        }
        write!(Escaper(f, self.1), "{}", self.0)
    }
}

/// Which main navigation entry a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Batches,
    /// The pipeline graph.
    Graph,
    /// Each component's results, durations and backlog over time.
    Charts,
    /// The batches waiting for a person at a human step.
    Waiting,
    /// What `autocomp alerts` reports.
    Alerts,
    None,
}

/// A whole page. `body` is HTML built with [`esc`]; `live` marks a page the script may
/// refresh in place (GET pages only: a POST's answer cannot be asked for again). `access`
/// is `None` on error pages, which show no sign-in line.
pub struct Page<'a> {
    pub title: &'a str,
    pub nav: Nav,
    pub access: Option<&'a Access>,
    /// A one-time message (the result of an action), shown above the live region.
    pub flash: Option<&'a str>,
    pub live: bool,
    /// Where a sign-in should come back to.
    pub here: &'a str,
}

impl Page<'_> {
    pub fn render(&self, body: &str) -> String {
        let mut out = String::with_capacity(body.len() + 2048);
        w!(
            out,
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{} · autocomp monitor</title>\n<link rel=\"icon\" href=\"data:,\">\n\
             <link rel=\"stylesheet\" href=\"{}\">\n\
             <script src=\"{}\" defer></script>\n</head>\n<body>\n\
             <a class=\"skip\" href=\"#main\">Skip to main content</a>\n<header>\n\
             <p class=\"brand\"><a href=\"/\">autocomp monitor</a></p>\n<nav aria-label=\"Main\"><ul>",
            esc(self.title),
            esc(assets::CSS.url()),
            esc(assets::JS.url())
        );
        for (nav, href, label) in [
            (Nav::Overview, "/", "Overview"),
            (Nav::Batches, "/batches", "Batches"),
            (Nav::Graph, "/graph", "Graph"),
            (Nav::Charts, "/charts", "Charts"),
            (Nav::Waiting, "/waiting", "Waiting for a person"),
            (Nav::Alerts, "/alerts", "Alerts"),
        ] {
            let current = if nav == self.nav { " aria-current=\"page\"" } else { "" };
            w!(out, "<li><a href=\"{}\"{current}>{}</a></li>", esc(href), esc(label));
        }
        out.push_str("</ul></nav>\n");
        if let Some(access) = self.access {
            out.push_str(&who(access, self.here));
        }
        // Shown by the script, which is what it controls.
        out.push_str(
            "<button type=\"button\" id=\"live-toggle\" class=\"quiet\" aria-pressed=\"false\" hidden>Pause live \
             updates</button>\n</header>\n<main id=\"main\" tabindex=\"-1\">\n",
        );
        if let Some(flash) = self.flash {
            w!(out, "<div class=\"flash\" role=\"status\"><h2>Done</h2><pre>{}</pre></div>\n", esc(flash));
        }
        if self.live {
            w!(out, "<div id=\"live\">\n{body}\n</div>\n");
        } else {
            out.push_str(body);
        }
        out.push_str(
            "</main>\n<footer><p><span id=\"live-status\"></span></p>\
             <p>Times are UTC, written <code>YYYY-MM-DDThh:mm:ss.sssZ</code>, by the store's clock.</p></footer>\n\
             </body>\n</html>\n",
        );
        out
    }
}

/// The sign-in line of the header.
fn who(access: &Access, here: &str) -> String {
    let mut out = String::from("<div class=\"who\">");
    match access {
        Access::ReadOnly => out.push_str("<p>Read only: this monitor has no accounts.</p>"),
        Access::SignedOut => {
            w!(out, "<p><a href=\"/login?next={}\">Sign in</a> to act on batches.</p>", esc(encode(here)))
        }
        Access::SignedIn { name, role, via_proxy: true } => {
            w!(out, "<p>Signed in as <strong>{}</strong> ({}).</p>", esc(name), esc(role))
        }
        Access::SignedIn { name, role, via_proxy: false } => w!(
            out,
            "<p>Signed in as <strong>{}</strong> ({}).</p><form method=\"post\" action=\"/logout\">\
             <button type=\"submit\" class=\"quiet\">Sign out</button></form>",
            esc(name),
            esc(role)
        ),
    }
    out.push_str("</div>\n");
    out
}

/// The icon of a state: decoration only (`aria-hidden`), the state is always written out.
pub fn state_icon(state: ComponentState) -> &'static str {
    match state {
        ComponentState::Success => "✓",
        ComponentState::Skipped => "↷",
        ComponentState::Stale => "⌛",
        ComponentState::Failed => "✗",
        ComponentState::Acknowledged => "⊘",
        ComponentState::Retrying => "↻",
        ComponentState::Working => "◐",
        ComponentState::Ready => "▷",
        ComponentState::Person => "☛",
        ComponentState::Waiting => "◌",
    }
}

/// What a state means, for the badge's tooltip where the name alone says little.
pub fn state_meaning(state: ComponentState) -> Option<&'static str> {
    match state {
        ComponentState::Person => Some("waiting for a person: a human step, approved or rejected on the batch's page"),
        ComponentState::Acknowledged => {
            Some("a failure an operator acknowledged: it needs nobody; a rerun opens it again")
        }
        _ => None,
    }
}

/// Text whose `quoted` parts are code (as the operator's messages write names and values):
/// escaped, each backtick pair a `<code>` span; an unpaired backtick stays as it is.
pub fn code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut parts = text.split('`').peekable();
    let mut inside = false;
    while let Some(part) = parts.next() {
        if inside && parts.peek().is_none() {
            // The last backtick has no partner.
            w!(out, "`{}", esc(part));
        } else if inside {
            w!(out, "<code>{}</code>", esc(part));
        } else {
            w!(out, "{}", esc(part));
        }
        inside = !inside;
    }
    out
}

/// A state as text with its icon; the class only adds colour. `overdue` is written out too.
/// `person` (a human step's batch waiting for a decision) carries its meaning as a tooltip.
pub fn state_badge(state: ComponentState, overdue: bool) -> String {
    let mut out = String::new();
    let title = state_meaning(state).map(|m| format!(" title=\"{}\"", esc(m))).unwrap_or_default();
    w!(
        out,
        "<span class=\"state state-{}\"{title}><span class=\"icon\" aria-hidden=\"true\">{}</span> {}</span>",
        esc(state.as_str()),
        esc(state_icon(state)),
        esc(state.as_str())
    );
    if overdue {
        out.push_str(
            " <span class=\"overdue\"><span class=\"icon\" aria-hidden=\"true\">⚠\u{fe0e}</span> overdue</span>",
        );
    }
    out
}

/// A hold (paused, draining, circuit open) as text with its icon; the class only adds colour.
pub fn hold_badge(kind: HoldKind) -> String {
    let icon = match kind {
        HoldKind::Pause => "‖",
        HoldKind::Drain => "⤓",
        HoldKind::Circuit => "⊘",
    };
    let class = match kind {
        HoldKind::Pause => "paused",
        HoldKind::Drain => "draining",
        HoldKind::Circuit => "circuit",
    };
    format!(
        "<span class=\"hold hold-{class}\"><span class=\"icon\" aria-hidden=\"true\">{icon}</span> {}</span>",
        esc(kind.as_str())
    )
}

/// pass / FAIL / absent, as `explain` words it, with an icon.
pub fn check(holds: Option<bool>) -> String {
    let (class, icon, text) = match holds {
        Some(true) => ("pass", "✓", "pass"),
        Some(false) => ("fail", "✗", "FAIL"),
        None => ("absent", "–", "absent"),
    };
    format!("<span class=\"check {class}\"><span class=\"icon\" aria-hidden=\"true\">{icon}</span> {text}</span>")
}

/// A time as every page writes it: UTC, RFC 3339 with milliseconds (`2026-11-27T01:13:27.123Z`,
/// as `Timestamp` displays it and the CLI prints it), the footer saying so.
pub fn time(at: Timestamp) -> String {
    format!("<time datetime=\"{0}\" title=\"UTC\">{0}</time>", esc(at))
}

/// Whole seconds, as `1h 5m 3s`.
pub fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// Pretty JSON in a `<pre>`.
pub fn json_block(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    // It scrolls when long: reachable from the keyboard, as the other scrolling regions.
    format!("<pre class=\"json\" tabindex=\"0\">{}</pre>", esc(text))
}

/// Hidden inputs carrying `fields` unchanged (a preview's confirm form re-posts them).
pub fn hidden_fields(fields: &[(String, String)]) -> String {
    let mut out = String::new();
    for (name, value) in fields {
        w!(out, "<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(name), attr(value));
    }
    out
}

/// A rendered page as the answer: HTML, revalidated before reuse, never shared.
pub(crate) fn html_response(status: StatusCode, page: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache, private")], page)
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_that_could_open_markup_or_leave_an_attribute_is_escaped() {
        assert_eq!(
            esc("<script>alert('x') & \"y\"</script>").to_string(),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(esc("plain text, ünïcode ✓").to_string(), "plain text, ünïcode ✓");
        assert_eq!(esc(42).to_string(), "42");
    }

    #[test]
    fn quoted_parts_become_code_spans_and_everything_is_escaped() {
        assert_eq!(
            code_spans("unknown filter `<b>:` (known: `a:`)"),
            "unknown filter <code>&lt;b&gt;:</code> (known: <code>a:</code>)"
        );
        assert_eq!(code_spans("no quotes"), "no quotes");
        assert_eq!(code_spans("odd ` one"), "odd ` one");
    }

    #[test]
    fn hidden_and_reordering_characters_are_shown_as_markers() {
        assert_eq!(esc("eve\u{202E}nimda").to_string(), "eve⟨U+202E⟩nimda");
        assert_eq!(
            esc("\u{2066}a\u{2069}\u{200E}\u{200F}\u{200B}\u{FEFF}").to_string(),
            "⟨U+2066⟩a⟨U+2069⟩⟨U+200E⟩⟨U+200F⟩⟨U+200B⟩⟨U+FEFF⟩"
        );
        assert_eq!(esc("bell\u{7} del\u{7f} c1\u{85}").to_string(), "bell⟨U+0007⟩ del⟨U+007F⟩ c1⟨U+0085⟩");
        assert_eq!(esc("tag\u{E0041}").to_string(), "tag⟨U+E0041⟩");
        assert_eq!(esc("line\nand\ttab").to_string(), "line\nand\ttab", "kept for preformatted text");
        assert_eq!(esc("Åsa, Jürgen, 佐藤, عربي").to_string(), "Åsa, Jürgen, 佐藤, عربي");
        // A posted-back value keeps the character, as a reference the browser decodes.
        assert_eq!(attr("a\u{202E}b<\"").to_string(), "a&#x202E;b&lt;&quot;");
    }
}
