//! The one way a URL or secret is described in a log, an error, `/health` or `--help`:
//! whatever credentials it carries are replaced by `***` first.

/// A backend URL as it may be shown in an error or a log: a password in it is replaced by
/// `***` (PostgreSQL URLs may carry one).
pub fn display_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{hosts}{tail}")
        }
        _ => url.to_string(),
    }
}
