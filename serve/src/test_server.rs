//! (feature `test-server`) The one plain HTTP/1.1 server of the tests and
//! the test doubles: bound to `127.0.0.1:0` (or a given address), every connection served with
//! one handler, stopped by [`TestServer::shutdown`] (or on drop). None of
//! the production limits of [`serve`](crate::serve): a test server talks
//! to the code under test only.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running test server.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Binds `127.0.0.1:0` and serves every connection with `handler`
    /// until [`TestServer::shutdown`] or drop.
    pub async fn start<H, F, B>(handler: H) -> std::io::Result<Self>
    where
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), handler).await
    }

    /// [`TestServer::start`] on `addr` (a program under test that has a
    /// fixed port needs it, on an address of its own).
    pub async fn start_on<H, F, B>(addr: SocketAddr, handler: H) -> std::io::Result<Self>
    where
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let listener = TcpListener::bind(addr).await?;
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
                            let _ = http1::Builder::new()
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

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Empty, Full};
    use hyper::body::Bytes;

    use super::*;

    async fn get(addr: SocketAddr) -> Result<String, String> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let resp = send
            .send_request(Request::get("/x").body(Empty::<Bytes>::new()).unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Ok(String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn serves_the_handler_until_shut_down() {
        let mut server = TestServer::start(|req: Request<Incoming>| async move {
            Response::new(Full::new(Bytes::from(req.uri().path().to_string())))
        })
        .await
        .unwrap();
        assert_eq!(server.url(), format!("http://{}", server.addr()));
        assert_eq!(get(server.addr()).await.unwrap(), "/x");
        let addr = server.addr();
        server.shutdown().await;
        assert!(get(addr).await.is_err(), "still serving after shutdown");
    }
}
