//! Reading a report's body: bounded in size and in time (a deadline that
//! moves with the bytes received), drained up to a cap when refused, and
//! the times it carries clamped to when it was received.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
use mountguard_inventory::NodeInventory;

/// The rate a body must keep up beyond the body timeout: each this many
/// bytes received extend its deadline by one second.
pub const MIN_BODY_RATE: u64 = 64 << 10;

/// Clock skew above which a clamp is logged.
pub(crate) const CLOCK_SKEW_WARN: Duration = Duration::from_secs(5);

/// How far `t` is ahead of `received` (zero when it is not).
pub(crate) fn ahead_by(t: jiff::Timestamp, received: jiff::Timestamp) -> Duration {
    Duration::try_from(t.duration_since(received)).unwrap_or(Duration::ZERO)
}

/// The agent's clock is not trusted: every time in an inventory that lies
/// ahead of the controller's clock at receipt (`scannedAt`, a volume's
/// `writtenAt`) is clamped to the receipt time, so a node's inventory ages
/// and a mismatch is timed on the controller's clock. A time behind it is
/// kept (it only makes the inventory look older: the safe direction).
/// Returns how far `scannedAt` was ahead.
pub fn clamp_to_received(inv: &mut NodeInventory, received: jiff::Timestamp) -> Duration {
    let skew = ahead_by(inv.scanned_at, received);
    inv.scanned_at = inv.scanned_at.min(received);
    for p in &mut inv.pods {
        for v in &mut p.volumes {
            if let Some(w) = v.written_at.as_mut() {
                *w = (*w).min(received);
            }
        }
    }
    skew
}

/// How many bytes of an oversized body are read and discarded before the
/// 413 is sent. Answering without reading makes the kernel reset the
/// connection while the client is still writing, so an agent whose
/// inventory outgrew `--max-report-bytes` would log a broken pipe instead
/// of the reason. Only authenticated, authorized and rate-limited callers
/// get this far.
pub(crate) fn drain_cap(max: u64) -> u64 {
    max.saturating_mul(4).clamp(8 << 20, 64 << 20)
}

/// The longest time spent discarding an oversized body.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) enum BodyError {
    TooLarge,
    TimedOut,
    Read(Box<dyn std::error::Error + Send + Sync>),
}

/// When a body that started at `start` must have arrived, `seen` bytes of
/// it received: `timeout` after the start, one second later per
/// [`MIN_BODY_RATE`] bytes (pure).
pub fn body_deadline(
    start: tokio::time::Instant,
    timeout: Duration,
    seen: u64,
) -> tokio::time::Instant {
    start + timeout + Duration::from_secs_f64(seen as f64 / MIN_BODY_RATE as f64)
}

/// Reads a body of at most `max` bytes by its [`body_deadline`]. A longer
/// body is read on (and thrown away) up to [`drain_cap`] bytes or
/// [`DRAIN_TIMEOUT`] so the 413 reaches the client, then reported as too
/// large.
pub(crate) async fn read_bounded<B>(
    body: B,
    max: u64,
    timeout: Duration,
) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    let mut buf: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    let start = tokio::time::Instant::now();
    loop {
        let next = tokio::time::timeout_at(body_deadline(start, timeout, seen), body.frame());
        let frame = match next.await {
            Err(_) => return Err(BodyError::TimedOut),
            Ok(None) => break,
            Ok(Some(Ok(f))) => f,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.into())),
        };
        if let Ok(data) = frame.into_data() {
            seen = seen.saturating_add(data.len() as u64);
            if seen > max {
                break;
            }
            buf.extend_from_slice(&data);
        }
    }
    if seen <= max {
        return Ok(Bytes::from(buf));
    }
    drop(buf);
    let cap = drain_cap(max);
    let drain = async {
        while seen <= cap {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        seen = seen.saturating_add(d.len() as u64);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    Err(BodyError::TooLarge)
}
