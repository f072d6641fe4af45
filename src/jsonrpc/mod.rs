//! Newline-delimited JSON-RPC as kin reads it from a peer it does not trust (the editor on
//! stdin, an MCP server's stdout): frames of at most a given size, a longer one or one that is not
//! UTF-8 read on to its end and dropped with only its start kept ([`next_frame`]), and what that
//! start says of it — its id, whether it is a request or a response ([`Shape`]) — so the frame
//! can be answered instead of dropped unseen; and whether a frame is JSON at all ([`check_json`]).

mod shape;
mod valid;

use futures::io::{AsyncBufRead, AsyncBufReadExt};

pub(crate) use shape::Shape;
pub(crate) use valid::check_json;

/// Bytes of an oversize frame kept to recover its id.
pub(crate) const ID_PREFIX_BYTES: usize = 64 * 1024;

/// One frame read from the input.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    /// A frame within the limit, without its line ending.
    Line(String),
    /// A frame of `bytes` bytes, more than the limit; `prefix` is its start.
    Oversize { bytes: u64, prefix: Vec<u8> },
    /// A frame within the limit that is not UTF-8; `prefix` is its start.
    NotUtf8 { prefix: Vec<u8> },
}

/// Reads one newline-terminated frame, holding at most `max` bytes of it; `None` at the end of
/// the input.
pub(crate) async fn next_frame<R: AsyncBufRead + Unpin>(reader: &mut R, max: usize) -> std::io::Result<Option<Frame>> {
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    let mut oversize = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if bytes == 0 {
                return Ok(None);
            }
            break;
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let part = &available[..newline.unwrap_or(available.len())];
        if !oversize && buf.len() + part.len() > max {
            oversize = true;
            let room = ID_PREFIX_BYTES.saturating_sub(buf.len()).min(part.len());
            buf.extend_from_slice(&part[..room]);
            buf.truncate(ID_PREFIX_BYTES);
            buf.shrink_to_fit();
        } else if !oversize {
            buf.extend_from_slice(part);
        }
        bytes += part.len() as u64;
        let used = newline.map_or(available.len(), |end| end + 1);
        reader.consume_unpin(used);
        if newline.is_some() {
            break;
        }
    }
    if oversize {
        return Ok(Some(Frame::Oversize { bytes, prefix: buf }));
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    match String::from_utf8(buf) {
        Ok(line) => Ok(Some(Frame::Line(line))),
        Err(e) => {
            let mut prefix = e.into_bytes();
            prefix.truncate(ID_PREFIX_BYTES);
            Ok(Some(Frame::NotUtf8 { prefix }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::BufReader;

    fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        futures::executor::block_on(async {
            let mut reader = BufReader::with_capacity(16, input);
            let mut out = Vec::new();
            while let Some(frame) = next_frame(&mut reader, max).await.unwrap() {
                out.push(frame);
            }
            out
        })
    }

    #[test]
    fn frames_within_the_limit_pass_and_longer_ones_keep_only_a_prefix() {
        let long = format!("{{\"id\":7,\"method\":\"m\",\"params\":\"{}\"}}", "x".repeat(200_000));
        let input = format!("{{\"a\":1}}\r\n\n{long}\nlast");
        let got = frames(input.as_bytes(), 100_000);
        assert_eq!(got[0], Frame::Line("{\"a\":1}".into()));
        assert_eq!(got[1], Frame::Line(String::new()));
        let Frame::Oversize { bytes, prefix } = &got[2] else { panic!("{:?}", got[2]) };
        assert_eq!((*bytes, prefix.len()), (long.len() as u64, ID_PREFIX_BYTES));
        assert!(prefix.capacity() <= ID_PREFIX_BYTES, "{}", prefix.capacity());
        assert_eq!(got[3], Frame::Line("last".into()));
        assert_eq!(got.len(), 4);
        let got = frames(b"\xff\xfe{}\n{}\n", 100);
        assert!(matches!(&got[0], Frame::NotUtf8 { .. }), "{got:?}");
        assert_eq!(got[1], Frame::Line("{}".into()));
    }
}
