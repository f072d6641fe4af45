//! Warnings about a log that cannot be written, rate-limited: a full disk fails every eager
//! write of every streaming session, so each log says so once per failure kind (the I/O error
//! kind: a full disk, a file-size limit, …) per minute, with the count of failures held back,
//! and once more when its writes work again.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long one warning stands for its kind.
const WINDOW: Duration = Duration::from_secs(60);

/// The warnings of one log.
#[derive(Debug, Default)]
pub(crate) struct WriteWarnings {
    kinds: HashMap<String, Window>,
    /// Failures since the last successful write.
    failures: u64,
}

#[derive(Debug)]
struct Window {
    since: Instant,
    held: u64,
}

/// What to log for a failure, if anything.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The first of its kind in this window; `held` were held back in the window before.
    Warn {
        held: u64,
    },
    Hold,
}

/// What became of the events a failed write was writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Kept in memory, written at the next attempt.
    Kept,
    /// Dropped: they were being accepted durably, and their sender hears they were not.
    Refused,
}

impl Fate {
    fn said(self) -> &'static str {
        match self {
            Fate::Kept => "its events are kept and written once writing works again",
            Fate::Refused => "the events being accepted were not kept, and their sender was told so",
        }
    }
}

impl WriteWarnings {
    /// A write of `path` failed with `error`; what it was writing met `fate`.
    pub(crate) fn failed(&mut self, path: &Path, error: &anyhow::Error, fate: Fate) {
        // A refusal is warned of apart from failures whose events are kept.
        let kind = match fate {
            Fate::Kept => failure_kind(error),
            Fate::Refused => format!("{} (refused)", failure_kind(error)),
        };
        if let Verdict::Warn { held } = self.judge(kind, Instant::now()) {
            let more =
                if held > 0 { format!(" ({held} more such failures in the last minute)") } else { String::new() };
            tracing::warn!(path = %path.display(), "cannot write the session log: {error:#}; {}{more}", fate.said());
        }
    }

    /// A write of `path` succeeded.
    pub(crate) fn succeeded(&mut self, path: &Path) {
        if self.failures > 0 {
            tracing::info!(path = %path.display(), "the session log is written again after {} failed writes", self.failures);
            self.failures = 0;
            self.kinds.clear();
        }
    }

    fn judge(&mut self, kind: String, now: Instant) -> Verdict {
        self.failures += 1;
        let window = self.kinds.entry(kind).or_insert(Window { since: now, held: u64::MAX });
        if window.held == u64::MAX {
            window.held = 0;
            return Verdict::Warn { held: 0 };
        }
        if now.duration_since(window.since) >= WINDOW {
            let held = window.held;
            *window = Window { since: now, held: 0 };
            return Verdict::Warn { held };
        }
        window.held += 1;
        Verdict::Hold
    }
}

/// The kind of a write failure: the I/O error kind of its cause, or `other`.
fn failure_kind(error: &anyhow::Error) -> String {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<std::io::Error>())
        .map_or_else(|| "other".to_string(), |io| format!("{:?}", io.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_kind_per_minute_with_the_count_held_back() {
        let mut warnings = WriteWarnings::default();
        let t0 = Instant::now();
        assert_eq!(warnings.judge("StorageFull".into(), t0), Verdict::Warn { held: 0 });
        for s in 1..60 {
            assert_eq!(warnings.judge("StorageFull".into(), t0 + Duration::from_secs(s)), Verdict::Hold);
        }
        assert_eq!(warnings.judge("FileTooLarge".into(), t0 + Duration::from_secs(5)), Verdict::Warn { held: 0 });
        assert_eq!(warnings.judge("StorageFull".into(), t0 + Duration::from_secs(60)), Verdict::Warn { held: 59 });
        assert_eq!(warnings.judge("StorageFull".into(), t0 + Duration::from_secs(61)), Verdict::Hold);
        assert_eq!(warnings.failures, 63);
        warnings.succeeded(Path::new("x"));
        assert_eq!(warnings.judge("StorageFull".into(), t0 + Duration::from_secs(62)), Verdict::Warn { held: 0 });
    }

    #[test]
    fn the_warning_says_what_became_of_the_events() {
        assert!(Fate::Kept.said().contains("kept and written once writing works again"));
        assert!(Fate::Refused.said().contains("not kept") && !Fate::Refused.said().contains("written once"));
    }

    #[test]
    fn the_kind_is_the_io_error_kind_of_the_cause() {
        let full = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::StorageFull)).context("appending to x");
        assert_eq!(failure_kind(&full), "StorageFull");
        assert_eq!(failure_kind(&anyhow::anyhow!("no file")), "other");
    }
}
