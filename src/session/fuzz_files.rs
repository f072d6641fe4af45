//! Fuzzing entries for the two files kin keeps beside a sessions directory, the catalog index
//! and the directory memo (see `fuzz/`, and the unit tests below, which run them in CI): any
//! bytes are read as the file, once as they are and once under a first line whose count and
//! digest match them, so the entries themselves are read and not only the integrity check. A
//! read never panics; what a read accepts is written, and the file written is read back and
//! written again to the same bytes.

use std::path::{Path, PathBuf};

use super::{catalog_index, dir_memo};

/// `bytes` as the catalog index of an empty sessions directory (see the module comment): how
/// many of the two reads accepted the file.
#[doc(hidden)]
pub fn index_file(bytes: &[u8]) -> usize {
    INDEX.read_as(bytes)
}

/// `bytes` as the directory memo of an empty sessions directory (see the module comment): how
/// many of the two reads accepted the file.
#[doc(hidden)]
pub fn memo_file(bytes: &[u8]) -> usize {
    MEMO.read_as(bytes)
}

/// The catalog index.
const INDEX: File = File {
    place: catalog_index::path,
    head: ("kinCatalogIndex", catalog_index::INDEX_VERSION, "entries"),
    rewritten: index_rewritten,
};

/// The directory memo.
const MEMO: File =
    File { place: dir_memo::path, head: ("kinCatalogDirs", dir_memo::MEMO_VERSION, "dirs"), rewritten: memo_rewritten };

/// One of the two files: its place beside a sessions directory, its first line's version key,
/// the version kin writes and its count key, and the bytes of what a read of it gives, written
/// again (`None` when the read refuses it).
struct File {
    place: fn(&Path) -> Option<PathBuf>,
    head: (&'static str, u64, &'static str),
    rewritten: fn(&Path, &Path) -> Option<Vec<u8>>,
}

impl File {
    /// `bytes` as this file beside an empty sessions directory, as they are and under a first
    /// line that matches them: how many of the two reads accepted it. What a read accepts is
    /// written, and what is written reads back to the same bytes.
    fn read_as(&self, bytes: &[u8]) -> usize {
        let (_dir, root) = sessions_dir();
        let path = (self.place)(&root).expect("a sessions directory has a place beside it");
        let fixed = with_head(self.head, bytes);
        let mut accepted = 0;
        for text in [bytes, fixed.as_slice()] {
            std::fs::write(&path, text).expect("the file is written");
            if let Some(once) = (self.rewritten)(&root, &path) {
                accepted += 1;
                assert_eq!((self.rewritten)(&root, &path), Some(once), "a file kin wrote is read back as written");
            }
        }
        accepted
    }
}

/// A temp directory holding an empty sessions directory (the directory, kept alive, and its path).
fn sessions_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp directory");
    let root = dir.path().join("sessions");
    std::fs::create_dir(&root).expect("the sessions directory is made");
    (dir, root)
}

/// `body` under a first line with the version and its key, then the count of `body`'s lines
/// under its key and the digest of its bytes.
fn with_head((version_key, version, count_key): (&str, u64, &str), body: &[u8]) -> Vec<u8> {
    let lines = body.iter().filter(|&&b| b == b'\n').count();
    let digest = catalog_index::digest(body);
    let head = format!("{{\"{version_key}\":{version},\"{count_key}\":{lines},\"digest\":\"{digest}\"}}\n");
    [head.as_bytes(), body].concat()
}

/// The index beside `root` read and written again: the bytes written (`None`: the read refused it).
fn index_rewritten(root: &Path, index: &Path) -> Option<Vec<u8>> {
    let entries = catalog_index::load(root).ok()?;
    let mut projects: Vec<_> = entries.iter().collect();
    projects.sort_by(|a, b| a.0.cmp(b.0));
    let logs = projects.into_iter().flat_map(|(project, logs)| {
        logs.iter().map(move |(session, entry)| (project.as_os_str(), session.as_os_str(), entry.clone()))
    });
    catalog_index::write(root, logs).expect("what was read is written");
    Some(std::fs::read(index).expect("the index written is read"))
}

