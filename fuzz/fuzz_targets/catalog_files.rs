//! Fuzzes the two files kin keeps beside a sessions directory, the catalog index and the
//! directory memo: any bytes, as they are and under a first line whose count and digest match
//! them, read as a file or refused cleanly, never a panic; what is read is written and read back
//! to the same bytes (`kin::testkit::session::fuzz_files`). Run it with `TMPDIR` on a tmpfs: each
//! input is written to a file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kin::testkit::session::fuzz_files::index_file(data);
    kin::testkit::session::fuzz_files::memo_file(data);
});
