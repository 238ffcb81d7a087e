//! The dashboard's rates and hourly counts, from the daemon's own
//! metrics: a sample of a few counters every [`EVERY`], an hour of them
//! kept, so a page costs no query and the counters cost nothing more.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

pub const EVERY: Duration = Duration::from_secs(10);
/// Samples kept: an hour, and one more for its start.
const KEEP: usize = 361;

/// The counters the dashboard shows, summed over their labels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub dhcp_replies: f64,
    pub tftp_transfers: f64,
    pub http_requests: f64,
    /// iPXE scripts served (a boot reached tinkerbox's script).
    pub boots: f64,
    /// Workflows that succeeded, and that failed or timed out.
    pub installs: f64,
    pub failures: f64,
}

/// The sum of every sample of metric `name` (its `_total` line in the
/// text format, any labels) in `text`.
fn sum(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| label.is_none_or(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The counters in a `/metrics` text.
pub fn read(text: &str) -> Counters {
    Counters {
        dhcp_replies: sum(text, "tinkerbox_dhcp_replies_total", None),
        tftp_transfers: sum(
            text,
            "tinkerbox_tftp_transfers_total",
            Some("result=\"started\""),
        ),
        http_requests: sum(text, "tinkerbox_http_requests_total", None),
        boots: sum(
            text,
            "tinkerbox_boot_requests_total",
            Some("what=\"script\""),
        ),
        installs: sum(
            text,
            "tinkerbox_workflow_states_total",
            Some("state=\"SUCCESS\""),
        ),
        failures: sum(
            text,
            "tinkerbox_workflow_states_total",
            Some("state=\"FAILED\""),
        ) + sum(
            text,
            "tinkerbox_workflow_states_total",
            Some("state=\"TIMEOUT\""),
        ),
    }
}

/// Samples, oldest first, each with its time in ms.
#[derive(Default)]
pub struct Samples(Mutex<VecDeque<(i64, Counters)>>);

/// What the dashboard prints.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Per second over the last minute (or since the first sample).
    pub dhcp_per_s: f64,
    pub tftp_per_s: f64,
    pub http_per_s: f64,
    /// In the last hour (or since the first sample).
    pub boots: f64,
    pub installs: f64,
    pub failures: f64,
    /// How far back the hourly counts reach, in minutes.
    pub minutes: i64,
}

impl Samples {
    pub fn push(&self, at_ms: i64, c: Counters) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back((at_ms, c));
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// The summary at `now` (the newest sample is the current counters).
    pub fn summary(&self) -> Summary {
        let q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(&(t1, c1)) = q.back() else {
            return Summary::default();
        };
        let minute_ago = q
            .iter()
            .find(|(t, _)| t1 - t <= 60_000)
            .copied()
            .unwrap_or((t1, c1));
        let (t0, c0) = minute_ago;
        let secs = ((t1 - t0) as f64 / 1000.0).max(1.0);
        let rate = |a: f64, b: f64| ((b - a) / secs).max(0.0);
        let (th, ch) = q.front().copied().unwrap_or((t1, c1));
        Summary {
            dhcp_per_s: rate(c0.dhcp_replies, c1.dhcp_replies),
            tftp_per_s: rate(c0.tftp_transfers, c1.tftp_transfers),
            http_per_s: rate(c0.http_requests, c1.http_requests),
            boots: c1.boots - ch.boots,
            installs: c1.installs - ch.installs,
            failures: c1.failures - ch.failures,
            minutes: (t1 - th) / 60_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\n\
tinkerbox_dhcp_replies_total{kind=\"dhcp.offer\",mode=\"reservation\"} 10\n\
tinkerbox_dhcp_replies_total{kind=\"dhcp.ack\",mode=\"reservation\"} 12\n\
tinkerbox_dhcp_replies_totally_other 99\n\
tinkerbox_tftp_transfers_total{result=\"started\"} 4\n\
tinkerbox_tftp_transfers_total{result=\"sent\"} 3\n\
tinkerbox_boot_requests_total{what=\"script\",code=\"200\"} 2\n\
tinkerbox_boot_requests_total{what=\"artifact\",code=\"200\"} 7\n\
tinkerbox_workflow_states_total{state=\"SUCCESS\"} 1\n\
tinkerbox_workflow_states_total{state=\"TIMEOUT\"} 1\n\
tinkerbox_workflow_states_total{state=\"FAILED\"} 2\n";

    #[test]
    fn counters_are_summed_over_their_labels() {
        let c = read(TEXT);
        assert_eq!(c.dhcp_replies, 22.0);
        assert_eq!(c.tftp_transfers, 4.0);
        assert_eq!(c.boots, 2.0);
        assert_eq!((c.installs, c.failures), (1.0, 3.0));
        assert_eq!(read("").dhcp_replies, 0.0);
    }

    #[test]
    fn rates_over_a_minute_counts_over_the_hour() {
        let s = Samples::default();
        assert_eq!(s.summary(), Summary::default());
        let c = |dhcp: f64, boots: f64| Counters {
            dhcp_replies: dhcp,
            boots,
            ..Counters::default()
        };
        // Two hours of samples every 10 s: only the last hour is kept.
        for i in 0..=720 {
            s.push(i * 10_000, c(i as f64 * 100.0, i as f64));
        }
        let m = s.summary();
        assert_eq!(m.dhcp_per_s, 10.0);
        assert_eq!(m.boots, 360.0);
        assert_eq!(m.minutes, 60);
        // A counter that went back (a restart) is no negative rate.
        s.push(7_210_000, c(0.0, 0.0));
        assert_eq!(s.summary().dhcp_per_s, 0.0);
    }
}
