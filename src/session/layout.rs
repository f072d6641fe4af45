//! Where logs live: `<root>/--<projectKey(cwd)>--/<encodeSegment(id)>/session.jsonl` (dsh §1.4),
//! plus validation of session ids before they touch a path.

use std::path::{Path, PathBuf};

/// File name of a raw (uncompressed) log inside its session directory.
pub(crate) const LOG_FILE: &str = "session.jsonl";
/// Directory for sessions without a cwd.
pub(crate) const NO_CWD_DIR: &str = "_no-cwd";

/// Checks that a session id is usable: 1..=128 characters, no control characters, not `.`/`..`.
/// Ids are also encoded before use, so this guards against hostile input reaching logs and errors.
pub(crate) fn validate_session_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("session id is empty".into());
    }
    if id.chars().count() > 128 {
        return Err(format!("session id is longer than 128 characters: {}…", truncate(id, 32)));
    }
    if id.chars().any(char::is_control) {
        return Err(format!("session id contains control characters: {id:?}"));
    }
    if id == "." || id == ".." || id.contains('/') || id.contains('\\') {
        return Err(format!("session id is not a plain name: {id:?}"));
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

const fn is_literal(c: u16) -> bool {
    matches!(c, 0x30..=0x39 | 0x41..=0x5A | 0x61..=0x7A) || c == b'_' as u16 || c == b'-' as u16
}

/// The bytes `encode_segment` keeps as they are (a literal or a dot), as a table: a catalog
/// index's load checks every byte of every id, and the branches of `is_literal` on the random mix
/// of digits and letters of a UUID were mispredicted at about every other byte.
const KEPT: [bool; 256] = {
    let mut kept = [false; 256];
    let mut b = 0;
    while b < 256 {
        kept[b] = is_literal(b as u16) || b == b'.' as usize;
        b += 1;
    }
    kept
};

/// Whether `dir` is `encode_segment(id)`, without building it when `id` needs no escape (every
/// id kin mints: a scan compares thousands).
pub(crate) fn is_segment_of(dir: &std::ffi::OsStr, id: &str) -> bool {
    // Every byte checked, without an early exit: no branch per byte.
    let plain = id != "." && id != ".." && id.bytes().fold(true, |kept, b| kept & KEPT[usize::from(b)]);
    if plain { dir.as_encoded_bytes() == id.as_bytes() } else { dir == std::ffi::OsStr::new(&encode_segment(id)) }
}

/// dsh `encodeSegment`: `[A-Za-z0-9_-]` and single interior dots stay literal; every other
/// UTF-16 unit becomes `~XXXX`. `.` and `..` as whole segments are escaped.
pub(crate) fn encode_segment(segment: &str) -> String {
    if segment == "." || segment == ".." {
        return segment.encode_utf16().map(|u| format!("~{u:04X}")).collect();
    }
    let mut out = String::with_capacity(segment.len());
    for unit in segment.encode_utf16() {
        if is_literal(unit) || unit == u16::from(b'.') {
            out.push(char::from(unit as u8));
        } else {
            out.push_str(&format!("~{unit:04X}"));
        }
    }
    out
}

/// A session's working directory as kin records and compares it: absolute, with `.`
/// components, repeated and trailing separators dropped and each `..` taking off the component
/// before it (lexically: a symlinked workspace keeps the path it was opened by). So
/// `/w/`, `/w/./` and `/w/x/..` are one workspace, listed and continued together.
pub(crate) fn workspace(cwd: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in cwd.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                // Above the root is the root.
                if out.parent().is_some() {
                    out.pop();
                }
            }
            Component::Prefix(_) | Component::RootDir | Component::Normal(_) => out.push(part),
        }
    }
    out
}

