//! Whether a frame is JSON as a whole, checked as strictly as parsing it into a
//! `serde_json::Value` (every string's escapes decoded, so a lone surrogate fails; every number
//! parsed, so `1e999` fails; nesting past serde_json's limit fails; nothing after the value) but
//! keeping nothing: the transport checks each request before the SDK parses it, and a copy of a
//! 5 MB image prompt as a `Value` only to drop it doubled the cost of reading it.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Checks that `text` is one JSON value, as `serde_json::from_str::<Value>` would.
pub(crate) fn check_json(text: &str) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    Checked::deserialize(&mut de)?;
    de.end()
}

/// A JSON value, parsed and dropped.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `deserialize_any`, not `deserialize_ignored_any`: serde_json skips an ignored value
        // without decoding its strings' escapes or its numbers.
        deserializer.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn refuses_exactly_what_a_value_parse_refuses() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let cases = [
            r#"{"id":1,"method":"m","params":{"a":[1,-2,3.5e3,true,false,null,"x\n\u00e9"]}}"#.to_string(),
            r#"{"t":"\ud83d\ude00"}"#.into(),
            r#"{"t":"\ud83d"}"#.into(),
            r#"{"\ud83d":1}"#.into(),
            r#"[["\udc00x"]]"#.into(),
            r#"{"n":1e999}"#.into(),
            r#"{"n":-1e999}"#.into(),
            r#"{"n":1e-999}"#.into(),
            r#"{"n":123456789012345678901234567890}"#.into(),
            r#"{"n":01}"#.into(),
            r#"{"a":1,}"#.into(),
            r#"{"a":1} x"#.into(),
            r#"{"a":1}   "#.into(),
            r#"{"a":"\x"}"#.into(),
            r#"{"a":"tab	in"}"#.into(),
            r#"{"a":1,"a":2}"#.into(),
            "".into(),
            "nul".into(),
            deep(127),
            deep(128),
            deep(129),
            format!(r#"{{"big":"{}"}}"#, "A".repeat(1 << 20)),
        ];
        for case in &cases {
            let expected = serde_json::from_str::<Value>(case).map_err(|e| e.to_string());
            let checked = check_json(case).map_err(|e| e.to_string());
            assert_eq!(checked, expected.map(|_| ()), "{:.80}", case);
        }
        assert!(check_json(r#"{"t":"\ud83d"}"#).is_err(), "a lone surrogate fails");
        assert!(check_json(&deep(200)).is_err(), "nesting past the limit fails");
    }
}
