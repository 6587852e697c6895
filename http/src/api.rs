//! One declaration per remote operation (`operations!`): its name, whether it writes, its
//! summary, its request and its answer. From it come the typed request a service dispatches
//! on, the typed client call and the service's OpenAPI document, so they cannot drift apart.

use std::marker::PhantomData;

use axum::Json;
use axum::response::{IntoResponse, Response};
use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ErrorBody};

// For `operations!`, which names them from the crates that use it.
#[doc(hidden)]
pub use axum::body::Bytes;
#[doc(hidden)]
pub use axum::extract::rejection::BytesRejection;

/// One remote operation: `POST /v1/<NAME>` with a `Request` body, answered with an `Answer`.
pub trait Operation {
    const NAME: &'static str;
    /// Writes need the bearer token; reads only from outside loopback.
    const WRITE: bool;
    type Request: Serialize + DeserializeOwned + JsonSchema + Send + Sync;
    type Answer: Serialize + DeserializeOwned + JsonSchema + Send;
}

/// The one way to answer a request: with its own operation's answer type, so a dispatch
/// arm cannot send another operation's body.
pub struct Reply<A>(PhantomData<fn(A)>);

impl<A: Serialize> Reply<A> {
    #[doc(hidden)] // made by `operations!` only
    pub fn new() -> Self {
        Reply(PhantomData)
    }

    pub fn send(self, answer: A) -> Answered {
        Answered(Json(answer).into_response())
    }
}

impl<A: Serialize> Reply<A> {
    /// Answers with `A`'s JSON text written piece by piece as the service reads it, for an
    /// answer too large to hold whole: each piece is sent before more than `PIECES_AHEAD`
    /// wait, so the service holds about one piece per reader whatever the answer's size. The
    /// status (200) goes first, so whatever can refuse the request must be decided before;
    /// a failure after it cuts the body short (`Pieces::fail`), which a client reads as an
    /// error, never as a shorter answer. The pieces must make exactly `A`'s JSON.
    pub fn stream(self) -> (Pieces, Answered) {
        let (sender, receiver) = tokio::sync::mpsc::channel(PIECES_AHEAD);
        let body = axum::body::Body::new(Streamed(receiver));
        let response = ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response();
        (Pieces(sender), Answered(response))
    }
}

/// Pieces of a streamed answer sent but not yet written to the client (`Reply::stream`).
const PIECES_AHEAD: usize = 2;

/// The writing end of a streamed answer (`Reply::stream`).
pub struct Pieces(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Pieces {
    /// Sends the answer's next piece, waiting while the client has not taken the earlier
    /// ones. False once the client has gone: stop reading.
    pub async fn send(&self, piece: Vec<u8>) -> bool {
        self.0.send(Ok(Bytes::from(piece))).await.is_ok()
    }

    /// Cuts the answer short: its body ends in an error (the connection is closed without
    /// the last chunk), so the client cannot take what was sent for a whole answer.
    pub async fn fail(self, why: String) {
        let _ = self.0.send(Err(std::io::Error::other(why))).await;
    }
}

/// The body of a streamed answer: what `Pieces` sends, as it comes.
struct Streamed(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|piece| piece.map(|piece| piece.map(hyper::body::Frame::data)))
    }
}

/// A request answered (see `Reply`).
pub struct Answered(pub(crate) Response);

/// What the OpenAPI document says of one operation (made by `operations!`).
pub struct Described {
    pub name: &'static str,
    pub write: bool,
    /// The declaration's doc comment, a line each.
    pub doc: &'static [&'static str],
    pub request: fn(&mut SchemaGenerator) -> Schema,
    pub answer: fn(&mut SchemaGenerator) -> Schema,
}

/// A service's typed request, one variant per operation (made by `operations!`).
pub trait Requests: Sized + Send + 'static {
    /// Every operation, in declaration order.
    const OPERATIONS: &'static [Described];
    /// Reads `operation`'s body; `None` when no operation has that name.
    fn parse(operation: &str, body: Result<Bytes, BytesRejection>) -> Option<Result<Self, ApiError>>;
}

