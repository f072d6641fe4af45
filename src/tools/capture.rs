//! Bounded capture of a stream: its first and last bytes and its length, however much passes
//! through, and the head-and-tail rendering with a note of how much was left out. `bash` keeps
//! its command output this way; an external agent's text and stderr are kept the same way.
//! `cut` keeps the head of a text already in memory with a note of the rest: a progress report,
//! and an error text from outside (an MCP server's, an external agent's, a provider's stream
//! error) at `MAX_ERROR_TEXT_BYTES`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

/// The most bytes kept of an error text from outside (an MCP server's error, an external agent's
/// JSON-RPC error or stop reason, a provider's stream error type or code) before it reaches the
/// model and the log; [`cut`] notes the rest.
pub(crate) const MAX_ERROR_TEXT_BYTES: usize = 4096;

/// `text` whole when it is at most `limit` bytes long; else its first bytes up to that (on a
/// character boundary) and a note of how many more it had.
pub(crate) fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let keep = (0..=limit).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
    format!("{}\n[... {} more bytes not shown ...]", &text[..keep], text.len() - keep)
}

/// `text` whole up to `limits.total()` bytes, else its head and tail with a note of how much was
/// left out, as a [`Capture`] of it renders them.
pub(crate) fn ends_of(text: &str, limits: Limits) -> String {
    if text.len() <= limits.total() {
        return text.to_string();
    }
    let mut capture = Capture::new(limits);
    capture.push(text.as_bytes());
    capture.render()
}

/// How much of a stream is kept: its first `head` and its last `tail` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) head: usize,
    pub(crate) tail: usize,
}

impl Limits {
    /// Output up to this length is kept whole.
    pub(crate) const fn total(self) -> usize {
        self.head + self.tail
    }
}

/// One stream's output, bounded: its first `limits.head` bytes, its last `limits.tail`, and its
/// length.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    limits: Limits,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
}

impl Capture {
    pub(crate) fn new(limits: Limits) -> Self {
        Capture { limits, head: Vec::new(), tail: VecDeque::new(), total: 0 }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total += data.len();
        let room = self.limits.head.saturating_sub(self.head.len());
        let (into_head, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(into_head);
        // Only the last `tail` bytes of a large push can stay.
        let rest = &rest[rest.len().saturating_sub(self.limits.tail)..];
        self.tail.extend(rest.iter().copied());
        let excess = self.tail.len().saturating_sub(self.limits.tail);
        self.tail.drain(..excess);
    }

    /// Bytes pushed so far.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Bytes dropped between head and tail.
    pub(crate) fn omitted(&self) -> usize {
        self.total - self.head.len() - self.tail.len()
    }

    /// The kept bytes after the head (the whole stream when nothing was dropped).
    pub(crate) fn tail_bytes(&self) -> Vec<u8> {
        self.tail.iter().copied().collect()
    }

    /// This stream alone as text, rendered like [`render`].
    pub(crate) fn render(&self) -> String {
        render(&[self], self.limits)
    }
}

pub(crate) fn lock(capture: &Mutex<Capture>) -> MutexGuard<'_, Capture> {
    capture.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn snapshot(capture: &Mutex<Capture>) -> Capture {
    lock(capture).clone()
}

/// Copies a pipe into `capture` until end of file (or a read error).
pub(crate) fn spawn_reader<R>(pipe: Option<R>, capture: Arc<Mutex<Capture>>) -> JoinHandle<()>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let Some(mut pipe) = pipe else {
            return;
        };
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            lock(&capture).push(&buf[..n]);
        }
    })
}

/// The streams concatenated as text; over `limits.total()`, only the first `limits.head` and
/// the last `limits.tail` bytes (on character boundaries) with a note of how much was left out.
/// Every part must keep at least `limits` (captured with limits as large or larger).
pub(crate) fn render(parts: &[&Capture], limits: Limits) -> String {
    let total: usize = parts.iter().map(|part| part.total).sum();
    if total <= limits.total() {
        let mut all = Vec::with_capacity(total);
        for part in parts {
            all.extend_from_slice(&part.head);
            all.extend(part.tail.iter());
        }
        return with_binary_note(as_text(&all));
    }
    let head = leading_bytes(parts, limits.head);
    let tail = trailing_bytes(parts, limits.tail);
    let head = &head[..utf8_prefix_len(&head)];
    let tail = &tail[utf8_start(&tail)..];
    let omitted = total - head.len() - tail.len();
    let (head, tail) = (as_text(head), as_text(tail));
    let binary = head.1 || tail.1;
    with_binary_note((format!("{}\n[... {omitted} bytes omitted ...]\n{}", head.0, tail.0), binary))
}

/// Output bytes as text, and whether they held binary data: a NUL byte is written `\0` (some
/// model APIs refuse a message holding one), bytes that are not UTF-8 as U+FFFD.
fn as_text(bytes: &[u8]) -> (String, bool) {
    let text = String::from_utf8_lossy(bytes);
    let binary = matches!(text, std::borrow::Cow::Owned(_)) || bytes.contains(&0);
    let text = if bytes.contains(&0) { text.replace('\0', "\\0") } else { text.into_owned() };
    (text, binary)
}

/// `text`, with a note when it held binary data (`as_text`).
fn with_binary_note((mut text, binary): (String, bool)) -> String {
    if binary {
        text.push_str(
            "\n[the output holds binary data: NUL bytes are shown as \\0, other bytes that are not UTF-8 as \u{fffd}]",
        );
    }
    text
}