/// dsh `projectKey`: runs of `/`, `\` or `:` become one `-`, unsafe units are `~XXXX`-escaped,
/// leading `-` stripped (empty → `root`), truncated to 251 characters, wrapped as `--slug--`.
pub fn project_key(cwd: &str) -> String {
    let mut slug = String::new();
    let mut in_separator = false;
    for unit in cwd.encode_utf16() {
        let is_sep = unit == u16::from(b'/') || unit == u16::from(b'\\') || unit == u16::from(b':');
        if is_sep {
            if !in_separator {
                slug.push('-');
            }
            in_separator = true;
            continue;
        }
        in_separator = false;
        if is_literal(unit) || unit == u16::from(b'.') {
            slug.push(char::from(unit as u8));
        } else {
            slug.push_str(&format!("~{unit:04X}"));
        }
    }
    let slug = slug.trim_start_matches('-');
    let slug = if slug.is_empty() { "root" } else { slug };
    let slug: String = slug.chars().take(251).collect();
    format!("--{slug}--")
}

/// The directory holding one session's log.
pub(crate) fn session_dir(root: &Path, cwd: Option<&str>, id: &str) -> PathBuf {
    let project = match cwd {
        Some(cwd) => project_key(cwd),
        None => NO_CWD_DIR.to_string(),
    };
    root.join(project).join(encode_segment(id))
}

/// The log file of one session.
pub fn log_path(root: &Path, cwd: Option<&str>, id: &str) -> PathBuf {
    session_dir(root, cwd, id).join(LOG_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_kept_in_one_spelling() {
        for (given, kept) in [
            ("/w", "/w"),
            ("/w/", "/w"),
            ("//w//x/", "/w/x"),
            ("/w/./x/.", "/w/x"),
            ("/w/x/..", "/w"),
            ("/w/x/../../..", "/"),
            ("/", "/"),
        ] {
            assert_eq!(workspace(Path::new(given)), Path::new(kept), "{given}");
        }
    }

    #[test]
    fn project_key_collapses_separators_and_wraps() {
        assert_eq!(project_key("/home/me/proj"), "--home-me-proj--");
        assert_eq!(project_key("C:\\\\work//x"), "--C-work-x--");
        assert_eq!(project_key("/"), "--root--");
        assert_eq!(project_key("/a b"), "--a~0020b--");
    }

    #[test]
    fn encode_segment_escapes_dots_and_unsafe_units() {
        assert_eq!(encode_segment("abc-1_2.x"), "abc-1_2.x");
        assert_eq!(encode_segment(".."), "~002E~002E");
        assert_eq!(encode_segment("."), "~002E");
        assert_eq!(encode_segment("a/b"), "a~002Fb");
        assert_eq!(encode_segment("é"), "~00E9");
        assert_eq!(encode_segment("~"), "~007E");
    }

    /// `is_segment_of` (a table, no segment built for a plain id) says what comparing with
    /// `encode_segment` says, for every byte an id can start with and ids of every kind.
    #[test]
    fn is_segment_of_is_a_comparison_with_the_encoding() {
        let mut ids: Vec<String> = (0u8..=127).map(|b| format!("{}x", b as char)).collect();
        ids.extend((0u8..=127).map(|b| format!("a{}", b as char)));
        ids.extend(["", ".", "..", "...", "a.b", "é", "~", "00000000-0000-4000-8000-000000000001"].map(String::from));
        ids.extend(["A_b-9", "a b", "Z~0020", "~0020"].map(String::from));
        for id in &ids {
            let encoded = encode_segment(id);
            for dir in [id.as_str(), encoded.as_str(), "other", "~002E"] {
                assert_eq!(is_segment_of(std::ffi::OsStr::new(dir), id), dir == encoded, "{dir:?} for {id:?}");
            }
        }
    }

    #[test]
    fn hostile_ids_are_rejected() {
        for bad in ["", "..", ".", "a/b", "a\0b", "x\n"] {
            assert!(validate_session_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_session_id(&"a".repeat(129)).is_err());
        assert!(validate_session_id("11111111-1111-4111-8111-111111111111").is_ok());
    }

    #[test]
    fn long_cwd_is_truncated() {
        let key = project_key(&format!("/{}", "a".repeat(400)));
        assert_eq!(key.len(), 251 + 4);
    }
}
