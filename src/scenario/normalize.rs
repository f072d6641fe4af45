//! Normalisation of transcripts and logs so runs compare across machines and times: request ids
//! renumbered by first appearance, every UUID → `{{sessionId}}`, every spelling of the cwd →
//! `{{cwd}}`, and log times → 0.

use std::collections::HashMap;

use serde_json::Value;

/// Replaces the scenario cwd and UUIDs in every string of a JSON value.
pub(crate) struct Scrubber {
    cwds: Vec<String>,
    /// False for logs written by `--update`: they keep their ids, because recorded tool
    /// arguments (a `send_message` target) must stay valid for replay.
    ids: bool,
}

impl Scrubber {
    pub(crate) fn new(cwd: &std::path::Path) -> Self {
        let mut cwds = vec![cwd.display().to_string()];
        if let Ok(canonical) = cwd.canonicalize() {
            cwds.push(canonical.display().to_string());
        }
        cwds.sort_by_key(|c| std::cmp::Reverse(c.len()));
        cwds.dedup();
        Scrubber { cwds, ids: true }
    }

    /// The same scrubber leaving UUIDs alone.
    pub(crate) fn keeping_ids(&self) -> Self {
        Scrubber { cwds: self.cwds.clone(), ids: false }
    }

    pub(crate) fn string(&self, s: &str) -> String {
        let mut out = s.to_string();
        for cwd in &self.cwds {
            if !cwd.is_empty() {
                out = out.replace(cwd.as_str(), "{{cwd}}");
            }
        }
        if self.ids { scrub_uuids(&out) } else { out }
    }

    /// Scrubs every string; wall-clock fields (`updatedAt`) become `{{updatedAt}}`.
    pub(crate) fn value(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.string(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if key == "updatedAt" && v.is_string() {
                        *v = Value::from("{{updatedAt}}");
                    } else {
                        self.value(v);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Replaces every 8-4-4-4-12 hex run with `{{sessionId}}`.
pub(crate) fn scrub_uuids(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + 36 <= bytes.len() && looks_like_uuid(&bytes[i..i + 36]) {
            out.push_str("{{sessionId}}");
            i += 36;
        } else {
            let ch = s[i..].chars().next().unwrap_or('\u{FFFD}');
            out.push(ch);
            i += ch.len_utf8().max(1);
        }
    }
    out
}

fn looks_like_uuid(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// Normalises a stdout transcript (one JSON-RPC frame per entry).
pub(crate) fn stdout_frames(frames: &[Value], scrubber: &Scrubber) -> Vec<Value> {
    let mut ids: HashMap<String, u64> = HashMap::new();
    frames
        .iter()
        .map(|frame| {
            let mut frame = frame.clone();
            if let Some(id) = frame.get_mut("id")
                && !id.is_null()
            {
                let key = id.to_string();
                let next = ids.len() as u64 + 1;
                *id = Value::from(*ids.entry(key).or_insert(next));
            }
            scrubber.value(&mut frame);
            frame
        })
        .collect()
}

/// Normalises one session log: header `createdAt` and event times → 0, then scrubbing.
pub(crate) fn log_lines(text: &str, scrubber: &Scrubber) -> Vec<String> {
    text.lines()
        .map(|line| {
            let Ok(mut value) = serde_json::from_str::<Value>(line) else {
                return line.to_string();
            };
            if let Some(map) = value.as_object_mut() {
                for key in ["createdAt", "time", "time0"] {
                    if map.contains_key(key) {
                        map.insert(key.into(), Value::from(0));
                    }
                }
                if let Some(dt) = map.get_mut("data").and_then(|d| d.get_mut("dt")).and_then(Value::as_array_mut) {
                    dt.iter_mut().for_each(|v| *v = Value::from(0));
                }
            }
            scrubber.value(&mut value);
            value.to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uuids_and_cwd_are_scrubbed() {
        let s = Scrubber::new(std::path::Path::new("/tmp/x"));
        assert_eq!(s.string("/tmp/x/a 11111111-1111-4111-8111-111111111111!"), "{{cwd}}/a {{sessionId}}!");
        assert_eq!(scrub_uuids("no-uuid-here"), "no-uuid-here");
    }

    #[test]
    fn ids_are_renumbered_by_first_appearance() {
        let frames = vec![json!({"id": 7}), json!({"id": "abc"}), json!({"id": 7}), json!({"id": null})];
        let out = stdout_frames(&frames, &Scrubber::new(std::path::Path::new("/nowhere")));
        assert_eq!(out, vec![json!({"id": 1}), json!({"id": 2}), json!({"id": 1}), json!({"id": null})]);
    }
}
