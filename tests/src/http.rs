//! The HTTP plumbing every server double shares: the shared test server
//! (bound to `127.0.0.1:0`, stopped cleanly), JSON responses and bounded
//! body reads.

use std::convert::Infallible;

use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio::sync::mpsc;

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

/// A running server: the shared loopback test server of
/// `mountguard-serve` (feature `test-server`).
pub use mountguard_serve::test_server::TestServer as Server;

/// A plain-text 404.
pub fn not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(full("404 page not found\n"))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}
