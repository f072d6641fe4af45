//! A reader of the compact JSON kin itself writes (serde's field order, no whitespace, strings
//! without escapes), for lines read by the thousand: a catalog index entry and the session
//! header inside it. It accepts only that exact shape and says `None` to anything else, which
//! the caller then parses with serde; whatever it accepts, serde reads as the same value (the
//! tests compare the two), so it changes no result, only the cost of the common case.

use super::record::SessionHeader;

/// A position in a text of canonical JSON.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Cursor { text, at: 0 }
    }

    /// Where the cursor is, in bytes from the start.
    pub(crate) fn at(&self) -> usize {
        self.at
    }

    /// The text not read yet.
    pub(crate) fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    pub(crate) fn is_done(&self) -> bool {
        self.at == self.text.len()
    }

    /// Reads `literal` if it comes next.
    pub(crate) fn eat(&mut self, literal: &str) -> bool {
        let next = self.text.as_bytes()[self.at..].starts_with(literal.as_bytes());
        if next {
            self.at += literal.len();
        }
        next
    }

    /// Reads `literal`, which must come next.
    pub(crate) fn expect(&mut self, literal: &str) -> Option<()> {
        self.eat(literal).then_some(())
    }

    /// A string without escapes or control characters (whose value is its text), borrowed.
    pub(crate) fn string(&mut self) -> Option<&'a str> {
        self.expect("\"")?;
        let bytes = &self.text.as_bytes()[self.at..];
        let end = memchr::memchr(b'"', bytes)?;
        // Every byte checked, without an early exit (no branch per byte).
        if bytes[..end].iter().fold(false, |bad, &b| bad | (b == b'\\') | (b < 0x20)) {
            return None;
        }
        let value = &self.text[self.at..self.at + end];
        self.at += end + 1;
        Some(value)
    }

    /// An unsigned integer as serde writes one: digits, no leading zero, within `u64`.
    pub(crate) fn uint(&mut self) -> Option<u64> {
        let bytes = &self.text.as_bytes()[self.at..];
        let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || (digits > 1 && bytes[0] == b'0') || bytes.get(digits) == Some(&b'.') {
            return None;
        }
        let mut value = 0u64;
        for &b in &bytes[..digits] {
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        }
        self.at += digits;
        Some(value)
    }
}

/// A session header as `serde_json::to_string` writes one (fields in declaration order, absent
/// options left out), read at the cursor; `None` for any other text. Not validated: the caller
/// checks it as `SessionHeader::parse` does.
pub(crate) fn header(cursor: &mut Cursor<'_>) -> Option<SessionHeader> {
    let string =
        |c: &mut Cursor<'_>, key: &str| if c.eat(key) { c.string().map(|s| Some(s.to_string())) } else { Some(None) };
    cursor.expect("{\"type\":")?;
    let tag = SessionHeader::tag_of(cursor.string()?);
    cursor.expect(",\"version\":")?;
    let version = cursor.uint()?;
    cursor.expect(",\"id\":")?;
    let id = cursor.string()?.to_string();
    cursor.expect(",\"createdAt\":")?;
    let created_at = cursor.uint()?;
    let cwd = string(cursor, ",\"cwd\":")?;
    let parent_session = string(cursor, ",\"parentSession\":")?;
    let seed_length = if cursor.eat(",\"seedLength\":") { Some(cursor.uint()?) } else { None };
    let origin = string(cursor, ",\"origin\":")?;
    cursor.expect(",\"delegationDepth\":")?;
    let delegation_depth = cursor.uint()?;
    cursor.expect("}")?;
    Some(SessionHeader { tag, version, id, created_at, cwd, parent_session, seed_length, origin, delegation_depth })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast reading of `text`, if it takes it whole.
    fn fast(text: &str) -> Option<SessionHeader> {
        let mut cursor = Cursor::new(text);
        header(&mut cursor).filter(|_| cursor.is_done())
    }

    fn serde(text: &str) -> Option<SessionHeader> {
        serde_json::from_str(text).ok()
    }

    #[test]
    fn what_serde_writes_is_read_as_serde_reads_it() {
        let mut child = SessionHeader::new("c-1", 17, Some("/w/a b}c".into()));
        child.parent_session = Some("p".into());
        child.seed_length = Some(12);
        child.origin = Some("subagent".into());
        child.delegation_depth = 2;
        let mut bare = SessionHeader::new("0", 0, None);
        bare.created_at = u64::MAX;
        for h in [SessionHeader::new("a", 1, Some("/x".into())), child, bare] {
            let text = serde_json::to_string(&h).unwrap();
            assert_eq!(fast(&text), Some(h), "{text}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        let good = r#"{"type":"session","version":0,"id":"a","createdAt":1,"cwd":"/x","delegationDepth":0}"#;
        assert!(fast(good).is_some());
        let other = [
            // What serde reads too, only not in kin's own shape: fast says no, serde decides.
            r#"{"type":"session","version":0,"id":"a\u0062","createdAt":1,"delegationDepth":0}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":1,"cwd":null,"delegationDepth":0}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":1}"#,
            r#"{"version":0,"type":"session","id":"a","createdAt":1,"delegationDepth":0}"#,
            r#"{"type":"session", "version":0,"id":"a","createdAt":1,"delegationDepth":0}"#,
            // What serde refuses.
            r#"{"type":"session","version":0,"id":"a","createdAt":01,"delegationDepth":0}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":1.5,"delegationDepth":0}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":18446744073709551616,"delegationDepth":0}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":-1,"delegationDepth":0}"#,
            "{\"type\":\"session\",\"version\":0,\"id\":\"a\tb\",\"createdAt\":1,\"delegationDepth\":0}",
            r#"{"type":"session","version":0,"id":"a","createdAt":1,"delegationDepth":0,"extra":1}"#,
            r#"{"type":"session","version":0,"id":"a","createdAt":1,"delegationDepth":0"#,
            r#"{"type":"session","version":0,"id":"a,"createdAt":1,"delegationDepth":0}"#,
        ];
        for text in other {
            assert_eq!(fast(text), None, "{text}");
        }
        // Whatever fast takes, serde takes as the same header; every cut of a good line too.
        for text in other.iter().copied().chain((0..good.len()).map(|n| &good[..n])) {
            if let Some(h) = fast(text) {
                assert_eq!(serde(text), Some(h), "{text}");
            }
        }
    }
}
