//! The trace CSV reader (`slogate-loadgen`, `slogate eval --trace`): any
//! text is parsed or refused with an error, never a panic, and what it
//! accepts writes back to a trace that parses to the same queries.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(entries) = slogate_loadgen::trace::parse_trace(text) else { return };
    assert!(entries.windows(2).all(|w| w[0].arrival <= w[1].arrival), "entries come back sorted by arrival");
    if let Ok(written) = slogate_loadgen::trace::write_trace(&entries) {
        let again = slogate_loadgen::trace::parse_trace(&written).expect("a written trace parses");
        assert_eq!(again.len(), entries.len());
        assert!(again.iter().zip(&entries).all(|(a, b)| a.template == b.template));
    }
});
