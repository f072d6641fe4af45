//! An MCP `CallToolResult` (as its JSON) → a kin tool result. Text passes through; an image
//! becomes a dsh image block `{type: "image", mediaType, data}` (each model adapter passes it on
//! when its API takes images in tool results, and a short placeholder otherwise); an embedded
//! resource gives its text under its URI; a resource link its name and URI; audio and binary
//! resources a placeholder. `structuredContent` is used when `content` is empty (servers send
//! the same JSON as text otherwise). `isError: true` is a tool error. The text is capped.

use serde_json::{Value, json};

use crate::tools::{ToolError, ToolOutput, image};

/// The most text a result passes to the model; the rest is cut and the cut is said.
const MAX_TEXT: usize = 30_000;

/// The largest image (base64) passed on; a larger one becomes a placeholder.
const MAX_IMAGE_BASE64: usize = 1024 * 1024;
/// The most images one result passes on (each stays in every later request of the session), and
/// the most base64 they hold together; the others become placeholders.
const MAX_IMAGES: usize = 8;
const MAX_IMAGES_BASE64: usize = 4 * 1024 * 1024;

/// Accumulates blocks under the text and image budgets.
struct Blocks {
    blocks: Vec<Value>,
    text_left: usize,
    cut: usize,
    images: usize,
    image_bytes: usize,
}

impl Blocks {
    /// An image block, when the result's image budget holds it; else why it is not passed on.
    fn image(&mut self, mime: &str, data: &str) {
        let refused = if data.len() > MAX_IMAGE_BASE64 {
            Some(format!("{} bytes of base64, too large to pass on", data.len()))
        } else if self.images == MAX_IMAGES {
            Some(format!("not passed on: this result already passes on {MAX_IMAGES} images, the most one result does"))
        } else if self.image_bytes + data.len() > MAX_IMAGES_BASE64 {
            Some(format!(
                "not passed on: this result's images would pass {} bytes of base64, the most one result does",
                MAX_IMAGES_BASE64
            ))
        } else {
            // Passed on as `read` passes an image: one of the formats models take, told by its
            // bytes (not by the server's word), else a note of why not.
            match image::check_base64(data) {
                Ok(format) => {
                    self.images += 1;
                    self.image_bytes += data.len();
                    self.blocks.push(json!({"type": "image", "mediaType": format.media_type(), "data": data}));
                    None
                }
                Err(reason) => Some(format!("not passed on: {reason}")),
            }
        };
        if let Some(why) = refused {
            let mime: String = mime.chars().take(100).collect();
            self.text(&format!("[image {mime}: {why}]"));
        }
    }

    fn text(&mut self, text: &str) {
        if text.len() <= self.text_left {
            self.text_left -= text.len();
            self.blocks.push(json!({"type": "text", "text": text}));
            return;
        }
        let mut keep = self.text_left;
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        if keep > 0 {
            self.blocks.push(json!({"type": "text", "text": &text[..keep]}));
        }
        self.text_left -= keep;
        self.cut += text.len() - keep;
    }

    fn finish(mut self) -> Vec<Value> {
        if self.cut > 0 {
            let note = format!("\n[… {} more bytes of output cut]", self.cut);
            self.blocks.push(json!({"type": "text", "text": note}));
        }
        self.blocks
    }
}

fn describe_resource(resource: &Value) -> (String, Option<String>) {
    let uri = resource["uri"].as_str().unwrap_or("?");
    let mime = resource["mimeType"].as_str();
    match (resource["text"].as_str(), resource["blob"].as_str()) {
        (Some(text), _) => (format!("[resource {uri}]\n"), Some(text.to_string())),
        (None, Some(blob)) => (
            format!("[resource {uri} ({}): {} bytes of base64 data not shown]", mime.unwrap_or("binary"), blob.len()),
            None,
        ),
        (None, None) => (format!("[resource {uri}]"), None),
    }
}

