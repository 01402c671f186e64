//! The one HTTP/1.1 accept loop of mountguard's servers (the controller's
//! report API and metrics/status port, the agent's metrics/health port),
//! bounded against slow, idle and numerous clients:
//!
//! - a header-read timeout, kept here per connection (hyper's own
//!   `header_read_timeout`, off, treats every connection alike): a request
//!   head must be complete within it from the moment the connection waits
//!   for one (after the handshake, and after each answer), so an idle or
//!   trickling connection is closed. Once the service [`Standing::vouch`]ed
//!   for a request, its connection may wait between requests as long as
//!   the idle timeout allows (an agent's kept-alive connection survives
//!   the gap between two heartbeats and costs no new TLS handshake), and
//!   the header-read timeout runs from the first byte of the next head (a
//!   head begun before the answer: from the answer);
//! - an idle timeout: a connection that moves no byte in either direction
//!   for that long is closed, whatever it is doing (a stalled body, a
//!   client that never reads its answer, a vouched connection waiting
//!   longer than that for its next request);
//! - a cap on open connections, and on the connections one source address
//!   holds that no request was vouched for ([`Limits::per_source`]): a
//!   newcomer over either takes the place of a connection worth less, or
//!   is closed at once, before anything is read from it. One rule for
//!   every listener (`registry.rs`): a connection is proven once a
//!   complete request head arrived on it (a kubelet probe, a scrape, a
//!   webhook call), vouched for once the service says who sent it
//!   ([`Standing::vouch`]), demoted once refused ([`Standing::demote`]).
//!   An address over its own limit sheds its own connections (demoted,
//!   then the oldest unproven, then the oldest proven); at the cap the
//!   oldest demoted one goes, else the oldest unproven one from the
//!   newcomer's own address, else (only for an address with none) the
//!   oldest unproven one from any. A proven or vouched connection is never
//!   shed for another address: a flood of idle sockets from one address
//!   holds at most its share, and a probe or a webhook call that sends its
//!   head gets in and is answered;
//! - a limit on the connections one identity holds
//!   ([`Limits::per_identity`], counted by [`Standing::vouch`]);
//! - a small read buffer (`max_buf_size`), which bounds the request head;
//! - a vouched connection parked between requests: hyper's connection and
//!   its buffers are let go once an answer is flushed, and a new one is
//!   started on the stream when the next request's first byte arrives
//!   ([`ServeMetrics::parked`]);
//! - a bounded handshake (TLS) and a bounded graceful drain at shutdown;
//! - accept errors (e.g. `EMFILE`) logged at most once per
//!   [`ACCEPT_ERROR_LOG_EVERY`], with the count of those not logged.
//!
//! [`raise_nofile_limit`] raises `RLIMIT_NOFILE` to its hard limit; both
//! binaries call it at start.
//!
//! With the feature `test-server`, [`test_server::TestServer`] is the one
//! plain loopback server of the tests and the test doubles, and
//! [`test_flood::Flood`] the idle-socket flood of the listeners' tests.

mod registry;
#[cfg(any(test, feature = "test-server"))]
pub mod test_flood;
#[cfg(feature = "test-server")]
pub mod test_server;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use registry::{Admitted, Registry};