/// Declares a service's operations. Each line,
/// `/// summary` `read|write name: Variant(Request) -> Answer;`, gives a variant
/// `Variant(Request, Reply<Answer>)` of the request enum, and a marker type
/// `module::Variant` implementing `Operation` for the client's `HttpClient::call`.
///
/// A write says whether it wakes the service's long polls: `write(wakes)` (what `write`
/// means) or `write(quiet)` (it moves nothing a reader waits for); `Requests::wakes` answers
/// it. With `serving Context` after the module, each line ends in how it is answered,
/// `= |context, request, reply| answer`, and the enum gets `serve(self, &impl Context)`: the
/// service's whole dispatch, generated from the declarations.
#[macro_export]
macro_rules! operations {
    (
        $(#[$meta:meta])*
        $vis:vis enum $requests:ident in mod $module:ident serving $context:path {
            $(
                $(#[doc = $doc:literal])*
                $access:ident $( ( $effect:ident ) )? $name:ident : $variant:ident ( $request:ty ) -> $answer:ty
                    = | $served:ident , $body:pat , $reply:ident | $serve:expr ;
            )*
        }
    ) => {
        $crate::operations! {
            $(#[$meta])*
            $vis enum $requests in mod $module {
                $( $(#[doc = $doc])* $access $( ( $effect ) )? $name : $variant ( $request ) -> $answer ; )*
            }
        }

        impl $requests {
            /// Answers the request as its declaration says.
            pub async fn serve<C: $context + ?Sized>(
                self,
                context: &C,
            ) -> Result<$crate::api::Answered, $crate::error::ApiError> {
                Ok(match self {
                    $( Self::$variant($body, $reply) => {
                        let $served = context;
                        $serve
                    } )*
                })
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $requests:ident in mod $module:ident {
            $(
                $(#[doc = $doc:literal])*
                $access:ident $( ( $effect:ident ) )? $name:ident : $variant:ident ( $request:ty ) -> $answer:ty ;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis enum $requests {
            $( $(#[doc = $doc])* $variant($request, $crate::api::Reply<$answer>), )*
        }

        /// One marker type per operation, naming it in a client's call.
        $vis mod $module {
            $(
                $(#[doc = $doc])*
                pub struct $variant;
            )*
        }

        $(
            impl $crate::api::Operation for $module::$variant {
                const NAME: &'static str = stringify!($name);
                const WRITE: bool = $crate::operations!(@write $access);
                type Request = $request;
                type Answer = $answer;
            }
        )*

        impl $requests {
            /// Whether the request writes (needs the token).
            pub fn writes(&self) -> bool {
                match self {
                    $( Self::$variant(..) => $crate::operations!(@write $access), )*
                }
            }

            /// Whether answering the request wakes the long polls (`write(wakes)`).
            pub fn wakes(&self) -> bool {
                match self {
                    $( Self::$variant(..) => $crate::operations!(@wakes $access $($effect)?), )*
                }
            }
        }

        impl $crate::api::Requests for $requests {
            const OPERATIONS: &'static [$crate::api::Described] = &[
                $(
                    $crate::api::Described {
                        name: stringify!($name),
                        write: $crate::operations!(@write $access),
                        doc: &[$($doc),*],
                        request: |generator| generator.subschema_for::<$request>(),
                        answer: |generator| generator.subschema_for::<$answer>(),
                    },
                )*
            ];

            fn parse(
                operation: &str,
                body: Result<$crate::api::Bytes, $crate::api::BytesRejection>,
            ) -> Option<Result<Self, $crate::error::ApiError>> {
                Some(match operation {
                    $(
                        stringify!($name) => $crate::error::parse_body(body)
                            .map(|request| Self::$variant(request, $crate::api::Reply::new())),
                    )*
                    _ => return None,
                })
            }
        }
    };
    (@write read) => { false };
    (@write write) => { true };
    (@wakes read) => { false };
    (@wakes write) => { true };
    (@wakes write wakes) => { true };
    (@wakes write quiet) => { false };
}

/// What a service's OpenAPI document says beyond its operations.
pub struct ApiDoc {
    pub title: &'static str,
    pub description: &'static str,
    /// The address a default install listens on.
    pub server: &'static str,
    /// The error statuses every operation may answer besides 401, and when.
    pub errors: &'static [(u16, &'static str)],
    /// `GET /health`: what it says, its answer when up, and when it answers 503.
    pub health: &'static str,
    pub health_answer: fn(&mut SchemaGenerator) -> Schema,
    pub health_unavailable: &'static str,
    /// `GET /metrics`: what it exposes.
    pub metrics: &'static str,
}

/// What `/health` answers (503) while a service waits for its upstream after starting.
#[derive(Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Starting {
    /// Always `starting`.
    pub status: &'static str,
    /// What it waits for, e.g. `the store http://10.0.0.5:7070`.
    pub waiting_for: String,
    /// How long it has waited.
    pub waiting_seconds: u64,
    /// How many times it has tried the upstream.
    pub attempts: u64,
    /// What the last try said.
    pub last_error: String,
}

/// The OpenAPI 3.1 document of a service with `operations`.
pub fn openapi(api: &ApiDoc, operations: &[Described]) -> Value {
    // Requests as the service reads them, answers as it writes them: a field with a
    // default is optional in a request but always present in an answer.
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "#/components/schemas".into();
        s.meta_schema = None;
    });
    let mut reads = SchemaGenerator::new(settings.clone().for_deserialize());
    let mut writes = SchemaGenerator::new(settings.for_serialize());
    let requests: Vec<Value> = operations.iter().map(|op| (op.request)(&mut reads).to_value()).collect();
    let mut answers: Vec<Value> = operations.iter().map(|op| (op.answer)(&mut writes).to_value()).collect();
    let mut error = writes.subschema_for::<ErrorBody>().to_value();
    let mut starting = writes.subschema_for::<Starting>().to_value();
    let mut health = (api.health_answer)(&mut writes).to_value();
    let mut written: Vec<&mut Value> = answers.iter_mut().collect();
    written.extend([&mut error, &mut starting, &mut health]);
    let schemas = merge(reads.take_definitions(true), writes.take_definitions(true), &mut written);

    let mut paths = Map::new();
    for ((operation, request), answer) in operations.iter().zip(requests).zip(answers) {
        let mut responses = Map::new();
        responses.insert("200".into(), content("done", answer));
        let unauthorized = if operation.write {
            "missing or wrong bearer token"
        } else {
            "a read from outside loopback without the token (or with --reads-need-token)"
        };
        responses.insert("401".into(), content(unauthorized, error.clone()));
        for (status, _) in api.errors {
            responses.insert(status.to_string(), json!({"$ref": format!("#/components/responses/E{status}")}));
        }
        let security = if operation.write { json!([{"bearer": []}]) } else { json!([{}, {"bearer": []}]) };
        let summary = operation.doc.iter().map(|line| line.trim()).collect::<Vec<_>>().join(" ");
        let post = json!({
            "operationId": operation.name,
            "summary": summary,
            "requestBody": {"required": true, "content": {"application/json": {"schema": request}}},
            "responses": responses,
            "security": security,
        });
        paths.insert(format!("/v1/{}", operation.name), json!({ "post": post }));
    }
    let health = json!({"get": {
        "operationId": "health",
        "summary": api.health,
        "responses": {
            "200": content("up", health),
            "503": content(api.health_unavailable, json!({"oneOf": [error, starting]})),
        },
    }});
    paths.insert("/health".into(), health);
    let metrics = json!({"get": {
        "operationId": "metrics",
        "summary": api.metrics,
        "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}},
    }});
    paths.insert("/metrics".into(), metrics);
    let openapi = json!({"get": {
        "operationId": "openapi",
        "summary": "This document.",
        "responses": {"200": content("OpenAPI 3.1", json!({"type": "object"}))},
    }});
    paths.insert("/openapi.json".into(), openapi);
    let responses: Map<String, Value> = api
        .errors
        .iter()
        .map(|(status, description)| (format!("E{status}"), content(description, error.clone())))
        .collect();
    json!({
        "openapi": "3.1.0",
        "info": {"title": api.title, "version": "1", "description": api.description},
        "servers": [{"url": api.server}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    })
}

fn content(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

/// The suffix of a type's name as answers write it, where that differs from how requests
/// read it (a field with a default may be left out of a request, never out of an answer).
const WRITTEN: &str = "InAnswer";

/// One set of schemas from both contracts. A type written differently from how it is read
/// is kept under both names, `Name` and `NameInAnswer`, and `written` (the answers' own
/// schemas) is changed to refer to the second.
fn merge(mut reads: Map<String, Value>, writes: Map<String, Value>, written: &mut [&mut Value]) -> Map<String, Value> {
    // A type that refers to a renamed one is renamed too: repeat until nothing changes.
    let mut renamed = std::collections::BTreeSet::new();
    loop {
        let before = renamed.len();
        for (name, schema) in &writes {
            let mut schema = schema.clone();
            rename_refs(&mut schema, &renamed);
            if reads.get(name).is_some_and(|read| *read != schema) {
                renamed.insert(name.clone());
            }
        }
        if renamed.len() == before {
            break;
        }
    }
    for value in written.iter_mut() {
        rename_refs(value, &renamed);
    }
    for (name, mut schema) in writes {
        rename_refs(&mut schema, &renamed);
        let name = if renamed.contains(&name) { format!("{name}{WRITTEN}") } else { name };
        reads.insert(name, schema);
    }
    reads
}

fn rename_refs(value: &mut Value, renamed: &std::collections::BTreeSet<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(reference)) = object.get_mut("$ref")
                && let Some(name) = reference.strip_prefix(SCHEMAS)
                && renamed.contains(name)
            {
                *reference = format!("{SCHEMAS}{name}{WRITTEN}");
            }
            object.values_mut().for_each(|value| rename_refs(value, renamed));
        }
        Value::Array(items) => items.iter_mut().for_each(|value| rename_refs(value, renamed)),
        _ => {}
    }
}

const SCHEMAS: &str = "#/components/schemas/";
