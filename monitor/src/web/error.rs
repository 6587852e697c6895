//! What a request the monitor cannot answer as asked is: a status, a title and words (the
//! operator module's own where the error came from there), the field and value of bad
//! input, a way on. Plain data, apart from how it is shown (`error_page`), so that what
//! decides on access (`access`) can refuse without depending on the page layout.

use autocomp_framework::exit::UNREACHABLE;
use autocomp_model::InvalidInput;
use autocomp_ops::operator::OperatorError;
use axum::http::StatusCode;

/// A request the monitor cannot answer as asked: an HTML page with the status, in the
/// operator module's own words where it came from there. Nothing was changed.
#[derive(Debug)]
pub struct WebError(pub(super) Box<ErrorPage>);

#[derive(Debug)]
pub(super) struct ErrorPage {
    pub(super) status: StatusCode,
    pub(super) title: String,
    pub(super) words: String,
    pub(super) input: Option<InvalidInput>,
    pub(super) link: Option<(String, String)>,
}

impl WebError {
    pub fn new(status: StatusCode, title: &str, words: impl Into<String>) -> Self {
        WebError(Box::new(ErrorPage { status, title: title.into(), words: words.into(), input: None, link: None }))
    }

    /// 400 naming the field and the value. A field the operator module names as the CLI's
    /// flag (`--reason`) is the form's field (`reason`) here.
    pub fn invalid(mut input: InvalidInput) -> Self {
        if let Some(field) = input.field.strip_prefix("--") {
            input.field = field.replace('-', "_");
        }
        let mut error = Self::new(StatusCode::BAD_REQUEST, "Bad input", input.to_string());
        error.0.input = Some(input);
        error
    }

    /// A form (or a query) that could not be read, in plain words: 413 for a body over the
    /// limit, 400 (naming `what`) for anything else. Nothing was changed either way.
    pub fn unreadable(what: &str, status: StatusCode, detail: &str) -> Self {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::new(
                status,
                "Too big",
                format!("the {what} is larger than the {} KiB a {what} may be; nothing was changed", BODY_LIMIT >> 10),
            );
        }
        Self::invalid(InvalidInput::new(what, "", format!("could not be read ({detail}); nothing was changed")))
    }

    /// A way on from the error page.
    pub fn with_link(mut self, href: &str, label: &str) -> Self {
        self.0.link = Some((href.into(), label.into()));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.0.status
    }
}

impl From<OperatorError> for WebError {
    fn from(error: OperatorError) -> Self {
        match error {
            OperatorError::Input(input) => WebError::invalid(input),
            OperatorError::Refused(words) | OperatorError::AlreadyInState(words) => {
                WebError::new(StatusCode::CONFLICT, "Refused", words)
            }
            OperatorError::Run(run) => {
                let status = if run.code() == UNREACHABLE {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                let words = run.to_string();
                tracing::warn!(status = status.as_u16(), "{words}");
                WebError::new(status, "The pipeline cannot be read", words)
            }
            // An error this release of the operator does not have yet: the server's.
            other => WebError::new(StatusCode::INTERNAL_SERVER_ERROR, "The pipeline cannot be read", other.to_string()),
        }
    }
}

/// The largest request body the monitor reads (its forms are a few KiB).
pub const BODY_LIMIT: usize = 64 << 10;

impl From<InvalidInput> for WebError {
    fn from(input: InvalidInput) -> Self {
        WebError::invalid(input)
    }
}
