//! The HTTP plumbing every server double shares: a hyper 1 server bound to
//! `127.0.0.1:0`, JSON responses, bounded body reads and a clean shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// The response body type of every double.
pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body a double accepts.
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// A full body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A JSON response with the given status.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

/// A streaming body fed line by line through the returned sender.
pub fn streaming() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed())
}

/// Reads a request body, refusing more than [`MAX_BODY`] bytes.
pub async fn read_body(req: Request<Incoming>) -> Result<(http::request::Parts, Bytes), String> {
    let (parts, body) = req.into_parts();
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e) => Err(format!("reading request body: {e}")),
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `127.0.0.1:0` and serves every connection with `handler`.
    pub async fn start<H, F>(handler: H) -> std::io::Result<Self>
    where
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let handler = Arc::new(handler);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let handler = handler.clone();
                        conns.spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                let fut = handler(req);
                                async move { Ok::<_, Infallible>(fut.await) }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        });
        Ok(Self {
            addr,
            stop,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, closes every connection and waits for the tasks.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A plain-text 404.
pub fn not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(full("404 page not found\n"))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}
