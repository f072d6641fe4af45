//! What the start of a JSON-RPC frame says about it ([`Shape`]): its id, whether it is a request
//! the SDK reads as one or a response, and what is wrong with one that is neither
//! (`request_defect`, `answer_defect`), read from at most a prefix of the frame (a frame cut
//! short is told from what it starts with).

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// What the start of a frame says about it: the top-level keys seen before the start ends.
#[derive(Debug, PartialEq)]
pub(crate) struct Shape {
    id: Option<Value>,
    /// An `id` member started (its value may be cut off with the start).
    id_seen: bool,
    pub(crate) method: bool,
    /// The method, when it is a string.
    pub(crate) method_name: Option<String>,
    pub(crate) result_or_error: bool,
    /// A `result` member.
    result: bool,
    /// An `error` member, and whether it is an object with an integer `code` and a string
    /// `message`.
    error: Option<bool>,
    /// `"jsonrpc": "2.0"`.
    version_2: bool,
    /// The params are absent, null, an object or an array (as far as the start shows).
    params_fit: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            id: None,
            id_seen: false,
            method: false,
            method_name: None,
            result_or_error: false,
            result: false,
            error: None,
            version_2: false,
            params_fit: true,
        }
    }
}

impl Shape {
    /// Reads the top-level members of a (possibly cut) JSON object; stops quietly where the
    /// text stops or turns invalid.
    pub(crate) fn of(prefix: &[u8]) -> Shape {
        let mut shape = Shape::default();
        let mut parser = serde_json::Deserializer::from_slice(prefix);
        let _ = serde::Deserializer::deserialize_map(&mut parser, Seek(&mut shape));
        shape
    }

    /// What a whole frame's start says (its first `ID_PREFIX_BYTES`).
    pub(crate) fn of_line(line: &str) -> Shape {
        Shape::of(&line.as_bytes()[..line.len().min(super::ID_PREFIX_BYTES)])
    }

    /// The id to answer with: the frame's, when it is a valid JSON-RPC id, else null.
    pub(crate) fn id(&self) -> Value {
        match &self.id {
            Some(id @ Value::String(_)) => id.clone(),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
            _ => Value::Null,
        }
    }

    /// A response to a request of kin's: an id, a result or error, no method.
    pub(crate) fn is_response(&self) -> bool {
        self.result_or_error && !self.method && !self.id().is_null()
    }

