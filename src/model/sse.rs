//! The event stream (`text/event-stream`, SSE) of a model response, cut into events in one pass
//! over its bytes as they arrive.
//!
//! The framing of the WHATWG spec, the part model APIs use: lines end in CRLF, LF or CR; a line
//! starting with `:` is a comment (a keep-alive); `name: value` sets the event's `event` name or
//! adds a `data` line (one space after the colon is dropped; a line without a colon is a name
//! with an empty value; `id`, `retry` and unknown names are ignored, kin does not reconnect); a
//! blank line ends the event, which is dispatched if it had data (its last newline dropped, the
//! name `message` when none was given). A leading byte-order mark is skipped. A line is decoded
//! once it is complete, so a character split between two network reads is fine, and a line that
//! is not UTF-8 fails the stream. An event the stream ends in the middle of is dropped, as the
//! spec says (the decoder then reports the response incomplete).
//!
//! Each byte is looked at a fixed number of times, and nothing is allocated per event: the one
//! event's buffers are reused. (`eventsource-stream`, used before, copied the rest of its buffer
//! after every line, so a read of N lines cost N² and a finely streamed turn spent a third of its
//! CPU moving memory; `sse-stream` refuses lines the spec allows.) What an unfinished event holds
//! — its data so far and a partial line — is capped: past the cap the stream fails instead of
//! buffering without bound.

/// One dispatched event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` name (`message` when the event gave none).
    pub event: String,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

/// Why the stream cannot be read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SseError {
    /// A line is not UTF-8.
    NotUtf8,
    /// An unfinished event holds more than the cap.
    Oversize,
}

/// The parser: feed it each piece of the body in order with [`EventStream::next`].
#[derive(Debug)]
pub(crate) struct EventStream {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The event being read (or, after `dispatched`, the one last returned).
    event: Event,
    /// `event` was returned: clear it before reading on.
    dispatched: bool,
    /// The last line ended in CR: an LF first in the next piece belongs to it.
    after_cr: bool,
    /// Nothing read yet (a byte-order mark may come first).
    at_start: bool,
    /// The most an unfinished event may hold, in bytes.
    limit: usize,
}