/// At most one accept error is logged per this period.
pub const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `getrlimit`/`setrlimit` failed.
    #[error("cannot raise the open file limit (RLIMIT_NOFILE): {0}")]
    Rlimit(nix::errno::Errno),
}

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest wait for a complete request head: from the handshake, or
    /// from the previous answer on a kept-alive connection no request was
    /// vouched for; on one a request was vouched for, from the first byte
    /// of the next head.
    pub header_read_timeout: Duration,
    /// Longest time a connection may move no byte at all.
    pub idle_timeout: Duration,
    /// Longest TLS (or other) handshake.
    pub handshake_timeout: Duration,
    /// Open connections at most; a newcomer over it takes the place of a
    /// demoted or unproven connection, or is closed at once.
    pub max_connections: usize,
    /// Connections one source address may hold that no request was
    /// vouched for (unproven, proven or demoted); a newcomer over it takes
    /// the place of one of its address's own. 0: no limit.
    pub per_source: usize,
    /// hyper's read buffer limit, which bounds a request head (at least
    /// 8192, hyper's minimum).
    pub max_buf_size: usize,
    /// Header fields per request at most.
    pub max_headers: usize,
    /// How long open connections may finish after shutdown starts.
    pub drain: Duration,
    /// Connections one identity may hold that a request vouched for
    /// ([`Standing::vouch`]); 0: no limit.
    pub per_identity: usize,
}

impl Limits {
    /// Defaults for a small internal port (metrics, health).
    pub fn small() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 256,
            per_source: 128,
            max_buf_size: 16 * 1024,
            max_headers: 64,
            drain: Duration::from_secs(5),
            per_identity: 0,
        }
    }

    /// The cap lowered so that it fits in `fds` descriptors with `reserve`
    /// kept for everything else (never below 1), and
    /// [`Limits::per_source`], when set, to at most half of it (never
    /// below 1), so one address never fills the cap.
    pub fn fit_in(mut self, fds: u64, reserve: u64) -> Self {
        let room = fds.saturating_sub(reserve).max(1);
        self.max_connections = self.max_connections.min(room as usize).max(1);
        if self.per_source > 0 {
            self.per_source = self.per_source.min(self.max_connections / 2).max(1);
        }
        self
    }
}

/// Counters a caller may register in its metrics.
#[derive(Debug, Clone)]
pub struct ServeMetrics {
    /// Open connections (`{listener}`).
    pub open: prometheus::IntGauge,
    /// Connections closed at once, or in a newcomer's place, at the cap
    /// or at an address's [`Limits::per_source`].
    pub shed: prometheus::IntCounter,
    /// Connections closed by the header-read or idle timeout, or a
    /// handshake timeout.
    pub timed_out: prometheus::IntCounter,
    /// Open connections parked: waiting for their next request with no
    /// HTTP buffers held (see [`serve`]).
    pub parked: prometheus::IntGauge,
}

impl ServeMetrics {
    /// Metrics not registered anywhere (tests, benchmarks).
    pub fn unregistered() -> Self {
        Self {
            open: prometheus::IntGauge::new("open", "open").expect("valid"),
            shed: prometheus::IntCounter::new("shed", "shed").expect("valid"),
            timed_out: prometheus::IntCounter::new("timed_out", "timed out").expect("valid"),
            parked: prometheus::IntGauge::new("parked", "parked").expect("valid"),
        }
    }
}

/// The standing of the connection a request came on (a request extension
/// set by [`serve`]): the service tells the accept loop what the request
/// proved, which decides what is shed when the cap is reached and how long
/// the connection may wait for its next request.
#[derive(Debug, Clone)]
pub struct Standing {
    registry: Arc<Mutex<Registry>>,
    id: u64,
    per_identity: usize,
    clock: Arc<HeadClock>,
}

impl Standing {
    /// The request proved its client to be `identity` (e.g. an
    /// authenticated node): the connection is kept over newcomers, and
    /// between requests it waits under the idle timeout, not the
    /// header-read timeout. Returns false, and demotes the connection
    /// instead, when `identity` already holds [`Limits::per_identity`]
    /// vouched connections.
    pub fn vouch(&self, identity: &str) -> bool {
        let ok = self
            .registry
            .lock()
            .unwrap()
            .vouch(self.id, identity, self.per_identity);
        self.clock.set_vouched(ok);
        ok
    }

    /// A complete request head arrived: an unproven connection is proven
    /// (kept over unproven ones; see `registry.rs`).
    fn prove(&self) {
        self.registry.lock().unwrap().prove(self.id);
    }

