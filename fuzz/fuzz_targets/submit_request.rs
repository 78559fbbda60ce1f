//! SubmitRequest off the wire: any bytes decode or fail, and what decodes
//! is validated or refused with a status, never a panic. What validation
//! accepts is within every limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use slogate_proto::v1::SubmitRequest;
use slogate_proto::validate::{Limits, validate_submit};

fuzz_target!(|bytes: &[u8]| {
    let Ok(request) = SubmitRequest::decode(bytes) else { return };
    let limits = Limits::default();
    match validate_submit(&request, &limits) {
        Ok(spec) => {
            assert!(spec.pool.0.len() <= limits.pool_name_bytes_max);
            assert!(spec.client_query_id.len() <= limits.query_id_bytes_max);
            assert!(spec.labels.len() <= limits.labels_max);
            assert!(spec.payload_bytes <= limits.payload_bytes_max);
            assert!(spec.slo.latency.as_millis_f64() <= limits.slo_ms_max as f64);
        }
        Err(error) => {
            // The message goes into grpc-message: bounded, whatever came in.
            assert!(error.to_string().len() <= 1_024, "{} bytes", error.to_string().len());
        }
    }
});
