//! tink-agent's wait between polls: cenkalti/backoff's ExponentialBackOff
//! with its defaults (0.5 s, x1.5, randomization 0.5) capped at 5 s. The
//! randomization matters: a rack of agents booted together would otherwise
//! poll the server in step for ever.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    pub initial: Duration,
    pub multiplier: f64,
    pub randomization: f64,
    pub max: Duration,
    current: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(500), 1.5, 0.5, Duration::from_secs(5))
    }
}

impl Backoff {
    pub fn new(initial: Duration, multiplier: f64, randomization: f64, max: Duration) -> Self {
        Backoff {
            initial,
            multiplier,
            randomization: randomization.clamp(0.0, 1.0),
            max,
            current: initial,
        }
    }

    /// The next wait, `u` in [0, 1) drawn by the caller (pure for tests).
    pub fn next_with(&mut self, u: f64) -> Duration {
        let delta = self.randomization * self.current.as_secs_f64();
        let low = self.current.as_secs_f64() - delta;
        let wait = Duration::from_secs_f64((low + u.clamp(0.0, 1.0) * 2.0 * delta).max(0.0));
        self.current = self.current.mul_f64(self.multiplier).min(self.max);
        wait
    }

    pub fn next_wait(&mut self) -> Duration {
        self.next_with(fastrand::f64())
    }

    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_within_the_randomization() {
        let mut b = Backoff::default();
        assert_eq!(b.next_with(0.5), Duration::from_millis(500));
        assert_eq!(b.next_with(0.0), Duration::from_millis(375)); // 750 - 50%
        assert_eq!(b.next_with(1.0), Duration::from_micros(1_687_500)); // 1125 + 50%
        for _ in 0..10 {
            b.next_with(0.5);
        }
        assert_eq!(b.next_with(0.5), Duration::from_secs(5));
        assert_eq!(b.next_with(1.0), Duration::from_millis(7500));
        b.reset();
        assert_eq!(b.next_with(0.5), Duration::from_millis(500));
    }
}
