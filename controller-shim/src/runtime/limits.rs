//! Rate limits: a flag's `RATE/s[,BURST]`, the token bucket, and a bucket
//! per source address for callers not yet authenticated.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A per-node token bucket: `RATE/s` with an optional burst
/// (`2/s,5` or `2/s burst 5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens per second.
    pub per_second: f64,
    /// Bucket size.
    pub burst: u32,
}

impl std::str::FromStr for RateLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a rate like 2/s or 2/s,5 (rate per second, burst)");
        let s2 = s.trim();
        let (rate, burst) = match s2.split_once(',') {
            Some((r, b)) => (r.trim(), Some(b.trim())),
            None => match s2.split_once("burst") {
                Some((r, b)) => (r.trim(), Some(b.trim())),
                None => (s2, None),
            },
        };
        let rate = rate.strip_suffix("/s").unwrap_or(rate).trim();
        let per_second: f64 = rate.parse().map_err(|_| bad())?;
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(bad());
        }
        let burst = match burst {
            Some(b) => b.parse::<u32>().map_err(|_| bad())?,
            None => (per_second.ceil() as u32).max(1),
        };
        if burst == 0 {
            return Err(bad());
        }
        Ok(Self { per_second, burst })
    }
}

/// A token bucket: `burst` tokens, refilled at `per_second`.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            refilled: now,
        }
    }

    /// Takes one token, or says how many seconds until one is available.
    pub fn take(&mut self, per_second: f64, burst: u32, now: Instant) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(f64::from(burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / per_second).ceil().max(1.0) as u64)
        }
    }

    /// Whether the bucket would be full at `now` (nothing to remember).
    pub fn is_full(&self, per_second: f64, burst: u32, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens + elapsed * per_second >= f64::from(burst)
    }
}

/// A [`TokenBucket`] per source address: what callers not yet
/// authenticated may cost (the TokenReviews of unknown tokens, on the
/// report API and on the status API, each with its own). At most
/// `sources` addresses are remembered; a full bucket is forgotten first,
/// and while every remembered address is still throttled (a flood from
/// many addresses) a new one is refused until some recover.
#[derive(Debug)]
pub struct SourceBuckets {
    per_second: f64,
    burst: u32,
    sources: usize,
    buckets: Mutex<HashMap<std::net::IpAddr, TokenBucket>>,
}

impl SourceBuckets {
    /// Buckets of `burst` refilled at `per_second`, for at most `sources`
    /// addresses.
    pub fn new(per_second: f64, burst: u32, sources: usize) -> Self {
        Self {
            per_second,
            burst,
            sources,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token from `source`'s bucket, or says how many seconds
    /// until one is available.
    pub fn take(&self, source: std::net::IpAddr, now: Instant) -> Result<(), u64> {
        let (rate, burst) = (self.per_second, self.burst);
        let mut buckets = self.buckets.lock().unwrap();
        if buckets.len() >= self.sources && !buckets.contains_key(&source) {
            buckets.retain(|_, b| !b.is_full(rate, burst, now));
            if buckets.len() >= self.sources {
                return Err(1);
            }
        }
        buckets
            .entry(source)
            .or_insert_with(|| TokenBucket::full(burst, now))
            .take(rate, burst, now)
    }
}
