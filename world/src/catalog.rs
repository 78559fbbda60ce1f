//! The embedded measurements: TPC-DS SF1000 on Amazon Redshift Serverless.
//!
//! `world/data/` holds the real measurements slogate is calibrated against
//! (see its README): isolated and baseline latencies of the 99 templates on
//! 16 RPU, and per-query latencies of 42 (fit) and 17 (validation) workload
//! runs on 4–32 RPU with the number of overlapping queries. They are
//! embedded at compile time so the binary needs no data directory; parsing
//! is pure (`&str` in, rows out).

use serde::{Deserialize, Serialize};

use slogate_core::model::{Rpu, Template, TemplateId};
use slogate_core::time::Duration;
use slogate_core::{Error, Result};

/// `redshift_tpcds_sf1000_rpu16.csv`.
pub const RPU16_CSV: &str = include_str!("../data/redshift_tpcds_sf1000_rpu16.csv");
/// `redshift_tpcds_sf1000_concurrent.csv`: the runs the world is fitted on.
pub const CONCURRENT_FIT_CSV: &str = include_str!("../data/redshift_tpcds_sf1000_concurrent.csv");
/// `redshift_tpcds_sf1000_concurrent_validation.csv`: held-out runs.
pub const CONCURRENT_VALIDATION_CSV: &str =
    include_str!("../data/redshift_tpcds_sf1000_concurrent_validation.csv");

/// One template's latencies on 16 RPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TemplateMeasurement {
    /// The TPC-DS template (1–99).
    pub template: TemplateId,
    /// Median latency of executions that overlapped no other query.
    pub isolated_p50: Duration,
    /// Maximum closed-loop latency: AutoSLO's `ℓ_baseline`.
    pub baseline_max: Duration,
}

/// One executed query of a concurrent workload run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionMeasurement {
    /// The TPC-DS template.
    pub template: TemplateId,
    /// The template's parameter variant.
    pub variant: u32,
    /// The workload run it belongs to.
    pub run_id: u64,
    /// The workgroup size.
    pub size: Rpu,
    /// How many other queries overlapped its execution.
    pub neighbours: u32,
    /// Client-side latency (a lower bound when `censored`).
    pub latency: Duration,
    /// A timeout or an observation cut short.
    pub censored: bool,
    /// The validation file's `iconq_plus_pred_s`: AutoSLO's learned model's
    /// prediction for this row, when the file has that column.
    pub iconq_plus_pred: Option<Duration>,
}

/// The 99 templates' measurements on 16 RPU, in template order.
pub fn tpcds_templates() -> Vec<TemplateMeasurement> {
    parse_rpu16(RPU16_CSV).expect("embedded rpu16 data parses")
}

/// The templates as a workload author sees them (baseline latencies).
pub fn tpcds_template_set() -> Vec<Template> {
    tpcds_templates()
        .into_iter()
        .map(|m| Template { id: m.template, baseline_latency: m.baseline_max })
        .collect()
}

/// Parses the 16-RPU template table.
pub fn parse_rpu16(csv: &str) -> Result<Vec<TemplateMeasurement>> {
    let mut rows = Vec::new();
    for (line_no, fields) in data_lines(csv, "template,isolated_p50_s")? {
        let field = |index: usize| field(&fields, index, line_no);
        rows.push(TemplateMeasurement {
            template: TemplateId(parse(field(0)?, line_no, "template")?),
            isolated_p50: Duration::from_secs_f64(parse(field(1)?, line_no, "isolated_p50_s")?),
            baseline_max: Duration::from_secs_f64(parse(field(4)?, line_no, "baseline_max_s")?),
        });
    }
    Ok(rows)
}

/// Parses a concurrent-runs table (fit or validation; extra columns are
/// ignored).
pub fn parse_concurrent(csv: &str) -> Result<Vec<ExecutionMeasurement>> {
    let mut rows = Vec::new();
    for (line_no, fields) in data_lines(csv, "template,variant,run_id,rpu")? {
        let field = |index: usize| field(&fields, index, line_no);
        rows.push(ExecutionMeasurement {
            template: TemplateId(parse(field(0)?, line_no, "template")?),
            variant: parse(field(1)?, line_no, "variant")?,
            run_id: parse(field(2)?, line_no, "run_id")?,
            size: Rpu(parse(field(3)?, line_no, "rpu")?),
            neighbours: parse(field(4)?, line_no, "num_other_concurrent_queries")?,
            latency: Duration::from_secs_f64(parse(field(5)?, line_no, "latency_s")?),
            censored: parse(field(6)?, line_no, "censored")?,
            iconq_plus_pred: match fields.get(7) {
                Some(text) => Some(Duration::from_secs_f64(parse(text, line_no, "iconq_plus_pred_s")?)),
                None => None,
            },
        });
    }
    Ok(rows)
}

fn data_lines<'a>(csv: &'a str, header_prefix: &str) -> Result<Vec<(usize, Vec<&'a str>)>> {
    let mut lines = csv.lines().enumerate();
    match lines.next() {
        Some((_, header)) if header.starts_with(header_prefix) => {}
        _ => return Err(Error::Data { line: 1, reason: format!("expected a header starting with `{header_prefix}`") }),
    }
    Ok(lines
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| (index + 1, line.split(',').map(str::trim).collect()))
        .collect())
}

fn field<'a>(fields: &[&'a str], index: usize, line: usize) -> Result<&'a str> {
    fields.get(index).copied().ok_or_else(|| Error::Data { line, reason: format!("missing column {}", index + 1) })
}

fn parse<T: std::str::FromStr>(text: &str, line: usize, column: &str) -> Result<T> {
    text.parse().map_err(|_| Error::Data { line, reason: format!("`{text}` is not a valid {column}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_data_has_the_documented_shape() {
        let templates = tpcds_templates();
        assert_eq!(templates.len(), 99);
        let total_s: f64 = templates.iter().map(|t| t.isolated_p50.as_secs_f64()).sum();
        assert!((total_s - 976.0).abs() < 1.0, "sum of isolated p50 = {total_s}");
        assert_eq!(parse_concurrent(CONCURRENT_FIT_CSV).unwrap().len(), 2_596);
        assert_eq!(parse_concurrent(CONCURRENT_VALIDATION_CSV).unwrap().len(), 941);
    }

    #[test]
    fn malformed_row_names_its_line_and_column() {
        let csv = "template,isolated_p50_s,closed_loop_p50_s,closed_loop_mean_s,baseline_max_s\n1,2.0,2,2,3\n2,abc,1,1,1\n";
        let err = parse_rpu16(csv).unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("isolated_p50_s"), "{err}");
    }
}
