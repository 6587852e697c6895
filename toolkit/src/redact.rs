//! The one way a URL or secret is described in a log, an error, `/health`, a panic or
//! `--help`: whatever credentials it carries are replaced by `***` first. Every description
//! of a backend URL goes through [`display_url`], so there is one rule to get right.

/// Query and conninfo keys whose value is a secret (compared without case). A key ending in
/// `_file` names a file holding a secret (`password_file`), which is not one itself.
const SECRET_KEYS: &[&str] = &[
    "password",
    "sslpassword",
    "pass",
    "passwd",
    "pwd",
    "auth",
    "token",
    "access_token",
    "secret",
    "api_key",
    "apikey",
];

/// Whether a query option, conninfo or configuration key names a secret (`password`,
/// `sslpassword`, `token`, `api_key`, ...), compared without case.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    if key.ends_with("file") {
        return false;
    }
    SECRET_KEYS.contains(&key.as_str()) || key.contains("password") || key.contains("secret") || key.contains("token")
}

/// A backend URL as it may be shown in an error, a log or `/health`: every secret in it is
/// replaced by `***`.
///
/// - The userinfo's password: with a password, the userinfo ends at the LAST `@` of the
///   URL ([`userinfo_end`]), so a password may hold `/ ? @ # : %` and any other character,
///   raw or percent-encoded. (A raw `@` in the query then makes more than the password
///   hidden: the description errs on the side of showing too little.)
/// - Secret query options (`password=`, `sslpassword=`, `auth=`, `token=`, ...), in the
///   query and in the fragment.
/// - A libpq conninfo string (`host=db user=u password='x y'`): its secret values.
///
/// Anything else is shown as it is.
pub fn display_url(url: &str) -> String {
    let scheme_and_rest = url.split_once("://").filter(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    let Some((scheme, rest)) = scheme_and_rest else {
        return if url.contains('=') { redact_conninfo(url) } else { url.to_string() };
    };
    let (userinfo, after) = match userinfo_end(rest) {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (hosts, tail) = after.split_at(end);
    let mut shown = format!("{scheme}://");
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                shown.push_str(user);
                shown.push_str(":***");
            }
            None => shown.push_str(userinfo),
        }
        shown.push('@');
    }
    shown.push_str(hosts);
    shown.push_str(&redact_tail(tail));
    shown
}

/// Where the userinfo of `rest` (a URL after `scheme://`) ends: with a password (a `:`
/// before the first `@`), at the LAST `@`, so the password may hold any character; without
/// one, at the first `@` (a user name), so a query value may hold `@`; nowhere when what
/// precedes the first `@` is no user name (an `@` in a path or query value). The store's
/// URL parser splits the same way.
pub fn userinfo_end(rest: &str) -> Option<usize> {
    let first = rest.find('@')?;
    let user = rest[..first].split(':').next().unwrap_or("");
    // A user name holding these is hosts and a path or query, whose values hold the `@`.
    if user.contains(['/', '?', '#', '=', '&', ';']) {
        return None;
    }
    if rest[..first].contains(':') { rest.rfind('@') } else { Some(first) }
}

/// Where the query of `url` begins (the index of its `?`), looked for after the userinfo as
/// [`userinfo_end`] ends it, so a raw `?` in a password is not taken for it; `None` without
/// a query.
pub fn query_start(url: &str) -> Option<usize> {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let location = scheme_end + userinfo_end(&url[scheme_end..]).map_or(0, |at| at + 1);
    url[location..].find('?').map(|i| location + i)
}

/// `url` with one more option (`key=value`): after the options of its query, or as its query.
pub fn with_option(url: &str, option: &str) -> String {
    let separator = if query_start(url).is_some() { '&' } else { '?' };
    format!("{url}{separator}{option}")
}

/// Free text (a parse error quoting a configuration line, say) with every URL in it shown as
/// [`display_url`] shows it. A URL here runs from its scheme to the next whitespace or quote,
/// unless a secret runs on past it: a password whose userinfo ends at an `@` further on the
/// line hides the line up to there, and a quoted URL's last secret option (whose value may
/// hold a space or a quote) the rest of the line.
pub fn redact_urls_in(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        // Back to the start of the scheme: letters, digits, `+ - .`.
        let start = rest[..found]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = url_end(rest, start, found);
        shown.push_str(&rest[..start]);
        shown.push_str(&display_url(&rest[start..end]));
        rest = &rest[end..];
    }
    shown.push_str(rest);
    shown
}

