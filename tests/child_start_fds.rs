//! Child starts that fail because the process is out of file descriptors (RLIMIT_NOFILE lowered
//! to just above what is open, one more descriptor each round) are refused cleanly and leave
//! nothing on disk: no header-only child logs, no empty session directories. Alone in its test
//! binary, as the limit applies to the whole process.

use std::path::{Path, PathBuf};

use kin::testkit::model::script::ReplayEntry;
use kin::testkit::model::text_response;
use kin::testkit::subagent::ErrorCode;

#[allow(dead_code)]
mod common;
use common::{parent, runtime, start_request, until};

fn nofile() -> libc::rlimit {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    limit
}

fn set_nofile(limit: libc::rlimit) {
    // SAFETY: setrlimit reads the struct it is given; lowering the soft limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

/// The soft limit that leaves exactly `free` descriptors to open: descriptors get the lowest
/// free numbers, so it is the number of the (`free` + 1)-th free one.
fn limit_leaving(free: u64) -> u64 {
    // SAFETY: F_GETFD on any number only reports whether it is an open descriptor.
    let is_open = |fd: u64| unsafe { libc::fcntl(fd as libc::c_int, libc::F_GETFD) } != -1;
    (0..).filter(|&fd| !is_open(fd)).nth(free as usize).unwrap()
}

/// Every session directory under the store, with the number of lines of its log (0: no log).
fn session_dirs(root: &Path) -> Vec<(PathBuf, usize)> {
    let mut out = Vec::new();
    for project in std::fs::read_dir(root).unwrap().flatten() {
        for session in std::fs::read_dir(project.path()).unwrap().flatten() {
            let log = session.path().join("session.jsonl");
            let lines = std::fs::read_to_string(&log).map(|t| t.lines().count()).unwrap_or(0);
            out.push((session.path(), lines));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_starts_out_of_file_descriptors_leave_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let rounds = 16;
    let answers = (0..rounds).map(|_| ReplayEntry::Chunks(text_response(&["done"]))).collect();
    let (rt, _) = runtime(dir.path(), answers, "");
    let (parent_id, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let sessions = dir.path().join("sessions");
    let original = nofile();
    let (mut failed, mut started) = (0, Vec::new());
    for extra in 0..rounds {
        let soft = limit_leaving(extra);
        set_nofile(libc::rlimit { rlim_cur: soft.min(original.rlim_cur), rlim_max: original.rlim_max });
        let result = manager.start("spawn", format!("child {extra}"), start_request(&caller, "go")).await;
        set_nofile(original);
        match result {
            Ok((id, _)) => started.push(id),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::Infrastructure, "{e}");
                failed += 1;
            }
        }
        // Whatever happened, no session directory is empty or holds a header-only log.
        for (path, lines) in session_dirs(&sessions) {
            assert!(lines > 1 || path.ends_with(&parent_id), "round {extra}: {} has {lines} lines", path.display());
        }
    }
    assert!(failed > 0, "no start ran out of descriptors");
    assert!(!started.is_empty(), "no start succeeded once descriptors were available");
    until("every started child to settle", || started.iter().all(|id| !manager.is_resident(id))).await;
    rt.shutdown().await;
    let dirs = session_dirs(&sessions);
    assert_eq!(dirs.len(), 1 + started.len(), "the parent and the started children only: {dirs:?}");
}
