//! What the monitor's test files share: a pipeline of its own in a temp dir (a SQLite store,
//! a local index and flock locks, named by `config/autocomp.toml` as a deployment names
//! them) with an operator over it, batch ids, and a GET through the router as a browser's
//! would arrive (its `Host` and the address it came from).

#![allow(dead_code)] // each test file uses what it needs

use std::net::SocketAddr;
use std::sync::Arc;

use autocomp_framework::config::Backends;
use autocomp_model::BatchId;
use autocomp_ops::operator::Operator;
use autocomp_store::ObjectStore;

/// An empty pipeline in a temp dir (removed when the dir is dropped), read and written by an
/// operator named `name` (`None`: the monitor's own, which acts for each signed-in account).
pub async fn temp_pipeline(name: Option<&str>) -> (Operator, Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("config")).unwrap();
    let shared = format!(
        "store = \"sqlite://{}\"\nindex = \"local:{}\"\nlocks = \"local:{}\"\n",
        root.join("store.db").display(),
        root.join("index").display(),
        root.join("locks").display()
    );
    std::fs::write(root.join("config/autocomp.toml"), shared).unwrap();
    let operator = Operator::new(&root.join("config"), Backends::default(), name.map(str::to_owned)).unwrap();
    let store = operator.store().await.unwrap();
    (operator, store, dir)
}

pub fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

/// `GET uri` through `router` from loopback, for host `monitor.test`: the status and the body.
pub async fn get(router: &axum::Router, uri: &str) -> (axum::http::StatusCode, String) {
    get_as(router, "monitor.test", [127, 0, 0, 1], uri).await
}

/// `GET uri` through `router` for `host`, from address `from`.
pub async fn get_as(router: &axum::Router, host: &str, from: [u8; 4], uri: &str) -> (axum::http::StatusCode, String) {
    use tower::ServiceExt;
    let mut request =
        axum::http::Request::get(uri).header(axum::http::header::HOST, host).body(axum::body::Body::empty()).unwrap();
    request.extensions_mut().insert(axum::extract::ConnectInfo(SocketAddr::from((from, 40_000))));
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}
