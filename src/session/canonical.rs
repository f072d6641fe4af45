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

    pub(crate) fn is_done(&self) -> bool {
        self.at == self.text.len()
    }

    /// Reads `literal` if it comes next. Inlined, so that the comparison with each constant
    /// literal is made in place rather than by a call to `memcmp` (a tenth of an index's read).
    #[inline(always)]
    pub(crate) fn eat(&mut self, literal: &str) -> bool {
        let next = self.text.as_bytes()[self.at..].starts_with(literal.as_bytes());
        if next {
            self.at += literal.len();
        }
        next
    }

    /// Reads `literal`, which must come next.
    #[inline(always)]
    pub(crate) fn expect(&mut self, literal: &str) -> Option<()> {
        self.eat(literal).then_some(())
    }

    /// A string without escapes or control characters (whose value is its text), borrowed.
    pub(crate) fn string(&mut self) -> Option<&'a str> {
        self.expect("\"")?;
        let bytes = &self.text.as_bytes()[self.at..];
        // One pass to the closing quote, refusing an escape or a control character on the way.
        let end = special(bytes)?;
        if bytes[end] != b'"' {
            return None;
        }
        let value = &self.text[self.at..self.at + end];
        self.at += end + 1;
        Some(value)
    }

    /// The number after `key`, which must come next. Inlined, as `eat`.
    #[inline(always)]
    pub(crate) fn uint_after(&mut self, key: &str) -> Option<u64> {
        self.expect(key)?;
        self.uint()
    }

    /// The string after `key`, which must come next (as `string`). Inlined, as `eat`.
    #[inline(always)]
    pub(crate) fn string_after(&mut self, key: &str) -> Option<&'a str> {
        self.expect(key)?;
        self.string()
    }

    /// The string after `key` if `key` comes next (`Some(None)` if not), owned. Inlined, as `eat`.
    #[inline(always)]
    pub(crate) fn optional_string(&mut self, key: &str) -> Option<Option<String>> {
        if self.eat(key) { self.string().map(|s| Some(s.to_string())) } else { Some(None) }
    }

    /// A JSON object at the cursor, any JSON inside, as its text (serde_json finds where it ends,
    /// reading it as a `RawValue` does).
    pub(crate) fn raw_object(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        if !rest.starts_with('{') {
            return None;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<&serde_json::value::RawValue>();
        let value = values.next()?.ok()?;
        self.at += values.byte_offset();
        Some(value.get())
    }

    /// An unsigned integer as serde writes one: digits, no leading zero, within `u64`.
    pub(crate) fn uint(&mut self) -> Option<u64> {
        let bytes = &self.text.as_bytes()[self.at..];
        let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || (digits > 1 && bytes[0] == b'0') || bytes.get(digits) == Some(&b'.') {
            return None;
        }
        // Up to 19 digits fit a u64 whatever they are, so only a longer number is checked as it
        // is read (the index has a dozen numbers a line).
        let value = if digits < 20 {
            bytes[..digits].iter().fold(0u64, |value, &b| value * 10 + u64::from(b - b'0'))
        } else {
            bytes[..digits]
                .iter()
                .try_fold(0u64, |value, &b| value.checked_mul(10)?.checked_add(u64::from(b - b'0')))?
        };
        self.at += digits;
        Some(value)
    }
}

/// Where the first `"`, `\\` or control character of `bytes` is: eight bytes at a time (a
/// catalog index has eight strings a line, and a byte at a time was a fifth of reading it).
fn special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    // The bytes of `x` below `n` (n <= 0x80), each as its high bit: exact up to the first such
    // byte (a borrow from it may mark bytes above it, never one below).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let hits = below(x ^ (ONES * u64::from(b'"')), 1) | below(x ^ (ONES * u64::from(b'\\')), 1) | below(x, 0x20);
        if hits != 0 {
            // The lowest mark is a true one, whichever of the three tests made it.
            return Some(i * 8 + (hits.trailing_zeros() / 8) as usize);
        }
    }
    let done = bytes.len() - chunks.remainder().len();
    chunks.remainder().iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).map(|at| done + at)
}

/// A session header as `serde_json::to_string` writes one (fields in declaration order, absent
/// options left out), read at the cursor; `None` for any other text. Not validated: the caller
/// checks it as `SessionHeader::parse` does.
pub(crate) fn header(cursor: &mut Cursor<'_>) -> Option<SessionHeader> {
    let tag = SessionHeader::tag_of(cursor.string_after("{\"type\":")?);
    let version = cursor.uint_after(",\"version\":")?;
    let id = cursor.string_after(",\"id\":")?.to_string();
    let created_at = cursor.uint_after(",\"createdAt\":")?;
    let cwd = cursor.optional_string(",\"cwd\":")?;
    let parent_session = cursor.optional_string(",\"parentSession\":")?;
    let seed_length = if cursor.eat(",\"seedLength\":") { Some(cursor.uint()?) } else { None };
    let origin = cursor.optional_string(",\"origin\":")?;
    let delegation_depth = cursor.uint_after(",\"delegationDepth\":")?;
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

    /// A number is read as serde reads a `u64`: any length up to `u64::MAX`, no leading zero,
    /// not a fraction; the cursor stops after its digits.
    #[test]
    fn a_number_is_read_within_u64_or_not_at_all() {
        let read = |text: &str| {
            let mut cursor = Cursor::new(text);
            cursor.uint().map(|value| (value, cursor.at()))
        };
        assert_eq!(read("0,"), Some((0, 1)));
        assert_eq!(read("7]"), Some((7, 1)));
        assert_eq!(read("1234567890123456789"), Some((1_234_567_890_123_456_789, 19)));
        assert_eq!(read("9999999999999999999}"), Some((9_999_999_999_999_999_999, 19)));
        assert_eq!(read("18446744073709551615"), Some((u64::MAX, 20)));
        for refused in
            ["18446744073709551616", "99999999999999999999", "123456789012345678901", "01", "1.5", "", "-1", "x"]
        {
            assert_eq!(read(refused), None, "{refused}");
            assert!(serde_json::from_str::<u64>(refused).is_err(), "serde refuses {refused} too");
        }
    }

    #[test]
    fn the_first_quote_escape_or_control_byte_is_found_wherever_it_is() {
        let slow = |b: &[u8]| b.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        for len in 0..40 {
            for at in 0..=len {
                for special in [b'"', b'\\', 0, 0x1f, b'\n'] {
                    // Plain bytes, multi-byte UTF-8 among them, then the special one, then more
                    // specials that must not hide it.
                    let mut bytes: Vec<u8> = "aé~ 0x\u{7f}".bytes().cycle().take(len).collect();
                    if at < len {
                        bytes[at] = special;
                        bytes[at + 1..].fill(b'\\');
                    }
                    assert_eq!(super::special(&bytes), slow(&bytes), "{bytes:?}");
                }
            }
        }
        assert_eq!(super::special(&[0xff; 20]), None);
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
