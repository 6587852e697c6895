//! HTML building: [`esc`], the one escaping function every interpolated value goes through,
//! the page layout (landmarks, skip link, assets, the sign-in line) and the small pieces
//! several pages share (a state with its icon, times, JSON blocks).

use std::fmt::{self, Display, Write as _};
use std::time::Duration;

use autocomp_model::{ComponentState, Timestamp};
use serde_json::Value;

use super::access::Access;
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

/// A value as HTML text or as a quoted attribute value: `& < > " '` escaped.
pub struct Esc<T>(T);

/// The one way a value gets into a page: anything `Display`, escaped as it is formatted.
pub fn esc<T: Display>(value: T) -> Esc<T> {
    Esc(value)
}

impl<T: Display> Display for Esc<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Escaper<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escaper<'_, '_> {
            fn write_str(&mut self, text: &str) -> fmt::Result {
                let mut rest = text;
                while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
                    self.0.write_str(&rest[..at])?;
                    self.0.write_str(match rest.as_bytes()[at] {
                        b'&' => "&amp;",
                        b'<' => "&lt;",
                        b'>' => "&gt;",
                        b'"' => "&quot;",
                        _ => "&#39;",
                    })?;
                    rest = &rest[at + 1..];
                }
                self.0.write_str(rest)
            }
        }
        write!(Escaper(f), "{}", self.0)
    }
}

/// Which main navigation entry a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Batches,
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
        for (nav, href, label) in [(Nav::Overview, "/", "Overview"), (Nav::Batches, "/batches", "Batches")] {
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
             <p>Times are UTC, by the store's clock.</p></footer>\n</body>\n</html>\n",
        );
        out
    }
}

/// The sign-in line of the header.
fn who(access: &Access, here: &str) -> String {
    let mut out = String::from("<div class=\"who\">");
    match access {
        Access::ReadOnly => out.push_str("<p>Read only: this monitor has no write token.</p>"),
        Access::SignedOut => {
            w!(out, "<p><a href=\"/login?next={}\">Sign in</a> to act on batches.</p>", esc(encode(here)))
        }
        Access::SignedIn { name, via_proxy: true } => w!(out, "<p>Signed in as <strong>{}</strong>.</p>", esc(name)),
        Access::SignedIn { name, via_proxy: false } => w!(
            out,
            "<p>Signed in as <strong>{}</strong>.</p><form method=\"post\" action=\"/logout\">\
             <button type=\"submit\" class=\"quiet\">Sign out</button></form>",
            esc(name)
        ),
    }
    out.push_str("</div>\n");
    out
}

/// The icon of a state: decoration only (`aria-hidden`), the state is always written out.
pub fn state_icon(state: ComponentState) -> &'static str {
    match state {
        ComponentState::Success => "✓",
        ComponentState::Failed => "✗",
        ComponentState::Retrying => "↻",
        ComponentState::Working => "◐",
        ComponentState::Ready => "▷",
        ComponentState::Waiting => "◌",
    }
}

/// A state as text with its icon; the class only adds colour. `overdue` is written out too.
pub fn state_badge(state: ComponentState, overdue: bool) -> String {
    let mut out = String::new();
    w!(
        out,
        "<span class=\"state state-{}\"><span class=\"icon\" aria-hidden=\"true\">{}</span> {}</span>",
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

/// pass / FAIL / absent, as `explain` words it, with an icon.
pub fn check(holds: Option<bool>) -> String {
    let (class, icon, text) = match holds {
        Some(true) => ("pass", "✓", "pass"),
        Some(false) => ("fail", "✗", "FAIL"),
        None => ("absent", "–", "absent"),
    };
    format!("<span class=\"check {class}\"><span class=\"icon\" aria-hidden=\"true\">{icon}</span> {text}</span>")
}

pub fn time(at: Timestamp) -> String {
    format!("<time datetime=\"{0}\">{0}</time>", esc(at))
}

/// Whole seconds, as `1h 5m 3s`.
pub fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// Pretty JSON in a `<pre>`.
pub fn json_block(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    format!("<pre class=\"json\">{}</pre>", esc(text))
}

/// Hidden inputs carrying `fields` unchanged (a preview's confirm form re-posts them).
pub fn hidden_fields(fields: &[(String, String)]) -> String {
    let mut out = String::new();
    for (name, value) in fields {
        w!(out, "<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(name), esc(value));
    }
    out
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
}
