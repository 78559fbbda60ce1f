//! SQL fingerprints of client text: any text gets a fingerprint in the
//! fingerprint range, the same one every time, and literals do not change
//! it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slogate_core::fingerprint::{FINGERPRINT_BASE, fingerprint_sql};

fuzz_target!(|sql: &str| {
    let fingerprint = fingerprint_sql(sql);
    assert!(fingerprint.0 >= FINGERPRINT_BASE);
    assert_eq!(fingerprint_sql(sql), fingerprint);
    // Property (A) of the module: a number swapped for another keeps it.
    if !sql.contains(|c: char| c.is_ascii_digit() || c == '\'' || c == '"' || c == '-' || c == '/' || c == '.') {
        let with_literal = format!("{sql} 42");
        let other_literal = format!("{sql} 7");
        assert_eq!(fingerprint_sql(&with_literal), fingerprint_sql(&other_literal));
    }
});