/// The result of calling `tool` on `server`.
pub(super) fn map(result: &Value, server: &str, tool: &str) -> Result<ToolOutput, ToolError> {
    let mut out = Blocks { blocks: Vec::new(), text_left: MAX_TEXT, cut: 0, images: 0, image_bytes: 0 };
    let content = result["content"].as_array().map(Vec::as_slice).unwrap_or_default();
    for block in content {
        let text = |key: &str| block[key].as_str().unwrap_or_default();
        match block["type"].as_str().unwrap_or_default() {
            "text" => out.text(text("text")),
            "image" => out.image(text("mimeType"), text("data")),
            "audio" => out.text(&format!("[audio {}: not passed to the model]", text("mimeType"))),
            "resource" => {
                let (head, body) = describe_resource(&block["resource"]);
                out.text(&head);
                if let Some(body) = body {
                    out.text(&body);
                }
            }
            "resource_link" => {
                let name = serde_json::to_string(&block["name"]).unwrap_or_default();
                let uri = serde_json::to_string(&block["uri"]).unwrap_or_default();
                out.text(&format!("[resource_link name={name} uri={uri}]"));
            }
            other => out.text(&format!("[{other} content: not supported by kin]")),
        }
    }
    if content.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        out.text(&structured.to_string());
    }
    let blocks = out.finish();
    if result["isError"] == true {
        let message: Vec<&str> = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
        let message = match message.join("\n") {
            m if m.trim().is_empty() => format!("the MCP tool {server}/{tool} failed without a message"),
            m => m,
        };
        return Err(ToolError::named("McpToolError", "MCP_TOOL_ERROR", message));
    }
    let blocks = if blocks.is_empty() { vec![json!({"type": "text", "text": "(no output)"})] } else { blocks };
    Ok(ToolOutput { content: blocks, events: Vec::new(), meta: Some(json!({"mcp": {"server": server, "tool": tool}})) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(result: Value) -> Vec<Value> {
        map(&result, "s", "t").unwrap().content
    }

    #[test]
    fn text_images_and_resources() {
        let content = ok(json!({"content": [
            {"type": "text", "text": "Echo: hi"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "A"}},
            {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA"}},
            {"type": "resource_link", "uri": "file:///c", "name": "c"},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        ]}));
        assert_eq!(
            content,
            [
                json!({"type": "text", "text": "Echo: hi"}),
                json!({"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}),
                json!({"type": "text", "text": "[resource file:///a.txt]\n"}),
                json!({"type": "text", "text": "A"}),
                json!({"type": "text", "text": "[resource file:///b.bin (binary): 4 bytes of base64 data not shown]"}),
                json!({"type": "text", "text": "[resource_link name=\"c\" uri=\"file:///c\"]"}),
                json!({"type": "text", "text": "[audio audio/wav: not passed to the model]"}),
            ]
        );
        let output = map(&json!({"content": []}), "srv", "tool").unwrap();
        assert_eq!(output.meta, Some(json!({"mcp": {"server": "srv", "tool": "tool"}})));
        assert_eq!(output.content, [json!({"type": "text", "text": "(no output)"})]);
    }

    #[test]
    fn structured_content_only_without_content() {
        assert_eq!(
            ok(json!({"content": [], "structuredContent": {"n": 3}})),
            [json!({"type": "text", "text": "{\"n\":3}"})]
        );
        let both = ok(json!({"content": [{"type": "text", "text": "{\"n\": 3}"}], "structuredContent": {"n": 3}}));
        assert_eq!(both, [json!({"type": "text", "text": "{\"n\": 3}"})]);
    }

    #[test]
    fn is_error_is_a_tool_error() {
        let err = map(&json!({"content": [{"type": "text", "text": "no such city"}], "isError": true}), "w", "f")
            .unwrap_err();
        assert_eq!((err.code.as_str(), err.message.as_str()), ("MCP_TOOL_ERROR", "no such city"));
        let err = map(&json!({"isError": true}), "w", "f").unwrap_err();
        assert_eq!(err.message, "the MCP tool w/f failed without a message");
    }

    #[test]
    fn text_is_capped_and_the_cut_is_said() {
        let big = "x".repeat(MAX_TEXT + 500);
        let content = ok(json!({"content": [{"type": "text", "text": big}, {"type": "text", "text": "more"}]}));
        assert_eq!(content[0]["text"].as_str().unwrap().len(), MAX_TEXT);
        assert_eq!(content[1]["text"], "\n[… 504 more bytes of output cut]");
        let huge_image = "A".repeat(MAX_IMAGE_BASE64 + 1);
        let content = ok(json!({"content": [
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/jpeg"},
            {"type": "image", "data": "PHN2Zz48L3N2Zz4=", "mimeType": "image/svg+xml"},
            {"type": "image", "data": "not base64!", "mimeType": "image/png"},
        ]}));
        assert_eq!(
            content[0],
            json!({"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}),
            "its bytes tell"
        );
        let note = |i: usize| content[i]["text"].as_str().unwrap().to_string();
        assert!(note(1).starts_with("[image image/svg+xml: not passed on: it is not a "), "{}", note(1));
        assert!(note(2).starts_with("[image image/png: not passed on: its data is not valid base64"), "{}", note(2));
        let content = ok(json!({"content": [{"type": "image", "data": huge_image, "mimeType": "image/png"}]}));
        assert!(content[0]["text"].as_str().unwrap().contains("too large"), "{content:?}");
    }

    /// Every image stays in every later request of the session: one result passes on at most
    /// `MAX_IMAGES`, holding at most `MAX_IMAGES_BASE64` together; the rest are notes (under the
    /// text cap, so 5,000 of them are cut and the cut said).
    #[test]
    fn images_are_capped_in_number_and_size_per_result() {
        let png = "iVBORw0KGgo=";
        let many: Vec<Value> =
            (0..5000).map(|_| json!({"type": "image", "data": png, "mimeType": "image/png"})).collect();
        let content = ok(json!({"content": many}));
        assert_eq!(content.iter().filter(|b| b["type"] == "image").count(), MAX_IMAGES);
        let first_note = content[MAX_IMAGES]["text"].as_str().unwrap();
        assert!(first_note.contains(&format!("already passes on {MAX_IMAGES} images")), "{first_note}");
        let text: usize = content.iter().filter_map(|b| b["text"].as_str()).map(str::len).sum();
        assert!(text < MAX_TEXT + 100, "{text}");
        assert!(content.last().unwrap()["text"].as_str().unwrap().contains("more bytes of output cut"));
        // Large ones: as many as fit in the total.
        let big = format!("iVBORw0KGgoA{}", "A".repeat(MAX_IMAGE_BASE64 - 12));
        let large: Vec<Value> =
            (0..6).map(|_| json!({"type": "image", "data": big, "mimeType": "image/png"})).collect();
        let content = ok(json!({"content": large}));
        let passed = content.iter().filter(|b| b["type"] == "image").count();
        assert_eq!(passed, MAX_IMAGES_BASE64 / big.len());
        assert!(content[passed]["text"].as_str().unwrap().contains("bytes of base64, the most one result does"));
    }
}
