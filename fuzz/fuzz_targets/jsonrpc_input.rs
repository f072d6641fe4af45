//! Fuzzes kin's side of the JSON-RPC input path: a frame's params as `session/new`,
//! `session/prompt` and `session/load` see them (the SDK parses the envelope), through kin's own
//! validation and prompt conversion. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        kin::testkit::acp::fuzz_params(&value);
    }
});
