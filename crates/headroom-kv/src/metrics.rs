//! Prefix-cache statistics, as vLLM reports them: the hit rate over the
//! most recent 1,000 requests (tokens hit / tokens queried), and totals.
//! Lookups by preempted requests coming back are counted apart (as vLLM
//! 0.33 does), so that preemption does not inflate the hit rate.

use std::collections::VecDeque;

/// Requests in the sliding window of the hit rate.
pub const WINDOW: usize = 1000;

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    /// Lookups by requests that were preempted before.
    pub preempted_queried_tokens: u64,
    pub preempted_hit_tokens: u64,
    window: VecDeque<(u64, u64)>,
    window_queries: u64,
    window_hits: u64,
}

impl PrefixCacheStats {
    /// Records one lookup of `queried` tokens of which `hits` were cached.
    pub fn record(&mut self, queried: u64, hits: u64) {
        self.requests += 1;
        self.queried_tokens += queried;
        self.hit_tokens += hits;
        self.window.push_back((queried, hits));
        self.window_queries += queried;
        self.window_hits += hits;
        if self.window.len() > WINDOW {
            let (q, h) = self.window.pop_front().expect("non-empty");
            self.window_queries -= q;
            self.window_hits -= h;
        }
    }

    /// Records a lookup by a request that had been preempted.
    pub fn record_preempted(&mut self, queried: u64, hits: u64) {
        self.preempted_queried_tokens += queried;
        self.preempted_hit_tokens += hits;
    }

    /// Hit rate of the lookups by preempted requests.
    pub fn preempted_hit_rate(&self) -> f64 {
        ratio(self.preempted_hit_tokens, self.preempted_queried_tokens)
    }

    /// Hit rate over the last [`WINDOW`] requests (0 before any).
    pub fn recent_hit_rate(&self) -> f64 {
        ratio(self.window_hits, self.window_queries)
    }

    /// Hit rate over every request.
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hit_tokens, self.queried_tokens)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_forgets_old_requests() {
        let mut s = PrefixCacheStats::default();
        s.record(100, 100);
        for _ in 0..WINDOW {
            s.record(100, 0);
        }
        assert_eq!(s.recent_hit_rate(), 0.0);
        assert!((s.hit_rate() - 100.0 / 100_100.0).abs() < 1e-12);
    }
}
