//! An event's `data` as it is held in memory: its compact JSON text, exactly as it was read from
//! the log or serialized when the event was made, and parsed only when something asks. A loaded
//! session of a million events keeps a million short strings, not a million JSON trees (a
//! `serde_json::Value` object costs about twenty times its text).
//!
//! The text is shared, not copied, by clones: the model history holds the text of the events
//! that put its messages there (`surface::HistoryMessage`), so a message of a megabyte is in
//! memory once.
//!
//! Typed reads (`Data::read`) parse the text straight into the payload struct and keep nothing.
//! `Data::value` (and indexing, `data["turn"]`) parses once and keeps the tree beside the text:
//! for tests and rare inspections, never for a pass over every event of a log.

use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// The `data` of one event (see the module doc).
pub struct Data {
    raw: Arc<RawValue>,
    parsed: OnceLock<Box<Value>>,
}

impl Data {
    /// The data of `value` (serialized compactly, keys in their order).
    pub fn of(value: &Value) -> Data {
        Data::from_raw(serialize(value))
    }

    /// The data of any serializable payload (plain structs of strings, numbers and JSON values:
    /// serializing cannot fail; if it ever does, the data is `null` and the failure is logged).
    pub fn of_payload(payload: &impl Serialize) -> Data {
        Data::from_raw(serialize(payload))
    }

    fn from_raw(raw: Box<RawValue>) -> Data {
        Data { raw: Arc::from(raw), parsed: OnceLock::new() }
    }

    /// The JSON text.
    pub fn text(&self) -> &str {
        self.raw.get()
    }

    /// A typed read of the text (nothing is kept).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.raw.get())
    }

    /// The parsed tree, built on the first call and kept (see the module doc).
    pub fn value(&self) -> &Value {
        self.parsed.get_or_init(|| Box::new(self.to_value()))
    }

    /// A freshly parsed tree (nothing is kept).
    pub fn to_value(&self) -> Value {
        // The text is valid JSON by construction (a `RawValue`); a tree of it always parses.
        self.read().unwrap_or(Value::Null)
    }
}

fn serialize(payload: &impl Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(payload).unwrap_or_else(|e| {
        tracing::error!("serializing an event payload failed: {e}");
        serde_json::value::to_raw_value(&Value::Null).unwrap_or_else(|_| unreachable!("null serializes"))
    })
}

impl From<Value> for Data {
    fn from(value: Value) -> Self {
        Data::of(&value)
    }
}

/// A clone shares the text (not a parsed tree).
impl Clone for Data {
    fn clone(&self) -> Self {
        Data { raw: Arc::clone(&self.raw), parsed: OnceLock::new() }
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.raw.get())
    }
}

impl std::fmt::Display for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.raw.get())
    }
}

/// Equal when the JSON is: the same text, or texts that parse to the same tree.
impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        self.raw.get() == other.raw.get() || self.to_value() == other.to_value()
    }
}

impl PartialEq<Value> for Data {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl PartialEq<Data> for Value {
    fn eq(&self, other: &Data) -> bool {
        other == self
    }
}

impl<I: serde_json::value::Index> std::ops::Index<I> for Data {
    type Output = Value;

    fn index(&self, index: I) -> &Value {
        &self.value()[index]
    }
}

impl Serialize for Data {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Data {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Data::from_raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_kept_as_read_and_written_back_verbatim() {
        let line = r#"{"data":{"z":1,"a":[1.50,"\u00e9"],"n":null}}"#;
        #[derive(Deserialize, Serialize)]
        struct Envelope {
            data: Data,
        }
        let envelope: Envelope = serde_json::from_str(line).unwrap();
        assert_eq!(envelope.data.text(), r#"{"z":1,"a":[1.50,"\u00e9"],"n":null}"#);
        assert_eq!(serde_json::to_string(&envelope).unwrap(), line, "not re-encoded");
        assert_eq!(envelope.data["a"][1], "é");
        assert_eq!(envelope.data, json!({"z": 1, "a": [1.5, "é"], "n": null}));
    }

    #[test]
    fn data_of_a_value_is_its_compact_text_in_key_order() {
        let data = Data::of(&json!({"turn": 2, "reason": {"kind": "completed"}}));
        assert_eq!(data.text(), r#"{"turn":2,"reason":{"kind":"completed"}}"#);
        assert_eq!(data.clone(), data);
        assert_eq!(data.clone().text().as_ptr(), data.text().as_ptr(), "a clone shares the text");
        assert_ne!(data, Data::of(&json!({"turn": 3})));
        assert_eq!(data.read::<Value>().unwrap()["turn"], 2);
    }
}
