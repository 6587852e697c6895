//! One line for an error and all its sources, for logs and refusals: the useful part of a
//! client error ("Connection refused") is often in a source, not the error itself.

/// An error with its sources, on one line: reqwest's errors keep the useful part
/// ("Connection refused") in their sources.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
