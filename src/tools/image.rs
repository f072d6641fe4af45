//! What kin knows of images: the four formats models take (PNG, JPEG, GIF, WebP), told by their
//! signature rather than by a name or a declared type, the largest one kin passes on, and the
//! dsh block an image is recorded as (`{type: "image", mediaType, data}`, base64). `read` shows
//! image files this way and a prompt's images are recorded this way; each model adapter sends
//! them as its API takes images, or a placeholder when the route takes none.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// The largest image kin passes on, in bytes (3.75 MiB: 5 MiB of base64, the Anthropic limit).
pub(crate) const MAX_IMAGE_BYTES: usize = 3 * 1024 * 1024 + 768 * 1024;
/// `MAX_IMAGE_BYTES` as an error names it.
pub(crate) const MAX_IMAGE_SHOWN: &str = "3.75 MiB";

/// An image format models take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl Format {
    /// The media type models are told.
    pub(crate) fn media_type(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::Gif => "image/gif",
            Format::Webp => "image/webp",
        }
    }

    /// The format whose signature `bytes` start with, if any.
    pub(crate) fn sniff(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Format::Gif)
        } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some(Format::Webp)
        } else {
            None
        }
    }
}

/// The formats, as an error names them.
pub(crate) const FORMATS: &str = "PNG, JPEG, GIF or WebP";

/// The dsh image block of `bytes` in `format`.
pub(crate) fn block(format: Format, bytes: &[u8]) -> Value {
    json!({"type": "image", "mediaType": format.media_type(), "data": STANDARD.encode(bytes)})
}

/// Why base64 `data` cannot be passed on as an image, if it cannot: it is not base64, it is
/// larger than `MAX_IMAGE_BYTES`, or it is not one of the four formats. Otherwise its format.
pub(crate) fn check_base64(data: &str) -> Result<Format, String> {
    // Decoded length, from the base64 length, before decoding anything.
    let approx = data.len() / 4 * 3;
    if approx > MAX_IMAGE_BYTES + 3 {
        return Err(too_large(approx));
    }
    let bytes = STANDARD.decode(data.trim()).map_err(|e| format!("its data is not valid base64 ({e})"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_large(bytes.len()));
    }
    Format::sniff(&bytes).ok_or_else(|| format!("it is not a {FORMATS} image (its data starts with {})", hex(&bytes)))
}

fn too_large(bytes: usize) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    format!(
        "it is {:.2} MiB, more than the {:.2} MiB kin passes on to a model",
        bytes as f64 / MIB,
        MAX_IMAGE_BYTES as f64 / MIB
    )
}

/// The first bytes of `bytes` in hex, as an error shows them.
fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "nothing: it is empty".into();
    }
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// The placeholder a model that takes no images reads instead of one.
pub(crate) fn placeholder(media_type: &str) -> String {
    format!("[image {media_type}: not shown, this model takes no images]")
}

/// True for a dsh image block.
pub(crate) fn is_image(block: &Value) -> bool {
    block["type"] == "image"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_signature() {
        assert_eq!(Format::sniff(b"\x89PNG\r\n\x1a\n...."), Some(Format::Png));
        assert_eq!(Format::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Format::Jpeg));
        assert_eq!(Format::sniff(b"GIF89a.."), Some(Format::Gif));
        assert_eq!(Format::sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some(Format::Webp));
        assert_eq!(Format::sniff(b"RIFF\0\0\0\0WAVEfmt "), None, "a RIFF that is not WebP");
        assert_eq!(Format::sniff(b"<svg"), None);
    }

    #[test]
    fn base64_data_is_checked_for_format_size_and_encoding() {
        let png = STANDARD.encode(b"\x89PNG\r\n\x1a\nrest");
        assert_eq!(check_base64(&png), Ok(Format::Png));
        assert_eq!(
            check_base64("AAAA").unwrap_err(),
            "it is not a PNG, JPEG, GIF or WebP image (its data starts with 00 00 00)"
        );
        assert!(check_base64("not base64!").unwrap_err().starts_with("its data is not valid base64"));
        let huge = STANDARD.encode(vec![0u8; MAX_IMAGE_BYTES + 4]);
        assert!(check_base64(&huge).unwrap_err().contains("more than the 3.75 MiB"), "refused before decoding");
        let block = block(Format::Gif, b"GIF89a");
        assert_eq!(block, json!({"type": "image", "mediaType": "image/gif", "data": "R0lGODlh"}));
        assert!(is_image(&block));
        assert_eq!(format!("{:.2} MiB", MAX_IMAGE_BYTES as f64 / (1024.0 * 1024.0)), MAX_IMAGE_SHOWN);
    }
}
