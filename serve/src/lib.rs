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
//!   the header-read timeout runs from the first byte of the next head;
//! - an idle timeout: a connection that moves no byte in either direction
//!   for that long is closed, whatever it is doing (a stalled body, a
//!   client that never reads its answer, a vouched connection waiting
//!   longer than that for its next request);
//! - a cap on open connections: a connection over the cap is closed at
//!   once (shed), before anything is read from it. With
//!   [`Limits::shed_unproven`], a connection already open is shed in its
//!   place when one can be spared: first one the service [`Standing::demote`]d
//!   (refused, or over its identity's limit), then the oldest one no
//!   request has proven yet from the newcomer's own address, then (only
//!   for an address with none) the oldest one not proven yet from any: a
//!   source opening connections in a flood competes with itself. One the
//!   service vouched for is never shed for a newcomer;
//! - a limit on the connections one identity holds
//!   ([`Limits::per_identity`], counted by [`Standing::vouch`]);
//! - a small read buffer (`max_buf_size`), which bounds the request head;
//! - a bounded handshake (TLS) and a bounded graceful drain at shutdown;
//! - accept errors (e.g. `EMFILE`) logged at most once per
//!   [`ACCEPT_ERROR_LOG_EVERY`], with the count of those not logged.
//!
//! [`raise_nofile_limit`] raises `RLIMIT_NOFILE` to its hard limit; both
//! binaries call it at start.
//!
//! With the feature `test-server`, [`test_server::TestServer`] is the one
//! plain loopback server of the tests and the test doubles.

#[cfg(feature = "test-server")]
pub mod test_server;

use std::collections::{BTreeSet, HashMap};
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
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// hyper's read buffer limit, which bounds a request head (at least
    /// 8192, hyper's minimum).
    pub max_buf_size: usize,
    /// Header fields per request at most.
    pub max_headers: usize,
    /// How long open connections may finish after shutdown starts.
    pub drain: Duration,
    /// At the cap, shed a demoted or not yet proven connection for a
    /// newcomer instead of the newcomer (see [`Standing`]).
    pub shed_unproven: bool,
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
            max_buf_size: 16 * 1024,
            max_headers: 64,
            drain: Duration::from_secs(5),
            shed_unproven: false,
            per_identity: 0,
        }
    }

    /// The cap lowered so that it fits in `fds` descriptors with `reserve`
    /// kept for everything else (never below 1).
    pub fn fit_in(mut self, fds: u64, reserve: u64) -> Self {
        let room = fds.saturating_sub(reserve).max(1);
        self.max_connections = self.max_connections.min(room as usize).max(1);
        self
    }
}

/// Counters a caller may register in its metrics.
#[derive(Debug, Clone)]
pub struct ServeMetrics {
    /// Open connections (`{listener}`).
    pub open: prometheus::IntGauge,
    /// Connections closed at once because the cap was reached.
    pub shed: prometheus::IntCounter,
    /// Connections closed by the header-read or idle timeout, or a
    /// handshake timeout.
    pub timed_out: prometheus::IntCounter,
}

impl ServeMetrics {
    /// Metrics not registered anywhere (tests, benchmarks).
    pub fn unregistered() -> Self {
        Self {
            open: prometheus::IntGauge::new("open", "open").expect("valid"),
            shed: prometheus::IntCounter::new("shed", "shed").expect("valid"),
            timed_out: prometheus::IntCounter::new("timed_out", "timed out").expect("valid"),
        }
    }
}

/// What a request has shown of its connection's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Nothing yet: shed (oldest first) when a newcomer needs the room.
    Unproven,
    /// A request the service vouched for: never shed for a newcomer.
    Vouched,
    /// Refused, or over its identity's limit: shed first.
    Demoted,
}

#[derive(Debug)]
struct Entry {
    source: std::net::IpAddr,
    class: Class,
    identity: Option<Arc<str>>,
    kill: Arc<tokio::sync::Notify>,
}

/// The open connections of one listener, by how much they are worth
/// keeping.
#[derive(Debug, Default)]
struct Registry {
    next: u64,
    conns: HashMap<u64, Entry>,
    /// Ids by class, oldest first.
    unproven: BTreeSet<u64>,
    /// Unproven ids by source address.
    unproven_from: HashMap<std::net::IpAddr, BTreeSet<u64>>,
    demoted: BTreeSet<u64>,
    per_identity: HashMap<Arc<str>, usize>,
}