/// Where the URL starting at `start`, whose `://` is at `found` in `text`, ends (see
/// [`redact_urls_in`]).
fn url_end(text: &str, start: usize, found: usize) -> usize {
    let word_end = |from: usize| {
        text[from..].find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`')).map_or(text.len(), |i| from + i)
    };
    let end = word_end(found);
    let line_end = text[found..].find('\n').map_or(text.len(), |i| found + i);
    let authority = found + 3;
    // A password's userinfo ends at the last `@` of the line, as `display_url` reads it.
    if let Some(at) = userinfo_end(&text[authority..line_end])
        && text[authority..authority + at].contains(':')
        && authority + at >= end
    {
        return word_end(authority + at + 1).min(line_end);
    }
    // A quoted URL (a configuration line) whose last option is a secret: its value may run
    // past a space or a quote, so the rest of the line is hidden.
    let quoted = text[..start].ends_with(['"', '\'', '`']);
    if quoted && end < line_end && display_url(&text[start..end]).ends_with("=***") { line_end } else { end }
}

/// `/path?query#fragment` with the secret options' values replaced. A secret option's value
/// runs to the next `&key=` (an `&` followed by something shaped like a key and `=`), so a
/// raw `? # " ' /` or space inside a password never shows; the fragment is read the same way.
/// Any other option ends at `& ; # ?`, so a secret option after it is still found.
fn redact_tail(tail: &str) -> String {
    let Some(start) = tail.find(['?', '#']) else { return tail.to_string() };
    let (path, query) = tail.split_at(start);
    let mut shown = path.to_string();
    let mut rest = query;
    while let Some(separator) = rest.chars().next() {
        shown.push(separator);
        rest = &rest[separator.len_utf8()..];
        let end = match rest.split_once('=') {
            Some((key, _)) if !key.contains(['?', '&', ';', '#']) && is_secret_key(&decoded(key)) => {
                let value_end = next_option(rest, key.len() + 1);
                shown.push_str(key);
                shown.push_str("=***");
                rest = &rest[value_end..];
                continue;
            }
            _ => rest.find(['?', '&', ';', '#']).unwrap_or(rest.len()),
        };
        shown.push_str(&rest[..end]);
        rest = &rest[end..];
    }
    shown
}

/// Where the option after a secret value starting at `from` begins: the next `&` followed by
/// a key (letters, digits, `_ - . %`) and `=`; the end when there is none.
fn next_option(text: &str, from: usize) -> usize {
    let mut at = from;
    while let Some(found) = text[at..].find('&') {
        let candidate = at + found;
        let after = &text[candidate + 1..];
        let key_len = after.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '%')));
        if let Some(len) = key_len
            && len > 0
            && after[len..].starts_with('=')
        {
            return candidate;
        }
        at = candidate + 1;
    }
    text.len()
}

fn decoded(key: &str) -> String {
    String::from_utf8_lossy(&percent_decode(key)).into_owned()
}