/// The memo beside `root` read and written again: the bytes written (`None`: the read refused it).
fn memo_rewritten(root: &Path, memo: &Path) -> Option<Vec<u8>> {
    let known = dir_memo::load(root).ok()?;
    dir_memo::write(root, &known).expect("what was read is written");
    Some(std::fs::read(memo).expect("the memo written is read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Index bodies as the fuzzer starts from them: an entry as kin writes one (with a title, a
    /// summary and its descriptors), one of each kind of damage, and garbage.
    #[test]
    fn index_files_of_every_kind_read_or_fail_cleanly_and_round_trip() {
        let header = r#"{"type":"session","version":0,"id":"c1","createdAt":5,"cwd":"/w","parentSession":"p","origin":"subagent","delegationDepth":1}"#;
        let line = r#"{"type":"subagent/descriptor","seq":2,"time":0,"data":{"version":2,"mode":"continuable","provider":"spawn","label":"a \"}\" label"}}"#;
        let entry = format!(
            r#"{{"project":"-w","session":"c1","len":4000,"mtime":[1700000000,5],"ctime":[1700000001,6],"header":{header},"title":{{"text":"T"}},"summary":{{"events":9,"surface":null,"pending":1,"discarded":0,"descriptors":[{{"seq":2,"line":{line}}}]}}}}"#
        );
        // Each body, and how many of its two reads (as it is, under a matching first line) take it.
        for (body, accepted) in [
            (format!("{entry}\n"), 1),
            // Two entries for one log: the scan takes one, the file is written with one.
            (format!("{entry}\n{entry}\n"), 1),
            // An entry in a session directory its header does not name is read and not used.
            (format!("{entry}\n{}\n", entry.replace("\"session\":\"c1\"", "\"session\":\"c2\"")), 1),
            (format!("{}\n", entry.replace("4000", "-1")), 0),
            (format!("{}\n", entry.replace(r#""T""#, r#""\ud800""#)), 0),
            (format!("{}\n", entry.replace(r#""events":9"#, r#""events":9,"more":1"#)), 0),
            // A descriptor line kept with spaces is read (and written as it is); one that is not
            // an object, or cut, is not.
            (format!("{}\n", entry.replace(r#""line":{"type""#, r#""line":{ "type""#)), 1),
            (format!("{}\n", entry.replace(r#""line":{"type""#, r#""line":"{\"type""#)), 0),
            (format!("{}\n", entry.replace(r#"label"}}"#, r#"label"}"#)), 0),
            (format!("{}\n", entry.replace(r#""ctime":[1700000001,6],"#, "")), 0),
            // Times out of range, one whose nanoseconds would carry past the largest second.
            (format!("{}\n", entry.replace("[1700000000,5]", "[18446744073709551615,1000000000]")), 0),
            (format!("{}\n", entry.replace("[1700000001,6]", "[1700000001,1000000000]")), 0),
            (format!("{}\n", entry.replace("[1700000001,6]", "[18446744073709551615,0]")), 0),
            (entry.clone(), 0),
            ("\n\n".into(), 0),
            ("{}\n".into(), 0),
            (String::new(), 1),
        ] {
            assert_eq!(index_file(body.as_bytes()), accepted, "{body}");
        }
        assert_eq!(index_file(&[0xff, b'\n', 0, b'{']), 0);
    }

    /// The same for the directory memo.
    #[test]
    fn memo_files_of_every_kind_read_or_fail_cleanly_and_round_trip() {
        let line = r#"{"dir":"-w","stamp":{"dev":1,"ino":2,"ctime":[3,4]},"sessions":"a/b"}"#;
        for (body, accepted) in [
            (format!("{line}\n"), 1),
            // Two entries for one directory.
            (format!("{line}\n{line}\n"), 0),
            (format!("{}\n", line.replace("a/b", "a//b")), 0),
            (format!("{}\n", line.replace("a/b", "a/./b")), 0),
            (line.to_string(), 0),
            ("\n".into(), 0),
            (String::new(), 1),
        ] {
            assert_eq!(memo_file(body.as_bytes()), accepted, "{body}");
        }
        assert_eq!(memo_file(&[0xff, b'\n', 0]), 0);
    }
}
