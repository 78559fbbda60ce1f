//! The node configuration loader: any text is a configuration or an error
//! that names the problem, never a panic; an accepted one has sane limits.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use slogate::config::{NodeConfig, Overrides};

fuzz_target!(|text: &str| {
    let environment: HashMap<String, String> = HashMap::new();
    match NodeConfig::load(text, &environment, &Overrides::default()) {
        Ok(config) => {
            assert!(config.file.limits.in_flight_per_pool_max >= 1);
            assert!(!config.file.pool.is_empty(), "a node always has a pool");
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