    /// What is wrong with a frame that answers one of kin's requests (an id, no method) but is
    /// not a JSON-RPC response the SDK would take (it drops such a frame, and the request then
    /// waits forever); `None` for a well-formed answer or any other frame. `whole`: the shape
    /// was read from the whole frame (a member past a cut start is not known to be missing).
    pub(crate) fn answer_defect(&self, whole: bool) -> Option<&'static str> {
        if self.method || self.id().is_null() {
            return None;
        }
        match (self.result, self.error) {
            (true, Some(_)) => Some("it has both a result and an error"),
            (_, Some(false)) => Some("its error is not an object with an integer code and a string message"),
            (false, None) if whole => Some("it has neither a result nor an error"),
            (false, None) => None,
            _ if !self.version_2 => Some("it lacks \"jsonrpc\": \"2.0\""),
            _ => None,
        }
    }

    /// A request the SDK reads as one, and so answers with its id: JSON-RPC 2.0, a method
    /// name, a string or integer id (not null: kin enters only answers it can tell apart),
    /// params that fit, no result or error. The SDK answers any other frame with a method and an
    /// id with an error with a null id.
    pub(crate) fn is_request(&self) -> bool {
        let id = matches!(&self.id, Some(Value::String(_))) || self.id.as_ref().is_some_and(|id| id.is_i64());
        id && self.method_name.is_some() && !self.result_or_error && self.version_2 && self.params_fit
    }

    /// Why a frame with a method and an id cannot be served, answered as `(id, code, message)`:
    /// an id longer than `MAX_ID_BYTES` (answered with a null id, as it is not echoed), and, for
    /// a frame the SDK would answer with a null id the client cannot match, what it lacks, with
    /// its id; `None` for a request the SDK serves and any other frame. `whole`: the shape was
    /// read from the whole frame (a member past a cut start is not known to be missing).
    pub(crate) fn request_defect(&self, whole: bool) -> Option<(Value, i64, &'static str)> {
        // An id cut off with the start: what follows it (the method) is not known either.
        let cut_id = self.id_seen && self.id.is_none() && !whole;
        let long_id = matches!(&self.id, Some(Value::String(id)) if id.len() > MAX_ID_BYTES);
        if cut_id || (long_id && self.method && !self.result_or_error) {
            return Some((
                Value::Null,
                -32600,
                "Invalid request: its id is longer than 1024 bytes; use a number or a short string",
            ));
        }
        if !self.method || self.result_or_error {
            return None;
        }
        let id = self.id();
        if id.is_null() || (id.is_number() && !self.id.as_ref().is_some_and(Value::is_i64)) {
            return None;
        }
        if self.method_name.is_none() {
            return Some((id, -32600, "Invalid request: its method is not a string"));
        }
        if !self.params_fit {
            return Some((id, -32602, "Invalid params: params must be an object"));
        }
        if !self.version_2 && whole {
            return Some((id, -32600, r#"Invalid request: it lacks "jsonrpc": "2.0""#));
        }
        None
    }
}

/// The longest id a request may have: it is echoed in every answer.
pub(crate) const MAX_ID_BYTES: usize = 1024;

struct Seek<'a>(&'a mut Shape);

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "id" => {
                    self.0.id_seen = true;
                    self.0.id = Some(map.next_value::<Value>()?);
                }
                "method" => {
                    self.0.method = true;
                    self.0.method_name = map.next_value::<Value>()?.as_str().map(str::to_string);
                }
                "result" => {
                    self.0.result_or_error = true;
                    self.0.result = true;
                    map.next_value::<IgnoredAny>()?;
                }
                "error" => {
                    self.0.result_or_error = true;
                    let error = map.next_value::<Value>()?;
                    self.0.error = Some(error["code"].is_i64() && error["message"].is_string());
                }
                "jsonrpc" => self.0.version_2 = map.next_value::<Value>()? == "2.0",
                "params" => {
                    // Fit once an object, array or null starts (a cut frame may end inside it).
                    self.0.params_fit = false;
                    map.next_value_seed(Params(&mut self.0.params_fit))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Marks a frame's params as fitting a request once they start as null, an object or an array
/// (told from their first token, so a cut frame is told too); any other value is read past.
struct Params<'a>(&'a mut bool);

