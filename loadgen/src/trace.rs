//! The trace file format users bring: CSV with a header.
//!
//! Required columns: `arrival_s` (seconds from the trace's start, ≥ 0),
//! `template` (a positive integer), `slo_s` (seconds, > 0). Optional:
//! `pool` and `query_id` (any string without a comma, unique; the id a
//! client sends over gRPC). Columns may come in any order; unknown
//! columns are an error, as is every malformed line: parsing stops at the
//! first problem and names its line and reason, and nothing is silently
//! skipped. Blank lines and lines starting with `#` are comments.
//!
//! ```text
//! arrival_s,template,slo_s,pool,query_id
//! 0.0,17,12.5,dash,1001
//! 3.25,4,190.0,adhoc,1002
//! ```
//!
//! [`write_trace`] emits the same format, and
//! `parse_trace(&write_trace(entries))` gives the entries back (sorted by
//! arrival) to the microsecond.

use std::collections::HashSet;
use std::fmt::Write as _;

use slogate_core::model::{PoolId, TemplateId};
use slogate_core::time::{Duration, Instant};

use crate::workload::TraceEntry;
use crate::{Error, Result};

const REQUIRED: [&str; 3] = ["arrival_s", "template", "slo_s"];
const OPTIONAL: [&str; 2] = ["pool", "query_id"];

fn err(line: usize, reason: impl Into<String>) -> Error {
    Error::Trace { line, reason: reason.into() }
}

/// Parses a trace; entries come back sorted by arrival (stable).
pub fn parse_trace(text: &str) -> Result<Vec<TraceEntry>> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (header_line, header) = lines.next().ok_or_else(|| err(1, "empty trace: expected a header line"))?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut seen = HashSet::new();
    for column in &columns {
        if !REQUIRED.contains(column) && !OPTIONAL.contains(column) {
            return Err(err(
                header_line,
                format!("unknown column `{column}` (expected arrival_s, template, slo_s, and optionally pool, query_id)"),
            ));
        }
        if !seen.insert(*column) {
            return Err(err(header_line, format!("column `{column}` appears twice")));
        }
    }
    for required in REQUIRED {
        if !seen.contains(required) {
            return Err(err(header_line, format!("missing required column `{required}`")));
        }
    }
    let index = |name: &str| columns.iter().position(|c| *c == name);
    let (arrival_i, template_i, slo_i) =
        (index("arrival_s").expect("checked"), index("template").expect("checked"), index("slo_s").expect("checked"));
    let (pool_i, id_i) = (index("pool"), index("query_id"));

    let mut ids = HashSet::new();
    let mut entries = Vec::new();
    for (line, text) in lines {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(err(line, format!("expected {} fields, found {}", columns.len(), fields.len())));
        }
        let arrival_s: f64 = fields[arrival_i]
            .parse()
            .map_err(|_| err(line, format!("arrival_s `{}` is not a number", fields[arrival_i])))?;
        if !(arrival_s.is_finite() && arrival_s >= 0.0) {
            return Err(err(line, format!("arrival_s must be a finite number ≥ 0, got {}", fields[arrival_i])));
        }
        let template: u32 = fields[template_i]
            .parse()
            .ok()
            .filter(|&t| t > 0)
            .ok_or_else(|| err(line, format!("template `{}` is not a positive integer", fields[template_i])))?;
        let slo_s: f64 =
            fields[slo_i].parse().map_err(|_| err(line, format!("slo_s `{}` is not a number", fields[slo_i])))?;
        if !(slo_s.is_finite() && slo_s > 0.0) {
            return Err(err(line, format!("slo_s must be a finite number > 0, got {}", fields[slo_i])));
        }
        let pool = match pool_i.map(|i| fields[i]) {
            Some("") => return Err(err(line, "pool is empty")),
            Some(pool) => Some(PoolId::new(pool)),
            None => None,
        };
        let query_id = match id_i.map(|i| fields[i]) {
            Some("") => return Err(err(line, "query_id is empty")),
            Some(text) => {
                if !ids.insert(text) {
                    return Err(err(line, format!("query_id `{text}` appears twice")));
                }
                Some(text.to_owned())
            }
            None => None,
        };
        entries.push(TraceEntry {
            arrival: Instant::from_secs_f64(arrival_s),
            template: TemplateId(template),
            slo: Some(Duration::from_secs_f64(slo_s)),
            pool,
            query_id,
        });
    }
    entries.sort_by_key(|e| e.arrival);
    Ok(entries)
}

/// Reads and parses a trace file.
pub fn read_trace(path: &std::path::Path) -> Result<Vec<TraceEntry>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    parse_trace(&text)
}