impl Registry {
    fn open(&mut self, source: std::net::IpAddr) -> (u64, Arc<tokio::sync::Notify>) {
        let id = self.next;
        self.next += 1;
        let kill = Arc::new(tokio::sync::Notify::new());
        self.unproven_from.entry(source).or_default().insert(id);
        self.conns.insert(
            id,
            Entry {
                source,
                class: Class::Unproven,
                identity: None,
                kill: kill.clone(),
            },
        );
        self.unproven.insert(id);
        (id, kill)
    }

    /// Forgets `id`'s class and identity.
    fn unclass(&mut self, id: u64) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        match e.class {
            Class::Unproven => {
                self.unproven.remove(&id);
                if let Some(set) = self.unproven_from.get_mut(&e.source) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.unproven_from.remove(&e.source);
                    }
                }
            }
            Class::Demoted => {
                self.demoted.remove(&id);
            }
            Class::Vouched => {}
        }
        if let Some(who) = e.identity.take()
            && let Some(n) = self.per_identity.get_mut(&who)
        {
            *n -= 1;
            if *n == 0 {
                self.per_identity.remove(&who);
            }
        }
    }

    fn close(&mut self, id: u64) {
        self.unclass(id);
        self.conns.remove(&id);
    }

    fn demote(&mut self, id: u64) {
        if self
            .conns
            .get(&id)
            .is_none_or(|e| e.class == Class::Demoted)
        {
            return;
        }
        self.unclass(id);
        if let Some(e) = self.conns.get_mut(&id) {
            e.class = Class::Demoted;
            self.demoted.insert(id);
        }
    }

    fn vouch(&mut self, id: u64, identity: &str, limit: usize) -> bool {
        let Some(e) = self.conns.get(&id) else {
            return false;
        };
        if e.class == Class::Vouched && e.identity.as_deref() == Some(identity) {
            return true;
        }
        let held = self.per_identity.get(identity).copied().unwrap_or(0);
        if limit > 0 && held >= limit {
            self.demote(id);
            return false;
        }
        self.unclass(id);
        let who: Arc<str> = Arc::from(identity);
        *self.per_identity.entry(who.clone()).or_insert(0) += 1;
        let e = self.conns.get_mut(&id).expect("checked above");
        e.class = Class::Vouched;
        e.identity = Some(who);
        true
    }

    /// Closes the connection most worth shedding for a newcomer from
    /// `source`, if any may be: the oldest demoted one; else the oldest
    /// unproven one from `source`; else, when `source` has none, the
    /// oldest unproven one.
    fn shed_one(&mut self, source: std::net::IpAddr) -> bool {
        let own = self.unproven_from.get(&source).and_then(|s| s.first());
        let Some(id) = self
            .demoted
            .first()
            .or(own)
            .or_else(|| {
                (!self.unproven_from.contains_key(&source))
                    .then(|| self.unproven.first())
                    .flatten()
            })
            .copied()
        else {
            return false;
        };
        if let Some(e) = self.conns.get(&id) {
            e.kill.notify_one();
        }
        self.close(id);
        true
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

    /// The request was refused: the connection is the first to be shed,
    /// and waits for its next request under the header-read timeout again.
    pub fn demote(&self) {
        self.registry.lock().unwrap().demote(self.id);
        self.clock.set_vouched(false);
    }
}