/// `key=value key2='quoted value'` (libpq's conninfo syntax) with secret values replaced.
fn redact_conninfo(text: &str) -> String {
    let mut shown = String::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            shown.push(c);
            chars.next();
            continue;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        shown.push_str(&key);
        while let Some(&c) = chars.peek().filter(|c| c.is_whitespace()) {
            shown.push(c);
            chars.next();
        }
        if chars.peek() != Some(&'=') {
            continue;
        }
        chars.next();
        shown.push('=');
        while let Some(&c) = chars.peek().filter(|c| c.is_whitespace()) {
            shown.push(c);
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            value.push('\'');
            chars.next();
            while let Some(c) = chars.next() {
                value.push(c);
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    _ => {}
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        shown.push_str(if is_secret_key(&key) { "***" } else { &value });
    }
    shown
}

/// `%XX` decoded to bytes; a `%` not followed by two hex digits is kept as it is (as
/// tokio-postgres and libpq do). Also how the PostgreSQL URL's credentials are read, so the
/// redaction and the parser agree on what a URL says.
pub fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text.get(i + 1..i + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{display_url, query_start, with_option};

    #[test]
    fn an_option_goes_into_the_query_that_the_stores_parser_sees() {
        // A password's raw `?` is not a query.
        assert_eq!(query_start("postgres://u:pa?ss@h/db"), None);
        assert_eq!(with_option("postgres://u:pa?ss@h/db", "migrate=false"), "postgres://u:pa?ss@h/db?migrate=false");
        // Without a password the userinfo ends at the first `@`: a query value may hold one.
        let url = "postgres://autocomp@db/autocomp?application_name=store@h1";
        assert_eq!(query_start(url), Some(url.find('?').unwrap()));
        assert_eq!(with_option(url, "max_batch_bytes=1"), format!("{url}&max_batch_bytes=1"));
        assert_eq!(with_option("sqlite:///var/lib/s.db", "migrate=false"), "sqlite:///var/lib/s.db?migrate=false");
        assert_eq!(with_option("postgres://u:p@h/db?pool_size=4", "a=1"), "postgres://u:p@h/db?pool_size=4&a=1");
    }

    #[test]
    fn passwords_anywhere_in_the_userinfo_are_hidden() {
        for (url, shown) in [
            ("postgres://u:hunter2@db/x", "postgres://u:***@db/x"),
            ("postgres://u:a/b?c@db:5432,db2/x?sslmode=require", "postgres://u:***@db:5432,db2/x?sslmode=require"),
            ("postgres://u:p@ss@db/x", "postgres://u:***@db/x"),
            ("postgres://u:p%40ss#x@db/x", "postgres://u:***@db/x"),
            ("postgres://u:pässwörd@db/x", "postgres://u:***@db/x"),
            ("postgres://u@db/x", "postgres://u@db/x"),
            ("http://127.0.0.1:7070", "http://127.0.0.1:7070"),
            ("sqlite:///var/lib/store.db?synchronous=full", "sqlite:///var/lib/store.db?synchronous=full"),
        ] {
            assert_eq!(display_url(url), shown, "{url}");
        }
    }

    #[test]
    fn secret_options_are_hidden() {
        for (url, shown) in [
            ("postgres://u@db/x?password=hunter2&sslmode=disable", "postgres://u@db/x?password=***&sslmode=disable"),
            ("postgres://u@db/x?sslpassword=k&PassWord=2", "postgres://u@db/x?sslpassword=***&PassWord=***"),
            ("http://h:1/?auth=abc#token=def", "http://h:1/?auth=***"),
            ("http://h:1/?a=1#token=def", "http://h:1/?a=1#token=***"),
            ("http://h:1/#token=d?e#f&x=1", "http://h:1/#token=***&x=1"),
            ("postgres://u@db/x?password_file=/run/pw", "postgres://u@db/x?password_file=/run/pw"),
            ("postgres://u@db/x?pass%77ord=x", "postgres://u@db/x?pass%77ord=***"),
            ("postgres://db/x?sslpassword=a:b@c&password=d@e", "postgres://db/x?sslpassword=***&password=***"),
        ] {
            assert_eq!(display_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_secret_option_runs_to_the_next_key_whatever_it_holds() {
        for (url, shown) in [
            ("postgres://db/x?password=a?b#c&sslmode=require", "postgres://db/x?password=***&sslmode=require"),
            ("postgres://db/x?sslmode=require&password=a b\"c'd/e", "postgres://db/x?sslmode=require&password=***"),
            ("http://h/?token=x&&y&=z&next=1", "http://h/?token=***&next=1"),
            ("postgres://db/x?application_name=a?password=b#c", "postgres://db/x?application_name=a?password=***"),
            ("postgres://db/x?password=", "postgres://db/x?password=***"),
        ] {
            assert_eq!(display_url(url), shown, "{url}");
        }
    }

    #[test]
    fn an_at_in_a_query_ends_no_user_name() {
        for url in ["postgres://u@db:5432/x?application_name=a@b", "postgres://db/x?application_name=a@b"] {
            assert_eq!(display_url(url), url);
        }
    }

    #[test]
    fn urls_in_text_are_hidden() {
        assert_eq!(
            super::redact_urls_in("3 | store = \"postgres://u:s/e@c@h/db\"\n  | ^ expected"),
            "3 | store = \"postgres://u:***@h/db\"\n  | ^ expected"
        );
        assert_eq!(super::redact_urls_in("at postgres://u:pw@h/db, retrying"), "at postgres://u:***@h/db, retrying");
        // A password holding a space or a quote: the userinfo still ends at the line's `@`.
        assert_eq!(
            super::redact_urls_in("store = \"postgres://u:p w\\\"x@h/db\" oops\nnext line"),
            "store = \"postgres://u:***@h/db\" oops\nnext line"
        );
        // A quoted URL's last secret option hides the rest of its line, not the next one.
        assert_eq!(
            super::redact_urls_in("store = \"http://h/?token=a b\" c\nnext"),
            "store = \"http://h/?token=***\nnext"
        );
        assert_eq!(super::redact_urls_in("GET http://h/?token=abc failed"), "GET http://h/?token=*** failed");
    }

    #[test]
    fn conninfo_secrets_are_hidden() {
        assert_eq!(display_url("host=db user=u password='a b\\' c' dbname=x"), "host=db user=u password=*** dbname=x");
        assert_eq!(display_url("password = s3cret host=db"), "password = *** host=db");
        assert_eq!(display_url("/var/lib/store.db"), "/var/lib/store.db");
    }
}