/// Writes entries in the trace format, with the optional columns when any
/// entry has them.
///
/// # Errors
///
/// An entry without an SLO (a trace always carries SLOs), or a mix of
/// entries with and without pool or query id.
pub fn write_trace(entries: &[TraceEntry]) -> Result<String> {
    let with_pool = entries.iter().any(|e| e.pool.is_some());
    let with_id = entries.iter().any(|e| e.query_id.is_some());
    let mut out = String::from("arrival_s,template,slo_s");
    if with_pool {
        out.push_str(",pool");
    }
    if with_id {
        out.push_str(",query_id");
    }
    out.push('\n');
    for (index, e) in entries.iter().enumerate() {
        let slo = e.slo.ok_or_else(|| Error::InvalidParameter(format!("entry {index} has no SLO to write")))?;
        write!(out, "{:.6},{},{:.6}", e.arrival.as_secs_f64(), e.template.0, slo.as_secs_f64()).expect("write to String");
        if with_pool {
            let pool = e.pool.as_ref().ok_or_else(|| Error::InvalidParameter(format!("entry {index} has no pool")))?;
            if pool.0.contains(',') || pool.0.is_empty() {
                return Err(Error::InvalidParameter(format!("entry {index}: pool `{}` cannot be written", pool.0)));
            }
            write!(out, ",{}", pool.0).expect("write to String");
        }
        if with_id {
            let id = e.query_id.as_ref().ok_or_else(|| Error::InvalidParameter(format!("entry {index} has no query id")))?;
            if id.contains(',') || id.is_empty() {
                return Err(Error::InvalidParameter(format!("entry {index}: query id `{id}` cannot be written")));
            }
            write!(out, ",{id}").expect("write to String");
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reason(text: &str) -> String {
        parse_trace(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_required_and_optional_columns_in_any_order() {
        let t = parse_trace("query_id,slo_s,template,arrival_s,pool\n7,12.5,17,3.0,dash\n8,1,4,1.5,adhoc\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].query_id.as_deref(), Some("8"));
        assert_eq!(t[0].arrival, Instant::from_secs_f64(1.5));
        assert_eq!(t[1].slo, Some(Duration::from_secs_f64(12.5)));
        assert_eq!(t[1].pool, Some(PoolId::new("dash")));
    }

    #[test]
    fn missing_column_is_named() {
        assert!(reason("arrival_s,template\n1,2\n").contains("line 1: missing required column `slo_s`"));
    }

    #[test]
    fn unknown_column_is_named() {
        assert!(reason("arrival_s,template,slo_s,colour\n1,2,3,red\n").contains("unknown column `colour`"));
    }

    #[test]
    fn wrong_field_count_names_the_line() {
        assert!(reason("arrival_s,template,slo_s\n1,2,3\n4,5\n").contains("line 3: expected 3 fields, found 2"));
    }

    #[test]
    fn bad_numbers_name_line_and_field() {
        assert!(reason("arrival_s,template,slo_s\nsoon,2,3\n").contains("line 2: arrival_s `soon` is not a number"));
        assert!(reason("arrival_s,template,slo_s\n-1,2,3\n").contains("line 2: arrival_s must be"));
        assert!(reason("arrival_s,template,slo_s\n1,0,3\n").contains("line 2: template `0` is not a positive integer"));
        assert!(reason("arrival_s,template,slo_s\n1,2,0\n").contains("line 2: slo_s must be"));
        assert!(reason("arrival_s,template,slo_s\n1,2,NaN\n").contains("line 2: slo_s must be"));
    }

    #[test]
    fn duplicate_query_ids_are_rejected() {
        assert!(reason("arrival_s,template,slo_s,query_id\n1,2,3,9\n2,2,3,9\n").contains("line 3: query_id `9` appears twice"));
    }

    #[test]
    fn query_ids_may_be_any_string() {
        let t = parse_trace("arrival_s,template,slo_s,query_id\n1,2,3,flash_crowd-0\n2,2,3,tenant/a:7\n").unwrap();
        assert_eq!(t.iter().map(|e| e.query_id.as_deref()).collect::<Vec<_>>(), vec![Some("flash_crowd-0"), Some("tenant/a:7")]);
        assert!(reason("arrival_s,template,slo_s,query_id\n1,2,3,\n").contains("line 2: query_id is empty"));
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_but_counted() {
        let text = "# exported by slogate\narrival_s,template,slo_s\n\n1,2,3\n# note\nx,2,3\n";
        assert!(reason(text).contains("line 6:"));
    }

    #[test]
    fn empty_trace_is_an_error() {
        assert!(reason("").contains("empty trace"));
    }

    proptest! {
        #[test]
        fn write_then_parse_round_trips(raw in prop::collection::vec((0u64..10_000_000_000, 1u32..100, 1u64..1_000_000_000), 0..50)) {
            let entries: Vec<TraceEntry> = raw.iter().enumerate().map(|(i, &(at, t, slo))| TraceEntry {
                arrival: Instant::from_micros(at),
                template: TemplateId(t),
                slo: Some(Duration::from_micros(slo)),
                pool: Some(PoolId::new(format!("p{}", i % 3))),
                query_id: Some(format!("q-{i}")),
            }).collect();
            let mut sorted = entries.clone();
            sorted.sort_by_key(|e| e.arrival);
            prop_assert_eq!(parse_trace(&write_trace(&entries).unwrap()).unwrap(), sorted);
        }
    }
}