/// When a connection waits for a request head, and since when: the
/// header-read timeout of [`serve`].
#[derive(Debug)]
struct HeadClock {
    epoch: Instant,
    /// Requests handed to the service and not answered yet.
    in_flight: AtomicU64,
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

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    fn request_done(&self) {
        self.wait();
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.changed.notify_waiters();
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

    fn set_vouched(&self, v: bool) {
        self.vouched.store(v, Ordering::Relaxed);
        self.changed.notify_waiters();
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

/// A service that hands each request its connection's [`Standing`] and
/// tells the connection's [`HeadClock`] while a request is served.
#[derive(Debug, Clone)]
struct WithStanding<S> {
    inner: S,
    standing: Standing,
}

impl<S, R> Service<http::Request<Incoming>> for WithStanding<S>
where
    S: Service<http::Request<Incoming>, Response = R>,
{
    type Response = R;
    type Error = S::Error;
    type Future = Served<S::Future>;
    fn call(&self, mut req: http::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.standing.clone());
        let clock = self.standing.clock.clone();
        clock.request_started();
        Served {
            inner: Box::pin(self.inner.call(req)),
            clock: Some(clock),
        }
    }
}

/// A request being served: when it is answered (or dropped), its
/// connection waits for the next head.
struct Served<F> {
    inner: Pin<Box<F>>,
    clock: Option<Arc<HeadClock>>,
}

impl<F: Future> Future for Served<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let r = self.inner.as_mut().poll(cx);
        if r.is_ready()
            && let Some(c) = self.clock.take()
        {
            c.request_done();
        }
        r
    }
}

