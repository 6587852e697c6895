//! Recordings of what a release's service said, kept as test data so later releases are
//! held to it (store/tests/protocol.rs, sboi/tests/protocol.rs): the calls of a scenario,
//! recorded through a proxy in front of that release's service; a server that answers as a
//! recording says (an older service, for a newer client); and the comparison of an answer's
//! shape with a recorded one's (an older client, reading a newer service).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// One call as recorded: the operation, the request body, the answer's status and body.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Call {
    pub operation: String,
    pub request: Value,
    pub status: u16,
    pub answer: Value,
}

/// What a release said: its `GET /protocol` answer and the scenario's calls in order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Recording {
    pub release: String,
    pub protocol: Call,
    pub calls: Vec<Call>,
}

/// The shapes of two JSON answers differ (`Some(where)`): an object's keys, an array's
/// length, a value's JSON type.
pub fn shape_difference(recorded: &Value, now: &Value, at: &str) -> Option<String> {
    match (recorded, now) {
        (Value::Object(a), Value::Object(b)) => {
            let (keys_a, keys_b): (Vec<&String>, Vec<&String>) = (a.keys().collect(), b.keys().collect());
            if keys_a != keys_b {
                return Some(format!("{at}: keys {keys_a:?} recorded, {keys_b:?} now"));
            }
            a.iter().find_map(|(key, value)| shape_difference(value, &b[key], &format!("{at}.{key}")))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(n, (x, y))| shape_difference(x, y, &format!("{at}[{n}]")))
        }
        (Value::Array(a), Value::Array(b)) => Some(format!("{at}: {} items recorded, {} now", a.len(), b.len())),
        (Value::Number(_), Value::Number(_))
        | (Value::String(_), Value::String(_))
        | (Value::Bool(_), Value::Bool(_))
        | (Value::Null, Value::Null) => None,
        _ => Some(format!("{at}: {recorded} recorded, {now} now")),
    }
}

/// A server that answers as a recording says: `GET /protocol` as recorded, each `POST
/// /v1/<op>` with the next recorded call's answer, provided it is that operation.
pub struct Replay {
    pub calls: Mutex<VecDeque<Call>>,
    pub protocol: Call,
    /// The operations asked, in order.
    pub asked: Mutex<Vec<String>>,
}

impl Replay {
    pub fn new(protocol: Call, calls: impl IntoIterator<Item = Call>) -> Arc<Replay> {
        Arc::new(Replay { calls: Mutex::new(calls.into_iter().collect()), protocol, asked: Mutex::default() })
    }
}

pub async fn replay_server(replay: Arc<Replay>) -> SocketAddr {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/protocol",
            get(|State(replay): State<Arc<Replay>>| async move {
                let status = StatusCode::from_u16(replay.protocol.status).unwrap();
                (status, axum::Json(replay.protocol.answer.clone())).into_response()
            }),
        )
        .route(
            "/v1/{operation}",
            post(|State(replay): State<Arc<Replay>>, UrlPath(operation): UrlPath<String>| async move {
                replay.asked.lock().unwrap().push(operation.clone());
                let next = replay.calls.lock().unwrap().pop_front();
                match next {
                    Some(call) if call.operation == operation => {
                        let status = StatusCode::from_u16(call.status).unwrap();
                        (status, axum::Json(call.answer)).into_response()
                    }
                    other => {
                        let expected = other.map_or("nothing".to_owned(), |call| call.operation);
                        let error = json!({"error": {"kind": "replay", "message": format!("{operation} asked, {expected} recorded")}});
                        (StatusCode::IM_A_TEAPOT, axum::Json(error)).into_response()
                    }
                }
            }),
        )
        .with_state(replay);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// A proxy to `upstream` that records each `POST /v1/<op>` and its answer.
pub async fn recording_proxy(upstream: String, token: &'static str, recorded: Arc<Mutex<Vec<Call>>>) -> SocketAddr {
    use axum::body::Bytes;
    use axum::extract::{Path as UrlPath, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    type Proxy = (String, Arc<Mutex<Vec<Call>>>);
    let app =
        axum::Router::new()
            .route(
                "/protocol",
                axum::routing::get(|State((upstream, _)): State<Proxy>| async move {
                    let url = format!("{upstream}/protocol");
                    let (status, body) =
                        tokio::task::spawn_blocking(move || crate::http1::get(&url)).await.unwrap().unwrap();
                    (StatusCode::from_u16(status).unwrap(), body).into_response()
                }),
            )
            .route(
                "/v1/{operation}",
                axum::routing::post(
                    move |State((upstream, recorded)): State<Proxy>,
                          UrlPath(operation): UrlPath<String>,
                          body: Bytes| async move {
                        let url = format!("{upstream}/v1/{operation}");
                        let sent = body.to_vec();
                        let (status, answer) =
                            tokio::task::spawn_blocking(move || crate::http1::post(&url, Some(token), &sent))
                                .await
                                .unwrap();
                        let request = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        recorded.lock().unwrap().push(Call { operation, request, status, answer: answer.clone() });
                        (StatusCode::from_u16(status).unwrap(), axum::Json(answer)).into_response()
                    },
                ),
            )
            .with_state((upstream, recorded));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// A recording, read from its file.
pub fn read(path: &Path) -> Recording {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Writes a recording to its file.
pub fn write(path: &Path, recording: &Recording) {
    let text = serde_json::to_string_pretty(recording).expect("a recording serializes") + "\n";
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A service's `GET /protocol` answer, as a recorded call (404 before protocol 2).
pub fn protocol_of(base: &str) -> Call {
    let (status, body) = crate::http1::get(&format!("{base}/protocol")).expect("the service answers");
    let answer = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Call { operation: "protocol".into(), request: Value::Null, status, answer }
}

/// Sends each recorded request, as recorded, to the service at `base` and checks that its
/// answer has the recorded status and shape: an older client against this service. An
/// operation the recorded service did not know may be answered now.
pub async fn replay_requests(name: &str, recording: &Recording, base: &str, token: &'static str) {
    for (n, call) in recording.calls.iter().enumerate() {
        let url = format!("{base}/v1/{}", call.operation);
        let body = serde_json::to_vec(&call.request).expect("a recorded request serializes");
        let (status, answer) =
            tokio::task::spawn_blocking(move || crate::http1::post(&url, Some(token), &body)).await.expect("posted");
        if call.answer["error"]["kind"] == "unknown_operation" {
            assert_eq!(status, 200, "{name} #{n} {}: offered now: {answer}", call.operation);
            continue;
        }
        assert_eq!(status, call.status, "{name} #{n} {}: {answer}", call.operation);
        if let Some(difference) = shape_difference(&call.answer, &answer, &call.operation) {
            panic!("{name} #{n}: {difference}");
        }
    }
}
