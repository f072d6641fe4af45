//! Fuzzes the JSONL session reader: any bytes must scan to a valid prefix or a clean error,
//! never panic, and the repair closers must accept whatever the scan kept.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(scanned) = kin::testkit::session::scan::scan_bytes(std::path::Path::new("fuzz.jsonl"), data) {
        assert!(scanned.committed_bytes as usize <= data.len());
        let _ = kin::testkit::session::repair::closers(&scanned.events);
        let _ = kin::testkit::session::derive_messages(&scanned.events);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines() {
            if let Ok(record) = kin::testkit::session::Record::parse(line) {
                let again = kin::testkit::session::Record::parse(&record.to_line()).expect("a serialized record parses");
                assert_eq!(again, record);
            }
        }
    }
});