    /// The request was refused: the connection is the first to be shed,
    /// and waits for its next request under the header-read timeout again.
    pub fn demote(&self) {
        self.registry.lock().unwrap().demote(self.id);
        self.clock.set_vouched(false);
    }
}

/// When a connection waits for a request head, and since when (the
/// header-read timeout of [`serve`]), and whether it may be parked.
#[derive(Debug)]
struct HeadClock {
    epoch: Instant,
    /// Requests handed to the service whose answer (body included) is not
    /// done yet.
    in_flight: AtomicU64,
    /// Answers done (each answer's body finished or dropped).
    answered: AtomicU64,
    /// An answer was done and the stream has not been flushed since.
    unflushed: AtomicBool,
    /// The last request's body was not read to its end (yet).
    body_unread: AtomicBool,
    /// Milliseconds after `epoch` when the connection began waiting for
    /// the next request head (the handshake's end, the last answer).
    waiting_since: AtomicU64,
    /// Milliseconds after `epoch` of the first byte read while waiting
    /// ([`NOT_YET`]: none).
    head_started: AtomicU64,
    /// The last request was vouched for.
    vouched: AtomicBool,
    changed: tokio::sync::Notify,
}

const NOT_YET: u64 = u64::MAX;

impl HeadClock {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            unflushed: AtomicBool::new(false),
            body_unread: AtomicBool::new(false),
            waiting_since: AtomicU64::new(0),
            head_started: AtomicU64::new(NOT_YET),
            vouched: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// The connection waits for a head from now.
    fn wait(&self) {
        self.head_started.store(NOT_YET, Ordering::Relaxed);
        self.waiting_since.store(self.ms(), Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// A request head was handed to the service; `body_done`: it has no
    /// body to read.
    fn request_started(&self, body_done: bool) {
        self.body_unread.store(!body_done, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// The request's body was read to its end.
    fn body_read(&self) {
        self.body_unread.store(false, Ordering::Relaxed);
    }

    /// The answer to a request is done: its body finished or was dropped
    /// (or the service failed or was dropped).
    fn request_done(&self) {
        self.wait();
        self.unflushed.store(true, Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// The stream was flushed: hyper flushes its stream only once its own
    /// write buffer is empty (hyper `src/proto/h1/io.rs`,
    /// `Buffered::poll_flush`).
    fn flushed(&self) {
        self.unflushed.store(false, Ordering::Relaxed);
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Bytes were read: the first while waiting starts the next head.
    fn read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started.load(Ordering::Relaxed) == NOT_YET
            && self
                .head_started
                .compare_exchange(NOT_YET, self.ms(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.changed.notify_waiters();
        }
    }

    /// Bytes of the next head, read while the last request was served,
    /// are handed to a new HTTP connection: that head started no later
    /// than the answer, so it is due a header-read timeout after the
    /// connection began waiting for it (those bytes came through no read
    /// of the stream that [`HeadClock::read`] would see).
    fn head_carried_over(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let since = self.waiting_since.load(Ordering::Relaxed);
            let _ = self.head_started.compare_exchange(
                NOT_YET,
                since,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.changed.notify_waiters();
        }
    }

    fn set_vouched(&self, v: bool) {
        self.vouched.store(v, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// Whether the connection's HTTP state may be let go while it waits
    /// for its next request: the last request was vouched for, its body
    /// read to the end, an answer was done since `answered_before` and
    /// flushed, nothing is being served, and no byte of a next head has
    /// been read since. hyper is then between two messages: everything it
    /// read is either consumed or the start of the next head, which it
    /// hands back (`Parts::read_buf`).
    fn parkable(&self, answered_before: u64) -> bool {
        self.vouched.load(Ordering::Relaxed)
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self.answered() > answered_before
            && !self.unflushed.load(Ordering::Relaxed)
            && !self.body_unread.load(Ordering::Relaxed)
            && self.head_started.load(Ordering::Relaxed) == NOT_YET
    }

    /// When the head being waited for is overdue; `None`: no head is due
    /// (a request is being served, or a vouched connection waits with
    /// nothing read yet).
    fn deadline(&self, header_read: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if !self.vouched.load(Ordering::Relaxed) {
            return Some(self.at(self.waiting_since.load(Ordering::Relaxed)) + header_read);
        }
        match self.head_started.load(Ordering::Relaxed) {
            NOT_YET => None,
            ms => Some(self.at(ms) + header_read),
        }
    }
}

/// Resolves once a request head is overdue (see [`HeadClock::deadline`]).
async fn head_overdue(clock: Arc<HeadClock>, header_read: Duration) {
    loop {
        let changed = clock.changed.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        match clock.deadline(header_read) {
            Some(d) if Instant::now() >= d => return,
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep_until(d.into()) => {}
                    () = changed => {}
                }
            }
            None => changed.await,
        }
    }
}

/// The body of a request as [`serve`]'s services get it: hyper's
/// [`Incoming`], which tells the connection when it was read to its end
/// (a connection whose last request body was not is never parked).
#[derive(Debug)]
pub struct RequestBody {
    inner: Incoming,
    clock: Option<Arc<HeadClock>>,
}

impl RequestBody {
    fn new(inner: Incoming, clock: Arc<HeadClock>) -> Self {
        let mut b = Self {
            inner,
            clock: Some(clock),
        };
        b.read_if(b.inner.is_end_stream());
        b
    }

    /// Tells the connection, once, that the body was read to its end when
    /// `end`.
    fn read_if(&mut self, end: bool) {
        if end && let Some(c) = self.clock.take() {
            c.body_read();
        }
    }
}

impl Body for RequestBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => self.read_if(true),
            Poll::Ready(Some(Ok(_))) => {
                let end = self.inner.is_end_stream();
                self.read_if(end);
            }
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A service that hands each request its connection's [`Standing`] and
/// tells the connection's [`HeadClock`] while a request is served and
/// answered.
#[derive(Debug, Clone)]
struct WithStanding<S> {
    inner: S,
    standing: Standing,
}

impl<S, B, E> Service<http::Request<Incoming>> for WithStanding<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<B>, Error = E>,
{
    type Response = http::Response<Answer<B>>;
    type Error = E;
    type Future = Served<S::Future>;
    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let clock = self.standing.clock.clone();
        clock.request_started(req.body().is_end_stream());
        self.standing.prove();
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(self.standing.clone());
        let req = http::Request::from_parts(parts, RequestBody::new(body, clock.clone()));
        Served {
            inner: Box::pin(self.inner.call(req)),
            done: Some(Done(clock)),
        }
    }
}

/// Tells the connection's clock, when dropped, that a request is done.
struct Done(Arc<HeadClock>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A request being served: its answer's body carries the [`Done`] on (see
/// [`Answer`]); a failed or dropped request is done at once.
struct Served<F> {
    inner: Pin<Box<F>>,
    done: Option<Done>,
}

impl<F, B, E> Future for Served<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Answer<B>>, E>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(self.inner.as_mut().poll(cx));
        let done = self.done.take();
        Poll::Ready(r.map(|resp| resp.map(|inner| Answer { inner, _done: done })))
    }
}

/// An answer's body: when hyper drops it (written to its end, or the
/// connection failed), the request is done and the connection waits for
/// its next head.
struct Answer<B> {
    inner: B,
    _done: Option<Done>,
}

impl<B: Body + Unpin> Body for Answer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Turns an accepted TCP stream into the stream HTTP is spoken on (plain:
/// itself; TLS: after the handshake).
pub trait Handshake: Clone + Send + Sync + 'static {
    /// The stream after the handshake.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Performs the handshake.
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// No handshake: HTTP over the TCP stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    async fn handshake(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the new soft
/// limit.
pub fn raise_nofile_limit() -> Result<u64, Error> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(Error::Rlimit)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(Error::Rlimit)?;
    }
    Ok(hard.max(soft))
}

/// The current soft `RLIMIT_NOFILE` (`u64::MAX` when unknown).
pub fn nofile_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(u64::MAX)
}

/// Logs accept errors at most once per [`ACCEPT_ERROR_LOG_EVERY`].
#[derive(Debug)]
struct AcceptErrors {
    name: &'static str,
    last: Option<Instant>,
    suppressed: u64,
}

impl AcceptErrors {
    fn record(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < ACCEPT_ERROR_LOG_EVERY)
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            listener = self.name,
            error = %e,
            not_logged_since_last = self.suppressed,
            "accepting a connection failed (at most one such warning per 10 s)"
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// A stream that records when it last moved a byte, and tells its
/// connection's [`HeadClock`] when it reads.
struct Tracked<T> {
    inner: T,
    epoch: Instant,
    last: Arc<AtomicU64>,
    clock: Arc<HeadClock>,
}

impl<T> Tracked<T> {
    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
            self.clock.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The stream one hyper connection speaks on: first the bytes read before
/// it started (`prefix`), then the stream. When the connection may be
/// parked ([`HeadClock::parkable`]) and hyper asks for more bytes, it
/// reads an end of stream instead, without touching the stream: hyper,
/// between two messages, then ends the connection cleanly (hyper
/// `src/proto/h1/conn.rs`, `Conn::on_read_head_error`: an end of stream
/// before any byte of a head closes an idle connection without an error),
/// and hands back the stream and any byte of the next head it had read.
struct Parking<T> {
    inner: T,
    prefix: hyper::body::Bytes,
    clock: Arc<HeadClock>,
    answered_before: u64,
    /// A read of the stream is pending (hyper waits on the stream's
    /// readiness, and reads nothing more until it comes).
    read_pending: bool,
    parked: bool,
}

impl<T> Parking<T> {
    fn new(inner: T, prefix: hyper::body::Bytes, clock: Arc<HeadClock>) -> Self {
        let answered_before = clock.answered();
        Self {
            inner,
            prefix,
            clock,
            answered_before,
            read_pending: false,
            parked: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Parking<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        if self.clock.parkable(self.answered_before) {
            self.parked = true;
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.read_pending = r.is_pending();
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Parking<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.clock.flushed();
            // hyper read (and was told to wait) while the answer was
            // being made: it would not read again before the stream has
            // bytes (hyper `src/proto/h1/conn.rs`, `Conn::maybe_notify`
            // skips a blocked read), so wake it to be parked now.
            if self.read_pending && self.clock.parkable(self.answered_before) {
                self.read_pending = false;
                cx.waker().wake_by_ref();
            }
        }
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection's place in the registry, given up when its task ends.
struct Slot {
    registry: Arc<Mutex<Registry>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.registry.lock().unwrap().close(self.id);
    }
}

/// Resolves once `last` has not moved for `idle`.
async fn idle_for(epoch: Instant, last: Arc<AtomicU64>, idle: Duration) {
    loop {
        let since = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = since + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// How a connection's task ended.
enum End {
    /// The client closed, or HTTP ended the connection (an error, a
    /// `Connection: close`, a graceful shutdown).
    Done,
    /// The idle timeout.
    Idle,
    /// The header-read timeout.
    HeadOverdue,
    /// Shed for a newcomer.
    Shed,
    /// The server is shutting down, and the connection was in its
    /// handshake or parked.
    Stopped,
}

/// Serves HTTP/1.1 on `listener` with `limits` until `shutdown` resolves,
/// then drains open connections for at most `limits.drain`. `make` builds
/// the service of one connection from the peer address. `name` labels
/// logs.
///
/// A kept-alive connection whose last request was vouched for is parked
/// between requests: hyper's connection (its 8 KiB read buffer and its
/// 8 KiB head buffer, hyper `src/proto/h1/io.rs`, `Buffered::new` and
/// `WriteBuf::new`) is let go once the answer is flushed, and a new one
/// starts on the same stream when the next request's first byte arrives.
/// An idle agent connection then holds its stream and this task only.
pub async fn serve<H, M, S, B>(
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    handshake: H,
    metrics: ServeMetrics,
    make: M,
    shutdown: impl Future<Output = ()>,
) where
    H: Handshake,
    M: Fn(SocketAddr) -> S,
    S: Service<http::Request<RequestBody>, Response = http::Response<B>, Error = Infallible>
        + Unpin
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let cap = limits.max_connections.max(1);
    let registry = Arc::new(Mutex::new(Registry::default()));
    // Every connection task holds a sender; the drain waits for all to go.
    let (alive, mut all_gone) = tokio::sync::mpsc::channel::<()>(1);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut errors = AcceptErrors {
        name,
        last: None,
        suppressed: 0,
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Kept per connection by `HeadClock` instead.
        .header_read_timeout(None)
        .max_buf_size(limits.max_buf_size.max(8192))
        .max_headers(limits.max_headers);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    errors.record(&e);
                    // EMFILE and the like: give descriptors time to free.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let admitted = registry
            .lock()
            .unwrap()
            .admit(peer.ip(), cap, limits.per_source);
        let (id, kill) = match admitted {
            Admitted::Open { id, kill, shed } => {
                if let Some(why) = shed {
                    metrics.shed.inc();
                    tracing::debug!(listener = name, %peer, limit = why.limit(), "a demoted or unproven connection shed for a newcomer");
                }
                (id, kill)
            }
            Admitted::Refused(why) => {
                metrics.shed.inc();
                tracing::debug!(listener = name, %peer, limit = why.limit(), "no connection to spare; closed at once");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(HeadClock::new());
        let standing = Standing {
            registry: registry.clone(),
            id,
            per_identity: limits.per_identity,
            clock: clock.clone(),
        };
        let svc = WithStanding {
            inner: make(peer),
            standing,
        };
        let conn = Connection {
            name,
            peer,
            limits,
            builder: builder.clone(),
            clock,
            metrics: metrics.clone(),
            stop: stop_rx.clone(),
        };
        let registry = registry.clone();
        let handshake = handshake.clone();
        let alive = alive.clone();
        metrics.open.inc();
        tokio::spawn(async move {
            let _alive = alive;
            let _slot = Slot { registry, id };
            let end = conn.run(handshake, stream, svc, &kill).await;
            match end {
                End::Done | End::Stopped => {}
                End::Idle => {
                    conn.metrics.timed_out.inc();
                    tracing::debug!(listener = name, %peer, "connection idle too long; closed");
                }
                End::HeadOverdue => {
                    conn.metrics.timed_out.inc();
                    tracing::debug!(listener = name, %peer, "no complete request head in time; closed");
                }
                End::Shed => {
                    tracing::debug!(listener = name, %peer, "connection shed for a newcomer");
                }
            }
            conn.metrics.open.dec();
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive);
    if tokio::time::timeout(limits.drain, all_gone.recv())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "connections still open after the drain period"
        );
    }
}

/// One accepted connection's settings.
struct Connection {
    name: &'static str,
    peer: SocketAddr,
    limits: Limits,
    builder: http1::Builder,
    clock: Arc<HeadClock>,
    metrics: ServeMetrics,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Connection {
    /// Handshakes, then serves requests until the connection ends.
    async fn run<H, S, B>(
        &self,
        handshake: H,
        stream: TcpStream,
        svc: WithStanding<S>,
        kill: &tokio::sync::Notify,
    ) -> End
    where
        H: Handshake,
        S: Service<http::Request<RequestBody>, Response = http::Response<B>, Error = Infallible>
            + Unpin
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: Body + Unpin + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let killed = kill.notified();
        let mut killed = std::pin::pin!(killed);
        killed.as_mut().enable();
        let mut stop = self.stop.clone();
        let io = tokio::select! {
            r = tokio::time::timeout(self.limits.handshake_timeout, handshake.handshake(stream)) => match r {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => {
                    tracing::debug!(listener = self.name, peer = %self.peer, error = %e, "handshake failed");
                    return End::Done;
                }
                Err(_) => {
                    self.metrics.timed_out.inc();
                    return End::Done;
                }
            },
            () = killed.as_mut() => return End::Shed,
            _ = stop.wait_for(|s| *s) => return End::Stopped,
        };
        let epoch = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        self.clock.wait();
        let mut io = Tracked {
            inner: io,
            epoch,
            last: last.clone(),
            clock: self.clock.clone(),
        };
        let mut svc = svc;
        let mut prefix = hyper::body::Bytes::new();
        let clock = &self.clock;
        let header_read = self.limits.header_read_timeout;
        let idle = self.limits.idle_timeout;
        loop {
            let mut conn = self
                .builder
                .serve_connection(TokioIo::new(Parking::new(io, prefix, clock.clone())), svc);
            let mut stopping = false;
            let ended = loop {
                if !stopping && *stop.borrow() {
                    stopping = true;
                    Pin::new(&mut conn).graceful_shutdown();
                }
                tokio::select! {
                    r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break r,
                    _ = stop.wait_for(|s| *s), if !stopping => {}
                    () = idle_for(epoch, last.clone(), idle) => return End::Idle,
                    () = head_overdue(clock.clone(), header_read) => return End::HeadOverdue,
                    () = killed.as_mut() => return End::Shed,
                }
            };
            let parts = conn.into_parts();
            let parking = parts.io.into_inner();
            let parked = parking.parked && !stopping;
            match ended {
                Ok(()) if parked => {}
                // A head begun before the answer (a pipelined request) and
                // cut short by the end of stream read in its place: served
                // from the bytes hyper hands back.
                Err(e) if parked && e.is_incomplete_message() && !parts.read_buf.is_empty() => {}
                Ok(()) => {
                    let mut io = parking.inner;
                    tokio::select! {
                        _ = tokio::io::AsyncWriteExt::shutdown(&mut io) => {}
                        () = idle_for(epoch, last.clone(), idle) => {}
                    }
                    return End::Done;
                }
                Err(e) => {
                    if e.is_timeout() {
                        self.metrics.timed_out.inc();
                    }
                    tracing::debug!(listener = self.name, peer = %self.peer, error = %e, "connection ended");
                    return End::Done;
                }
            }
            svc = parts.service;
            io = parking.inner;
            let read_buf = parts.read_buf;
            if !read_buf.is_empty() {
                clock.head_carried_over();
                prefix = read_buf;
                continue;
            }
            // Empty, it still holds hyper's read buffer (it is the buffer,
            // frozen): let it go before waiting, not when this scope ends.
            drop(read_buf);
            // Parked: wait for the next request's first byte.
            self.metrics.parked.inc();
            let mut first = [0u8; 1];
            let woke = tokio::select! {
                r = tokio::io::AsyncReadExt::read(&mut io, &mut first) => Ok(r),
                () = idle_for(epoch, last.clone(), idle) => Err(End::Idle),
                () = head_overdue(clock.clone(), header_read) => Err(End::HeadOverdue),
                () = killed.as_mut() => Err(End::Shed),
                _ = stop.wait_for(|s| *s) => Err(End::Stopped),
            };
            self.metrics.parked.dec();
            match woke {
                Ok(Ok(n)) if n > 0 => prefix = hyper::body::Bytes::copy_from_slice(&first[..n]),
                // The client closed, or the stream failed.
                Ok(_) => return End::Done,
                Err(end) => return end,
            }
        }
    }
}

#[cfg(test)]
mod tests;
