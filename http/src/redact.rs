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

fn is_secret_key(key: &str) -> bool {
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

/// Free text (a parse error quoting a configuration line, say) with every URL in it shown as
/// [`display_url`] shows it. A URL here runs from its scheme to the next whitespace or quote.
pub fn redact_urls_in(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        // Back to the start of the scheme: letters, digits, `+ - .`.
        let start = rest[..found]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[found..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
            .map_or(rest.len(), |i| found + i);
        shown.push_str(&rest[..start]);
        shown.push_str(&display_url(&rest[start..end]));
        rest = &rest[end..];
    }
    shown.push_str(rest);
    shown
}

/// `/path?query#fragment` with the secret options' values replaced.
fn redact_tail(tail: &str) -> String {
    let Some(start) = tail.find(['?', '#']) else { return tail.to_string() };
    let (path, query) = tail.split_at(start);
    let mut shown = path.to_string();
    // Separators kept as they are; `&`, `;` and `#` end an option.
    let mut piece = String::new();
    for c in query.chars() {
        if matches!(c, '?' | '&' | ';' | '#') {
            shown.push_str(&redact_option(&piece));
            piece.clear();
            shown.push(c);
        } else {
            piece.push(c);
        }
    }
    shown.push_str(&redact_option(&piece));
    shown
}

fn redact_option(pair: &str) -> String {
    match pair.split_once('=') {
        Some((key, _)) if is_secret_key(&String::from_utf8_lossy(&percent_decode(key))) => format!("{key}=***"),
        _ => pair.to_string(),
    }
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
    use super::display_url;

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
            ("http://h:1/?auth=abc#token=def", "http://h:1/?auth=***#token=***"),
            ("postgres://u@db/x?password_file=/run/pw", "postgres://u@db/x?password_file=/run/pw"),
            ("postgres://u@db/x?pass%77ord=x", "postgres://u@db/x?pass%77ord=***"),
            ("postgres://db/x?sslpassword=a:b@c&password=d@e", "postgres://db/x?sslpassword=***&password=***"),
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
    }

    #[test]
    fn conninfo_secrets_are_hidden() {
        assert_eq!(display_url("host=db user=u password='a b\\' c' dbname=x"), "host=db user=u password=*** dbname=x");
        assert_eq!(display_url("password = s3cret host=db"), "password = *** host=db");
        assert_eq!(display_url("/var/lib/store.db"), "/var/lib/store.db");
    }
}
