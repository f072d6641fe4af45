//! Runs every scenario under `scenarios/` (exact compare) and every recorded dsh fixture under
//! `../shared/conformance/dsh` (text compare), each reported by name. Without the fixtures the
//! test fails, unless `KIN_SKIP_DSH_FIXTURES=1` says to skip them (and it says so).

use std::path::{Path, PathBuf};

use kin::testkit::commands::scenario_dirs;
use kin::testkit::scenario::{Compare, RunOptions, run};

/// dsh fixtures whose feature belongs to a later issue, with the issue that brings it.
/// This list only shrinks: a listed fixture that starts passing fails the test until removed.
const EXPECTED_FAILURES: &[(&str, u32)] = &[];

/// The dsh fixtures' directory; panics when it is absent, unless `KIN_SKIP_DSH_FIXTURES=1`
/// (then `None`, after saying the fixtures are skipped).
fn dsh_fixtures() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/dsh");
    if root.is_dir() {
        return Some(root);
    }
    let skip = std::env::var("KIN_SKIP_DSH_FIXTURES").is_ok_and(|v| v == "1");
    assert!(
        skip,
        "{} is absent: link ../shared (or set KIN_SKIP_DSH_FIXTURES=1 to skip the dsh fixtures)",
        root.display()
    );
    eprintln!("SKIPPED: the dsh fixtures ({} is absent, KIN_SKIP_DSH_FIXTURES=1)", root.display());
    None
}

fn options(compare: Compare) -> RunOptions {
    RunOptions { exe: PathBuf::from(env!("CARGO_BIN_EXE_kin")), compare, update: false, out: None, record: false }
}

async fn run_all(dirs: Vec<PathBuf>, compare: Compare, expected_failures: &[(&str, u32)]) -> Vec<String> {
    let mut problems = Vec::new();
    for dir in dirs {
        let outcome = run(&dir, &options(compare)).await;
        let waiting = expected_failures.iter().find(|(name, _)| *name == outcome.name);
        match (outcome.passed, waiting) {
            (true, None) => eprintln!("scenario {} ... ok", outcome.name),
            (false, Some((_, issue))) => {
                eprintln!("scenario {} ... expected failure (waits for issue {issue})", outcome.name)
            }
            (true, Some((_, issue))) => problems.push(format!(
                "{} now passes: remove it from EXPECTED_FAILURES (it was waiting for issue {issue})",
                outcome.name
            )),
            (false, None) => problems.push(format!("{} FAILED:\n{}", outcome.name, outcome.report)),
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_scenarios_match_exactly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let dirs = scenario_dirs(&root).unwrap();
    // Every directory there is a scenario: none is passed over for lacking its input.json.
    let all = std::fs::read_dir(&root).unwrap().filter(|e| e.as_ref().unwrap().path().is_dir()).count();
    assert_eq!(dirs.len(), all, "a directory under scenarios/ without input.json");
    let problems = run_all(dirs, Compare::Exact, &[]).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsh_conformance_fixtures_match_text() {
    let Some(root) = dsh_fixtures() else { return };
    let dirs = scenario_dirs(&root).unwrap();
    for required in ["handshake", "text-turn", "cancel"] {
        assert!(dirs.iter().any(|d| d.ends_with(required)), "fixture {required} is missing");
        assert!(!EXPECTED_FAILURES.iter().any(|(n, _)| *n == required), "{required} must pass");
    }
    let problems = run_all(dirs, Compare::Text, EXPECTED_FAILURES).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