/// The first `limit` bytes of the streams concatenated. Each stream keeps its first
/// `head >= limit` bytes, so they are always known.
fn leading_bytes(parts: &[&Capture], limit: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(limit);
    for part in parts {
        out.extend_from_slice(&part.head);
        if part.omitted() > 0 || out.len() >= limit {
            break;
        }
        out.extend(part.tail.iter());
        if out.len() >= limit {
            break;
        }
    }
    out.truncate(limit);
    out
}

/// The last `limit` bytes of the streams concatenated (each keeps its last `tail >= limit`).
fn trailing_bytes(parts: &[&Capture], limit: usize) -> Vec<u8> {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut len = 0;
    for part in parts.iter().rev() {
        let gap = part.omitted() > 0;
        let mut piece = if gap { Vec::new() } else { part.head.clone() };
        piece.extend(part.tail.iter());
        len += piece.len();
        pieces.push(piece);
        if gap || len >= limit {
            break;
        }
    }
    let mut out: Vec<u8> = pieces.into_iter().rev().flatten().collect();
    let excess = out.len().saturating_sub(limit);
    out.drain(..excess);
    out
}

/// Length of `bytes` without a character cut off at the end.
fn utf8_prefix_len(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        _ => bytes.len(),
    }
}

/// Offset of the first character start in `bytes` (skipping the rest of a cut character).
pub(crate) fn utf8_start(bytes: &[u8]) -> usize {
    bytes.iter().take(3).take_while(|byte| (**byte & 0xC0) == 0x80).count()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ends_of_keeps_a_short_text_whole_and_a_long_one_s_ends() {
        let limits = Limits { head: 4, tail: 3 };
        assert_eq!(ends_of("1234567", limits), "1234567");
        assert_eq!(ends_of("1234XXXX567", limits), "1234\n[... 4 bytes omitted ...]\n567");
    }

    use super::*;

    const LIMITS: Limits = Limits { head: 15_000, tail: 15_000 };

    #[test]
    fn capping_respects_character_boundaries_and_counts_omitted_bytes() {
        let mut stdout = Capture::new(LIMITS);
        let text = format!("a{}", "€".repeat(12_000));
        for chunk in text.as_bytes().chunks(7) {
            stdout.push(chunk);
        }
        let mut stderr = Capture::new(LIMITS);
        stderr.push(b"tail-end");
        let out = render(&[&stdout, &stderr], LIMITS);
        assert!(!out.contains('\u{FFFD}'), "a character was cut");
        assert!(out.starts_with("a€€"));
        assert!(out.ends_with("€€tail-end"));
        let (head, rest) = out.split_once("\n[... ").unwrap();
        let (count, tail) = rest.split_once(" bytes omitted ...]\n").unwrap();
        let omitted: usize = count.parse().unwrap();
        assert_eq!(head.len() + tail.len() + omitted, text.len() + "tail-end".len());
    }

    /// Binary output (NUL bytes, bytes that are not UTF-8) says so, and carries no NUL.
    #[test]
    fn binary_output_is_shown_without_nul_bytes_and_says_it_is_binary() {
        let mut stdout = Capture::new(LIMITS);
        stdout.push(b"a\0b\xff\n");
        let out = render(&[&stdout], LIMITS);
        assert!(out.starts_with("a\\0b\u{fffd}\n"), "{out:?}");
        assert!(!out.contains('\0'));
        assert!(
            out.ends_with(
                "[the output holds binary data: NUL bytes are shown as \\0, other bytes that are not UTF-8 as \u{fffd}]"
            ),
            "{out:?}"
        );
        let mut text = Capture::new(LIMITS);
        text.push("plain é text\n".as_bytes());
        assert_eq!(render(&[&text], LIMITS), "plain é text\n", "text says nothing of binary");
    }

    #[test]
    fn small_output_is_kept_whole() {
        let mut stdout = Capture::new(LIMITS);
        stdout.push(b"x".repeat(20_000).as_slice());
        let mut stderr = Capture::new(LIMITS);
        stderr.push(b"y".repeat(10_000).as_slice());
        let out = render(&[&stdout, &stderr], LIMITS);
        assert_eq!(out.len(), 30_000);
        assert!(out.starts_with('x') && out.ends_with('y'));
    }

    #[test]
    fn a_cut_text_keeps_whole_characters_and_says_how_much_it_left_out() {
        assert_eq!(cut("short", 5), "short");
        assert_eq!(cut("", 0), "");
        // `é` is two bytes: a cut inside it keeps the text before it.
        let text = format!("abc{}", "é".repeat(10));
        assert_eq!(cut(&text, 4), format!("abc\n[... {} more bytes not shown ...]", text.len() - 3));
        assert_eq!(cut(&text, 5), format!("abcé\n[... {} more bytes not shown ...]", text.len() - 5));
        let long = "x".repeat(MAX_ERROR_TEXT_BYTES * 10);
        let kept = cut(&long, MAX_ERROR_TEXT_BYTES);
        let note = format!("\n[... {} more bytes not shown ...]", MAX_ERROR_TEXT_BYTES * 9);
        assert_eq!(kept, format!("{}{note}", "x".repeat(MAX_ERROR_TEXT_BYTES)));
    }

    #[test]
    fn one_huge_push_keeps_only_its_ends() {
        let limits = Limits { head: 4, tail: 3 };
        let mut capture = Capture::new(limits);
        capture.push(b"0123456789");
        capture.push(b"abcdef");
        assert_eq!((capture.total(), capture.omitted(), capture.tail_bytes()), (16, 9, b"def".to_vec()));
        assert_eq!(capture.render(), "0123\n[... 9 bytes omitted ...]\ndef");
        let mut tail_only = Capture::new(Limits { head: 0, tail: 2 });
        tail_only.push(b"xyz");
        assert_eq!(tail_only.tail_bytes(), b"yz".to_vec());
    }
}
