//! (feature `test-server`) A flood of idle TCP sockets for the tests of
//! every listener: `sockets` connections from one loopback address that
//! never send a byte, each reopened as soon as the server closes it, at
//! most `per_second` connects a second, for at most `lasting` (it stops
//! by itself, or when dropped); [`probe`], a kubelet's HTTP probe (a
//! fresh connection from a given address each time); and
//! [`closed_within`], whether the server closed a connection in time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

/// A running flood (see the module comment).
#[derive(Debug)]
pub struct Flood {
    sockets: u64,
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Counts {
    connects: AtomicU64,
    closed_by_server: AtomicU64,
}

impl Flood {
    /// Starts `sockets` idle connections from `from` to `target`.
    pub fn start(
        target: SocketAddr,
        from: IpAddr,
        sockets: usize,
        per_second: u32,
        lasting: Duration,
    ) -> Self {
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            let _ = tokio::time::timeout(lasting, run(target, from, sockets, per_second, c)).await;
        });
        Self {
            sockets: sockets as u64,
            counts,
            task,
        }
    }

    /// The flood of the listeners' tests: from 127.0.0.2, four sockets more
    /// than `max_connections`, 200 connects a second for at most 30 s;
    /// returns once four closed by the server were reopened.
    pub async fn past_the_cap(target: SocketAddr, max_connections: usize) -> Self {
        let flood = Self::start(
            target,
            IpAddr::from([127, 0, 0, 2]),
            max_connections + 4,
            200,
            Duration::from_secs(30),
        );
        flood.wait_reopened(4, Duration::from_secs(10)).await;
        flood
    }

    /// Connections opened so far.
    pub fn connects(&self) -> u64 {
        self.counts.connects.load(Ordering::Relaxed)
    }

    /// Connections the server closed so far.
    pub fn closed_by_server(&self) -> u64 {
        self.counts.closed_by_server.load(Ordering::Relaxed)
    }

    /// Waits (at most `within`) until every socket was opened and `n` the
    /// server closed were reopened: the flood holds all the server lets
    /// it hold, and keeps coming.
    pub async fn wait_reopened(&self, n: u64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.closed_by_server() < n || self.connects() < self.sockets + n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the flood opened {} connections (of {} sockets), the server closed {}; expected {n} reopened",
                self.connects(),
                self.sockets,
                self.closed_by_server()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `GET path` on a fresh connection from `from` (`connection: close`, as
/// a kubelet's probe): true when answered 200 within 2 s.
pub async fn probe(target: SocketAddr, from: IpAddr, path: &str) -> bool {
    let ask = async {
        let mut s = connect(target, from).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ask).await,
        Ok(Ok(out)) if out.starts_with(b"HTTP/1.1 200")
    )
}

async fn connect(target: SocketAddr, from: IpAddr) -> std::io::Result<TcpStream> {
    let s = match from {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    s.bind(SocketAddr::new(from, 0))?;
    s.connect(target).await
}

async fn run(
    target: SocketAddr,
    from: IpAddr,
    sockets: usize,
    per_second: u32,
    counts: Arc<Counts>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = tokio::task::JoinSet::new();
    loop {
        if open.len() < sockets {
            tick.tick().await;
            match connect(target, from).await {
                Ok(mut s) => {
                    counts.connects.fetch_add(1, Ordering::Relaxed);
                    let counts = counts.clone();
                    open.spawn(async move {
                        let mut buf = [0u8; 256];
                        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                        counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        // Reap the sockets the server closed, without waiting when there
        // is room for more.
        while let Some(r) = open.try_join_next() {
            let _ = r;
        }
        if open.len() >= sockets {
            let _ = open.join_next().await;
        }
    }
}

/// Reads `s` until EOF or an error: true when the server closed it within
/// `d` (data it sends meanwhile is read and dropped).
pub async fn closed_within(s: &mut TcpStream, d: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(d, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}