impl EventStream {
    /// A parser for one response whose unfinished event may hold up to `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        EventStream {
            partial: Vec::new(),
            event: Event::default(),
            dispatched: false,
            after_cr: false,
            at_start: true,
            limit,
        }
    }

    /// Reads `bytes` (advancing it) up to the end of the next complete event and returns that
    /// event, or `None` once `bytes` is used up; an unfinished line or event is kept for the next
    /// piece.
    pub(crate) fn next(&mut self, bytes: &mut &[u8]) -> Result<Option<&Event>, SseError> {
        if std::mem::take(&mut self.dispatched) {
            self.event.event.clear();
            self.event.data.clear();
        }
        loop {
            if self.after_cr && !bytes.is_empty() {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    *bytes = &bytes[1..];
                }
            }
            let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') else {
                if self.partial.len() + bytes.len() + self.event.data.len() > self.limit {
                    return Err(SseError::Oversize);
                }
                self.partial.extend_from_slice(bytes);
                *bytes = &[];
                return Ok(None);
            };
            self.after_cr = bytes[end] == b'\r';
            let (line, rest) = (&bytes[..end], &bytes[end + 1..]);
            *bytes = rest;
            let ends_event = if self.partial.is_empty() {
                self.line(line)?
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                let ends_event = self.line(&whole);
                whole.clear();
                self.partial = whole;
                ends_event?
            };
            if ends_event {
                if self.event.data.is_empty() {
                    self.event.event.clear();
                    continue;
                }
                self.event.data.pop();
                if self.event.event.is_empty() {
                    self.event.event.push_str("message");
                }
                self.dispatched = true;
                return Ok(Some(&self.event));
            }
        }
    }

    /// Takes one complete line into the event; true when it is the blank line that ends it.
    fn line(&mut self, mut line: &[u8]) -> Result<bool, SseError> {
        if std::mem::take(&mut self.at_start) {
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        if line.is_empty() {
            return Ok(true);
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        let (name, value) = match line.split_once(':') {
            Some(("", _)) => return Ok(false),
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "data" => {
                if self.event.data.len() + value.len() + 1 > self.limit {
                    return Err(SseError::Oversize);
                }
                self.event.data.push_str(value);
                self.event.data.push('\n');
            }
            "event" => {
                self.event.event.clear();
                self.event.event.push_str(value);
            }
            _ => {}
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `pieces` fed in order, as (name, data).
    fn events(pieces: &[&[u8]]) -> Result<Vec<(String, String)>, SseError> {
        let mut stream = EventStream::new(1 << 20);
        let mut got = Vec::new();
        for piece in pieces {
            let mut rest = *piece;
            while let Some(event) = stream.next(&mut rest)? {
                got.push((event.event.clone(), event.data.clone()));
            }
            assert!(rest.is_empty());
        }
        Ok(got)
    }

    fn pair(name: &str, data: &str) -> (String, String) {
        (name.into(), data.into())
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ends() {
        let body = b"data: a\n\nevent: delta\r\ndata: b\r\ndata:c\r\n\r\ndata:  d\r\rx\revent: e\rdata\r\r";
        assert_eq!(
            events(&[body]).unwrap(),
            vec![pair("message", "a"), pair("delta", "b\nc"), pair("message", " d"), pair("e", "")]
        );
    }

    #[test]
    fn any_cut_of_the_body_gives_the_same_events() {
        let body =
            "\u{feff}: keep-alive\n\nevent: x\r\ndata: héllo 😀\r\n\r\nid: 7\nretry: 10\ndata\n\ndata: [DONE]\n\n";
        let whole = events(&[body.as_bytes()]).unwrap();
        assert_eq!(whole, vec![pair("x", "héllo 😀"), pair("message", ""), pair("message", "[DONE]")]);
        let bytes = body.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(events(&[&bytes[..cut], &bytes[cut..]]).unwrap(), whole, "cut at {cut}");
        }
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(events(&bytewise).unwrap(), whole);
    }

    #[test]
    fn comments_and_events_without_data_dispatch_nothing() {
        assert_eq!(events(&[b": ping\n\nevent: lonely\n\n:x\ndata: y\n\n"]).unwrap(), vec![pair("message", "y")]);
    }

    #[test]
    fn an_event_the_stream_ends_in_is_not_dispatched() {
        assert_eq!(events(&[b"data: done\n\ndata: half"]).unwrap(), vec![pair("message", "done")]);
        assert_eq!(events(&[b"data: done\n\ndata: whole line\n"]).unwrap(), vec![pair("message", "done")]);
    }

    #[test]
    fn a_line_that_is_not_utf8_fails_the_stream() {
        assert_eq!(events(&[b"data: \xff\xfe\n\n"]), Err(SseError::NotUtf8));
    }

    #[test]
    fn an_unfinished_event_past_the_cap_fails_the_stream() {
        let mut stream = EventStream::new(16);
        let mut line: &[u8] = b"data: 0123456789abcdef";
        assert_eq!(stream.next(&mut line), Err(SseError::Oversize));
        let mut stream = EventStream::new(16);
        let mut lines: &[u8] = b"data: 0123456\ndata: 789abcdef\n";
        assert_eq!(stream.next(&mut lines), Err(SseError::Oversize));
        // Complete events do not add up: each is within the cap.
        let mut stream = EventStream::new(16);
        let mut many: &[u8] = b"data: 0123456789\n\ndata: 0123456789\n\n";
        assert_eq!(stream.next(&mut many).unwrap().map(|e| e.data.clone()).as_deref(), Some("0123456789"));
        assert_eq!(stream.next(&mut many).unwrap().map(|e| e.data.clone()).as_deref(), Some("0123456789"));
    }
}
