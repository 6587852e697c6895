//! A GET page's answer: the layout around its body, with the sign-in line, the one-time
//! message the request carries (cleared by the answer) and the live region.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::auth;
use super::gate::Caller;
use super::html::{Nav, Page, html_response};

/// A GET page: its layout, the one-time message if the request carries one (cleared by
/// the response), and the live region.
pub(crate) fn respond(headers: &HeaderMap, caller: &Caller, title: &str, nav: Nav, here: &str, body: &str) -> Response {
    respond_with(StatusCode::OK, headers, caller, title, nav, here, body)
}

pub(crate) fn respond_with(
    status: StatusCode,
    headers: &HeaderMap,
    caller: &Caller,
    title: &str,
    nav: Nav,
    here: &str,
    body: &str,
) -> Response {
    let access = &caller.access;
    let flash = auth::take_flash(headers, caller.secure);
    let page =
        Page { title, nav, access: Some(access), flash: flash.as_ref().map(|(m, _)| m.as_str()), live: true, here };
    let mut response = html_response(status, page.render(body));
    if let Some((_, clear)) = flash {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    response
}

/// The page's own address, path and query, for the live region and sign-in's return.
pub(crate) fn here(uri: &axum::http::Uri) -> String {
    uri.path_and_query().map_or("/".into(), |pq| pq.as_str().to_owned())
}
