//! The admin API's parsers of client input: the add-cluster body and a
//! cluster id from the path. Any input is parsed or refused with a
//! message, never a panic; what is accepted is in range and round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slogate::node::admin::{parse_cluster_id, parse_new_cluster};

fuzz_target!(|input: &[u8]| {
    let Some((&selector, rest)) = input.split_first() else { return };
    if selector % 2 == 0 {
        if let Ok(size) = parse_new_cluster(rest) {
            assert!((1..=1_024).contains(&size.0));
        }
    } else if let Ok(text) = std::str::from_utf8(rest) {
        match parse_cluster_id(text) {
            Ok(id) => assert_eq!(parse_cluster_id(&format!("c{}", id.0)).ok(), Some(id)),
            Err(error) => assert!(error.to_string().len() <= 512),
        }
    }
});
