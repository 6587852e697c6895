//! An HTTP server a test starts with the routes it wants (a webhook receiver, an OTLP
//! collector): axum on a free loopback port, on a thread and runtime of its own so any test
//! can use it, stopped gracefully and joined when dropped.

use std::net::SocketAddr;

/// A running [`axum::Router`] on `127.0.0.1`; stops when dropped.
pub struct HttpReceiver {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpReceiver {
    /// Serves `app` on a free loopback port; returns once the port is bound.
    pub fn start(app: axum::Router) -> HttpReceiver {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the bound address");
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        stopped.await.ok();
                    })
                    .await
                    .expect("the receiver serves");
            });
        });
        HttpReceiver { addr, stop: Some(stop), thread: Some(thread) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        if let Some(thread) = self.thread.take() {
            thread.join().ok();
        }
    }
}