impl<F> Drop for Served<F> {
    fn drop(&mut self) {
        if let Some(c) = self.clock.take() {
            c.request_done();
        }
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

/// Serves HTTP/1.1 on `listener` with `limits` until `shutdown` resolves,
/// then drains open connections for at most `limits.drain`. `make` builds
/// the service of one connection from the peer address. `name` labels
/// logs.
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
    S: Service<http::Request<Incoming>, Response = http::Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let cap = limits.max_connections.max(1);
    let registry = Arc::new(Mutex::new(Registry::default()));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
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
        let opened = {
            let mut reg = registry.lock().unwrap();
            if reg.conns.len() >= cap {
                if limits.shed_unproven && reg.shed_one(peer.ip()) {
                    metrics.shed.inc();
                    tracing::debug!(listener = name, %peer, "connection cap reached; an unproven or demoted connection shed for a newcomer");
                } else {
                    metrics.shed.inc();
                    tracing::debug!(listener = name, %peer, "connection cap reached; closed at once");
                }
            }
            (reg.conns.len() < cap).then(|| reg.open(peer.ip()))
        };
        let Some((id, kill)) = opened else {
            drop(stream);
            continue;
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
        let registry = registry.clone();
        let handshake = handshake.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let metrics = metrics.clone();
        metrics.open.inc();
        tokio::spawn(async move {
            let _slot = Slot { registry, id };
            let killed = kill.notified();
            let mut killed = std::pin::pin!(killed);
            killed.as_mut().enable();
            let io = tokio::select! {
                r = tokio::time::timeout(limits.handshake_timeout, handshake.handshake(stream)) => match r {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        tracing::debug!(listener = name, %peer, error = %e, "handshake failed");
                        metrics.open.dec();
                        return;
                    }
                    Err(_) => {
                        metrics.timed_out.inc();
                        metrics.open.dec();
                        return;
                    }
                },
                () = killed.as_mut() => {
                    metrics.open.dec();
                    return;
                }
            };
            let epoch = Instant::now();
            let last = Arc::new(AtomicU64::new(0));
            clock.wait();
            let io = Tracked {
                inner: io,
                epoch,
                last: last.clone(),
                clock: clock.clone(),
            };
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(io), svc));
            tokio::select! {
                r = conn => {
                    if let Err(e) = r {
                        if e.is_timeout() {
                            metrics.timed_out.inc();
                        }
                        tracing::debug!(listener = name, %peer, error = %e, "connection ended");
                    }
                }
                () = idle_for(epoch, last, limits.idle_timeout) => {
                    metrics.timed_out.inc();
                    tracing::debug!(listener = name, %peer, "connection idle too long; closed");
                }
                () = head_overdue(clock, limits.header_read_timeout) => {
                    metrics.timed_out.inc();
                    tracing::debug!(listener = name, %peer, "no complete request head in time; closed");
                }
                () = killed => {
                    tracing::debug!(listener = name, %peer, "connection shed for a newcomer");
                }
            }
            metrics.open.dec();
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "connections still open after the drain period"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::body::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: Limits) -> (SocketAddr, ServeMetrics, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = ServeMetrics::unregistered();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let m = metrics.clone();
        tokio::spawn(serve(
            "test",
            listener,
            limits,
            Plain,
            m,
            |_| {
                hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
                })
            },
            async {
                let _ = rx.await;
            },
        ));
        (addr, metrics, tx)
    }

    async fn get(addr: SocketAddr) -> io::Result<String> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    /// Reads until EOF or error; true when the server closed.
    async fn closed_within(s: &mut TcpStream, d: Duration) -> bool {
        let mut buf = [0u8; 512];
        loop {
            match tokio::time::timeout(d, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    fn quick() -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(600),
            max_connections: 4,
            ..Limits::small()
        }
    }

    #[tokio::test]
    async fn idle_and_slow_header_connections_are_closed() {
        let (addr, m, _stop) = start(quick()).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
        assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
        assert!(closed_within(&mut slow, Duration::from_secs(3)).await);
        assert!(get(addr).await.unwrap().contains("200 OK"));
        assert!(m.timed_out.get() >= 2);
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_at_once() {
        let (addr, m, _stop) = start(Limits {
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            ..quick()
        })
        .await;
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Wait until the four are accepted.
        for _ in 0..100 {
            if m.open.get() == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(m.open.get(), 4);
        let mut extra = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut extra, Duration::from_secs(2)).await);
        assert_eq!(m.shed.get(), 1);
        drop(held);
        for _ in 0..100 {
            if m.open.get() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(get(addr).await.unwrap().contains("200 OK"));
    }

    /// A server whose service vouches for `x-id: <who>` (answering 429
    /// when `who` is over its limit) and demotes on `x-bad`.
    async fn start_ranked(
        limits: Limits,
    ) -> (SocketAddr, ServeMetrics, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = ServeMetrics::unregistered();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(
            "test",
            listener,
            limits,
            Plain,
            metrics.clone(),
            |_| {
                hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    let standing = req.extensions().get::<Standing>().unwrap().clone();
                    let mut status = http::StatusCode::OK;
                    if let Some(who) = req.headers().get("x-id") {
                        if !standing.vouch(who.to_str().unwrap()) {
                            status = http::StatusCode::TOO_MANY_REQUESTS;
                        }
                    } else if req.headers().contains_key("x-bad") {
                        standing.demote();
                        status = http::StatusCode::UNAUTHORIZED;
                    }
                    let mut resp = http::Response::new(Full::new(Bytes::from_static(b"ok")));
                    *resp.status_mut() = status;
                    Ok::<_, Infallible>(resp)
                })
            },
            async {
                let _ = rx.await;
            },
        ));
        (addr, metrics, tx)
    }

    /// One keep-alive request on `s`; returns the status line.
    async fn ask(s: &mut TcpStream, header: &str) -> String {
        s.write_all(format!("GET / HTTP/1.1\r\nhost: x\r\n{header}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    }

    async fn wait_open(m: &ServeMetrics, n: i64) {
        for _ in 0..200 {
            if m.open.get() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} open, expected {n}", m.open.get());
    }

    /// A connection a request was vouched for waits for its next request
    /// past the header-read timeout, up to the idle timeout (an agent's
    /// heartbeat gap); a connection whose request was not vouched for, or
    /// was refused, is closed by the header-read timeout between requests,
    /// and a vouched one that trickles its next head is closed by it too.
    #[tokio::test]
    async fn a_vouched_connection_waits_between_requests_under_the_idle_timeout() {
        let header_read = Duration::from_millis(300);
        let (addr, m, _stop) = start_ranked(Limits {
            header_read_timeout: header_read,
            idle_timeout: Duration::from_millis(1500),
            max_connections: 16,
            ..Limits::small()
        })
        .await;
        let gap = header_read * 3;
        let mut vouched = TcpStream::connect(addr).await.unwrap();
        let mut plain = TcpStream::connect(addr).await.unwrap();
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let mut trickling = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
        assert!(ask(&mut plain, "x-plain: 1").await.contains("200"));
        assert!(ask(&mut refused, "x-bad: 1").await.contains("401"));
        assert!(ask(&mut trickling, "x-id: b").await.contains("200"));
        trickling.write_all(b"GET / HTTP/1.1\r\nho").await.unwrap();
        tokio::time::sleep(gap).await;
        assert!(closed_within(&mut plain, Duration::from_millis(50)).await);
        assert!(closed_within(&mut refused, Duration::from_millis(50)).await);
        assert!(closed_within(&mut trickling, Duration::from_millis(50)).await);
        // Open after three header-read timeouts: the next request is
        // answered on the same connection, and again after another gap.
        assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
        tokio::time::sleep(gap).await;
        assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
        assert_eq!(m.timed_out.get(), 3);
        // The idle timeout still ends it.
        assert!(closed_within(&mut vouched, Duration::from_secs(3)).await);
        assert_eq!(m.timed_out.get(), 4);
    }

    /// The cap full of connections that trickle, idle or were refused: a
    /// newcomer (another node's heartbeat) gets in and one of those is
    /// shed, the refused one first; connections that were vouched for are
    /// never shed for it; one identity holds at most its limit.
    #[tokio::test]
    async fn slow_body_connections_are_shed_before_proven_ones() {
        let (addr, m, _stop) = start_ranked(Limits {
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: 4,
            shed_unproven: true,
            per_identity: 2,
            ..Limits::small()
        })
        .await;
        // Two connections of one identity, vouched for; a third is over
        // the limit (and demoted).
        let mut a1 = TcpStream::connect(addr).await.unwrap();
        let mut a2 = TcpStream::connect(addr).await.unwrap();
        let mut a3 = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut a1, "x-id: a").await.contains("200"));
        assert!(ask(&mut a2, "x-id: a").await.contains("200"));
        assert!(ask(&mut a3, "x-id: a").await.contains("429"));
        // An unproven connection sending a slow head.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"PUT / HTTP/1.1\r\nhost").await.unwrap();
        wait_open(&m, 4).await;
        // A newcomer: the demoted one goes first.
        let mut b = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut b, "x-id: b").await.contains("200"));
        assert!(closed_within(&mut a3, Duration::from_secs(2)).await);
        // The next one: the unproven slow connection goes.
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut c, "x-id: c").await.contains("200"));
        assert!(closed_within(&mut slow, Duration::from_secs(2)).await);
        assert_eq!(m.shed.get(), 2);
        // Only vouched connections are left: a newcomer is closed at once.
        let mut d = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut d, Duration::from_secs(2)).await);
        assert_eq!(m.shed.get(), 3);
        for s in [&mut a1, &mut a2, &mut b, &mut c] {
            assert!(
                ask(s, "x-ping: 1").await.contains("200"),
                "a vouched connection was shed"
            );
        }
    }

    async fn connect_from(ip: &str, addr: SocketAddr) -> TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        s.connect(addr).await.unwrap()
    }

    /// At the cap, a newcomer from an address that has unproven
    /// connections sheds its own oldest one, not another address's: an
    /// attacker flooding connections from one address cannot push out a
    /// node's connection that is still sending its request.
    #[tokio::test]
    async fn slow_body_flood_from_one_address_sheds_its_own_connections() {
        let (addr, m, _stop) = start_ranked(Limits {
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: 4,
            shed_unproven: true,
            per_identity: 2,
            ..Limits::small()
        })
        .await;
        let mut agent = connect_from("127.0.0.1", addr).await;
        agent.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
        wait_open(&m, 1).await;
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(connect_from("127.0.0.2", addr).await);
            wait_open(&m, flood.len() as i64 + 1).await;
        }
        // Three more from the flooding address: each sheds its own oldest.
        for i in 0..3 {
            flood.push(connect_from("127.0.0.2", addr).await);
            assert!(
                closed_within(&mut flood[i], Duration::from_secs(2)).await,
                "{i}"
            );
        }
        assert_eq!(m.shed.get(), 3);
        agent.write_all(b": x\r\nx-id: a\r\n\r\n").await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = agent.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).contains("200"),
            "the node's connection was shed"
        );
    }

    #[tokio::test]
    async fn an_oversized_request_head_is_refused() {
        let (addr, _m, _stop) = start(quick()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let big = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        let _ = s.write_all(big.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("200 OK"), "{text}");
    }

    #[test]
    fn the_cap_fits_in_the_descriptors() {
        assert_eq!(Limits::small().fit_in(1024, 128).max_connections, 256);
        assert_eq!(Limits::small().fit_in(200, 128).max_connections, 72);
        assert_eq!(Limits::small().fit_in(10, 128).max_connections, 1);
        assert!(raise_nofile_limit().unwrap() >= nofile_limit().min(1024));
    }
}
