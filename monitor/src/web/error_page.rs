//! How a `WebError` is shown: an HTML page with the status, the words, the field and value
//! of bad input and a way on; and the answers for an address or a method nobody serves.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error::WebError;
use super::html::{Nav, Page, code_spans, esc, html_response, w};

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let error = *self.0;
        let mut body = String::new();
        w!(body, "<h1>{}</h1>\n<p class=\"error\">{}</p>\n", esc(&error.title), code_spans(&error.words));
        if let Some(input) = &error.input {
            w!(
                body,
                "<dl class=\"facts\"><dt>Field</dt><dd><code>{}</code></dd><dt>Value</dt><dd><code>{}</code></dd>\
                 <dt>Why</dt><dd>{}</dd></dl>\n",
                esc(&input.field),
                esc(&input.value),
                code_spans(&input.reason)
            );
        }
        if error.status.is_client_error() && error.status != StatusCode::NOT_FOUND {
            body.push_str("<p>Nothing was changed.</p>\n");
        }
        if let Some((href, label)) = &error.link {
            w!(body, "<p><a href=\"{}\">{}</a></p>\n", esc(href), esc(label));
        }
        body.push_str("<p><a href=\"/\">Back to the overview</a></p>\n");
        let page = Page { title: &error.title, nav: Nav::None, access: None, flash: None, live: false, here: "/" };
        html_response(error.status, page.render(&body))
    }
}

pub(super) async fn not_found(uri: axum::http::Uri) -> WebError {
    WebError::new(StatusCode::NOT_FOUND, "Not found", format!("nothing here: {}", uri.path()))
}

pub(super) async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> WebError {
    WebError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}