impl<'de> serde::de::DeserializeSeed<'de> for Params<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Params<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON-RPC params")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        *self.0 = true;
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        *self.0 = true;
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        *self.0 = true;
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_id_is_recovered_from_the_start_of_a_frame() {
        let shape = |text: &str| Shape::of(text.as_bytes());
        let request =
            shape(r#"{"jsonrpc":"2.0","id":"a-1","method":"session/prompt","params":{"prompt":[{"text":"xxxx"#);
        assert_eq!((request.id(), request.is_response()), (json!("a-1"), false));
        let late = shape(r#"{"jsonrpc":"2.0","method":"session/prompt","params":{"prompt":"xxxx"#);
        assert_eq!((late.id(), late.method), (Value::Null, true));
        let response = shape(r#"{"jsonrpc":"2.0","id":3,"result":{"content":"xxxx"#);
        assert_eq!((response.id(), response.is_response()), (json!(3), true));
        let odd = shape(r#"{"id":1.5,"result":{"#);
        assert_eq!((odd.id(), odd.is_response()), (Value::Null, false));
        assert_eq!(shape("[1,2").id(), Value::Null);
        assert_eq!(shape("not json").id(), Value::Null);
    }

    #[test]
    fn a_request_the_sdk_cannot_serve_is_told_what_is_wrong() {
        let defect =
            |text: &str, whole: bool| Shape::of(text.as_bytes()).request_defect(whole).map(|(id, code, _)| (id, code));
        assert_eq!(defect(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#, true), Some((json!(1), -32602)));
        assert_eq!(defect(r#"{"jsonrpc":"2.0","id":"a","method":7}"#, true), Some((json!("a"), -32600)));
        assert_eq!(defect(r#"{"id":2,"method":"m"}"#, true), Some((json!(2), -32600)));
        // A cut start does not show a missing "jsonrpc"; it does show a cut id.
        assert_eq!(defect(r#"{"id":2,"method":"m","params":{"a":"#, false), None);
        assert_eq!(defect(r#"{"jsonrpc":"2.0","id":"xxxxxx"#, false), Some((Value::Null, -32600)));
        let long = format!(r#"{{"jsonrpc":"2.0","id":"{}","method":"m"}}"#, "i".repeat(MAX_ID_BYTES + 1));
        assert_eq!(defect(&long, true), Some((Value::Null, -32600)));
        // Served by the SDK, or not a request: nothing to say.
        assert_eq!(defect(r#"{"jsonrpc":"2.0","id":3,"method":"m","params":{}}"#, true), None);
        assert_eq!(
            defect(r#"{"jsonrpc":"2.0","id":1.5,"method":"m","params":"x"}"#, true),
            None,
            "no id to answer with"
        );
        assert_eq!(defect(r#"{"jsonrpc":"2.0","method":"m","params":"x"}"#, true), None, "a notification");
        assert_eq!(defect(r#"{"jsonrpc":"2.0","id":4,"result":{}}"#, true), None, "a response");
    }

    /// A frame is entered as a request exactly when the SDK reads it as one (and so answers with
    /// its id); the SDK's own reading is the reference, for whole frames and cut ones.
    #[test]
    fn a_request_is_told_as_the_sdk_tells_it() {
        use agent_client_protocol::{RawJsonRpcMessage, RawJsonRpcRequest, TransportFrame};
        let frames = [
            (r#"{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}"#, true),
            (r#"{"jsonrpc":"2.0","id":"s","method":"session/list"}"#, true),
            (r#"{"params":[1],"method":"m","id":-7,"jsonrpc":"2.0"}"#, true),
            (r#"{"jsonrpc":"2.0","id":2,"method":"m","params":null}"#, true),
            (r#"{"jsonrpc":"1.0","id":3,"method":"m","params":{}}"#, false),
            (r#"{"id":3,"method":"m","params":{}}"#, false),
            (r#"{"jsonrpc":"2.0","id":4,"method":"m","params":"text"}"#, false),
            (r#"{"jsonrpc":"2.0","id":4,"method":"m","params":5}"#, false),
            (r#"{"jsonrpc":"2.0","id":1.5,"method":"m","params":{}}"#, false),
            (r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#, false),
            (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#, false),
            (r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"m"}"#, false),
            (r#"{"jsonrpc":"2.0","id":5,"method":7}"#, false),
            (r#"{"jsonrpc":"2.0","id":5,"method":"m","result":{}}"#, false),
            (r#"{"jsonrpc":"2.0","method":"m","params":{}}"#, false),
            (r#"{"jsonrpc":"2.0","id":6,"result":{}}"#, false),
        ];
        for (frame, request) in frames {
            let sdk = matches!(
                TransportFrame::parse_json(frame),
                TransportFrame::Single(RawJsonRpcMessage::Request(RawJsonRpcRequest { .. }))
            );
            assert_eq!(sdk, request, "the SDK's reading of {frame}");
            assert_eq!(Shape::of(frame.as_bytes()).is_request(), request, "{frame}");
        }
        // A request with a null id is one, but its answer is not told from the SDK's answers to
        // frames it cannot read: it is not entered.
        let null_id = r#"{"jsonrpc":"2.0","id":null,"method":"m","params":{}}"#;
        assert!(matches!(TransportFrame::parse_json(null_id), TransportFrame::Single(RawJsonRpcMessage::Request(_))));
        assert!(!Shape::of(null_id.as_bytes()).is_request());
        // Cut inside long params: told from how they start.
        let cut = |params: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{params}"#);
        assert!(Shape::of(cut(r#"{"text":"xxxx"#).as_bytes()).is_request());
        assert!(!Shape::of(cut(r#""xxxx"#).as_bytes()).is_request());
    }
}
