//! What `kin bench` says of the host beside its figures, so that a run in a slow hour can be
//! told from a regression: how long a fixed CPU workload took at the start (the same work on
//! every host), and the share of the machine's CPU time the hypervisor took over the run (steal,
//! from `/proc/stat`). On a shared virtual machine both have moved the same code's figures two to
//! three times (README, "The cold listing, run by run").

use std::time::{Duration, Instant};

/// The machine's CPU time counters, summed over its CPUs, in clock ticks: all of it, and what
/// the hypervisor took (steal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CpuTimes {
    total: u64,
    steal: u64,
}

impl CpuTimes {
    /// The counters now; `None` where `/proc/stat` cannot be read (not Linux).
    pub(super) fn now() -> Option<CpuTimes> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The percentage of the machine's CPU time stolen from `self` until `later`; `None` when no
    /// tick passed.
    pub(super) fn steal_until(self, later: CpuTimes) -> Option<f64> {
        let total = later.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let steal = later.steal.saturating_sub(self.steal);
        Some(100.0 * steal as f64 / total as f64)
    }
}

/// The counters of `/proc/stat`'s `cpu` line: user, nice, system, idle, iowait, irq, softirq,
/// steal (the guest times after them are already counted in user and nice).
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let steal = *fields.get(7)?;
    Some(CpuTimes { total: fields.iter().sum(), steal })
}

/// Lines the fixed workload parses.
const WORKLOAD_LINES: usize = 20_000;
/// What the fixed workload is, as the bench says it.
pub(super) const WORKLOAD: &str = "parsing 20,000 JSON lines on one thread, median of 5";

/// The fixed workload, on this thread: parsing `WORKLOAD_LINES` short JSON lines shaped like
/// session events. The median wall time of five runs.
pub(super) fn workload() -> Duration {
    let lines: Vec<String> = (0..WORKLOAD_LINES)
        .map(|i| {
            format!(r#"{{"seq":{i},"type":"assistant/chunk","data":{{"turn":1,"text":"a fixed workload, line {i}"}}}}"#)
        })
        .collect();
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let parsed = lines.iter().filter(|line| serde_json::from_str::<serde_json::Value>(line).is_ok()).count();
            assert_eq!(parsed, WORKLOAD_LINES, "every line of the fixed workload parses");
            started.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_read_from_the_cpu_line_as_a_share_of_all_cpu_time() {
        let before = "cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\nintr 1 2 3\n";
        let after = "cpu  150 0 70 900 10 0 5 65 7 0\ncpu0 75 0 35 450 5 0 2 33 7 0\n";
        let (before, after) = (parse(before).unwrap(), parse(after).unwrap());
        assert_eq!(before, CpuTimes { total: 1000, steal: 35 });
        // 200 ticks passed, 30 of them stolen; the guest time (7) is in user's already.
        assert_eq!(before.steal_until(after), Some(15.0));
        assert_eq!(after.steal_until(after), None, "no tick passed");
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7 8\n"), None, "only the machine's line counts");
        assert_eq!(parse("cpu  1 2 3 4 5 6 7\n"), None, "a kernel without steal");
        assert_eq!(parse("cpu  1 2 x 4 5 6 7 8\n"), None);
    }

    #[test]
    fn the_workload_parses_every_line_and_takes_time() {
        assert!(workload() > Duration::ZERO);
        // The text says the count the workload parses, with its thousands separated.
        let lines = WORKLOAD_LINES.to_string();
        let (thousands, rest) = lines.split_at(lines.len() - 3);
        assert!(WORKLOAD.starts_with(&format!("parsing {thousands},{rest} JSON lines")), "{WORKLOAD}");
    }
}
