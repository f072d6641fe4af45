//! Hostile files where child logs should be: a directory, a FIFO, a symlink out of the
//! workspace, a 1 GB file of garbage. Listing and `kin sessions check` refuse or diagnose each,
//! never follow the symlink, never hang, and healthy siblings still list.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kin::testkit::session::query::{SessionQuery, StoreSource};
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::subagent::catalog::{ListEntry, list_children};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const CWD: &str = "/hostile/project";

fn child_header(id: &str, parent: &str) -> SessionHeader {
    let mut header = SessionHeader::new(id, 5, Some(CWD.into()));
    header.parent_session = Some(parent.into());
    header.origin = Some("subagent".into());
    header.delegation_depth = 1;
    header
}

/// The log path a child with `id` would have, with its directory created.
fn slot(root: &Path, id: &str) -> PathBuf {
    let path = kin::testkit::session::layout::log_path(root, Some(CWD), id);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    path
}

fn build(root: &Path) -> (String, String) {
    let store = SessionStore::new(root);
    let parent = "aaaaaaaa-0000-4000-8000-00000000000a".to_string();
    let mut p = store.create(SessionHeader::new(parent.clone(), 1, Some(CWD.into()))).unwrap();
    p.flush().unwrap();
    let healthy = "aaaaaaaa-0000-4000-8000-00000000000b".to_string();
    let descriptor = Event {
        kind: "subagent/descriptor".into(),
        seq: 0,
        time: 0,
        data: json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "healthy"}).into(),
        source_event_seqs: None,
        surface_op: None,
    };
    let mut c = store.create_seeded(child_header(&healthy, &parent), vec![descriptor]).unwrap();
    c.flush().unwrap();
    // A directory, a FIFO, a symlink to a file outside, and a sparse 1 GB file of zeros.
    std::fs::create_dir_all(slot(root, "bad-dir")).unwrap();
    let fifo = slot(root, "bad-fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let outside = root.parent().unwrap().join("outside.jsonl");
    let header = serde_json::to_string(&child_header("bad-link", &parent)).unwrap();
    std::fs::write(&outside, format!("{header}\n{{\"type\":\"subagent/descriptor\",\"seq\":0,\"time\":0,\"data\":{{\"version\":2,\"mode\":\"continuable\",\"provider\":\"spawn\",\"label\":\"followed!\"}}}}\n")).unwrap();
    std::os::unix::fs::symlink(&outside, slot(root, "bad-link")).unwrap();
    let big = std::fs::File::create(slot(root, "bad-big")).unwrap();
    big.set_len(1 << 30).unwrap();
    (parent, healthy)
}

#[test]
fn hostile_child_logs_are_refused_and_siblings_still_list() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sessions");
    let (parent, healthy) = build(&root);
    let started = Instant::now();
    let query = SessionQuery::new(StoreSource::persisted_only(SessionStore::new(&root)));
    let listed = list_children(Some(&query), &parent, &CancellationToken::new()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "listing must not hang");
    let ids: Vec<&str> = listed
        .iter()
        .map(|e| match e {
            ListEntry::Child { id, .. } | ListEntry::Diagnostic { id, .. } => id.as_str(),
        })
        .collect();
    assert!(ids.contains(&healthy.as_str()), "{listed:?}");
    for entry in &listed {
        if let ListEntry::Child { label, .. } = entry {
            assert_ne!(label.as_deref(), Some("followed!"), "the symlink was followed");
        }
    }
    // inspect refuses each hostile log with a clear reason instead of following or blocking.
    let store = SessionStore::new(&root);
    for (id, reason) in [("bad-fifo", "not a regular file"), ("bad-link", "symlink"), ("bad-dir", "")] {
        let started = Instant::now();
        let err = store.inspect(id).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(started.elapsed() < Duration::from_secs(5), "{id} blocked");
        assert!(!err.is_empty() && err.contains(reason), "{id}: {err}");
    }
}

#[test]
fn sessions_check_reports_hostile_logs_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sessions");
    build(&root);
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kin"))
        .args(["sessions", "check", "--config", "/dev/null", "--sessions"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(60), "check must not hang");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "damage is reported with a failing status");
    assert!(text.contains("bad-fifo") && text.contains("not a regular file"), "{text}");
    assert!(text.contains("bad-link") && text.contains("symlink"), "{text}");
    assert!(text.contains("bad-big"), "{text}");
    assert!(text.lines().filter(|l| l.starts_with("ok")).count() >= 2, "healthy logs still check ok: {text}");
}
