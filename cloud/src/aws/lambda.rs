//! The elastic tier on AWS Lambda (`aws-sdk-lambda`): each offloaded query
//! is one synchronous invocation of the configured function, with the
//! query as its JSON payload:
//!
//! ```json
//! {"query_id": 17, "template": 3, "sql": "SELECT …", "slo_ms": 2000}
//! ```
//!
//! The function answers with the rows, `{"columns": [...], "rows": [[...]],
//! "rows_total": n}`, or anything else for a query with no rows to return.
//!
//! - **Errors.** A function error (the `FunctionError` header, or an
//!   `errorMessage`/`errorType` payload) fails the query with the
//!   function's message. A throttle (429, `TooManyRequestsException`) is
//!   [`ExecuteError::Throttled`]: the router pauses offloads and routes
//!   the query again, to a cluster, or fails it saying so. A call that never got an answer fails the query with
//!   the SDK's reason. Nothing offloaded is lost: every invocation ends in
//!   a completion or a failure with a reason.
//! - **Concurrency.** At most `concurrency_limit` invocations run at once;
//!   more wait for a slot (the router's own view keeps under it too).
//! - **Bill.** Each invocation costs the request price plus its billed
//!   duration (from the `REPORT` line of the log tail, else the measured
//!   call, rounded up to the millisecond) × the configured memory × the
//!   GB-second price.

use std::sync::{Arc, Mutex};

use aws_config::SdkConfig;
use aws_sdk_lambda::Client;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::{InvocationType, LogType};
use slogate_actors::backend::{Completion, ExecuteError, Execution, Failure, LocalFuture, ResultRows};
use slogate_actors::clock::VirtualClock;
use slogate_actors::elastic::{ElasticTier, ElasticTierState};
use slogate_core::model::{ExecutionOutcome, ExecutionReport, Target};

use crate::aws::cloud_error;
pub use crate::platform::LambdaSettings;

#[derive(Default, serde::Serialize)]
struct Tally {
    invocations: u64,
    function_errors: u64,
    throttled: u64,
    unanswered: u64,
    billed_ms: u64,
    billed_usd: f64,
    last_error: Option<String>,
}

/// AWS Lambda as an [`ElasticTier`].
pub struct Lambda {
    client: Client,
    settings: LambdaSettings,
    clock: VirtualClock,
    slots: Arc<tokio::sync::Semaphore>,
    tally: Arc<Mutex<Tally>>,
}

impl Lambda {
    /// The tier through `config`.
    pub fn new(config: &SdkConfig, settings: LambdaSettings, clock: VirtualClock) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(settings.concurrency_limit.max(1) as usize));
        Lambda { client: Client::new(config), settings, clock, slots, tally: Arc::default() }
    }

    /// Checks that the function exists (and the endpoint, region and
    /// credentials with it).
    pub async fn check(&self) -> Result<(), crate::api::CloudError> {
        let function = &self.settings.function;
        self.client.get_function().function_name(function).send().await.map(|_| ()).map_err(|e| cloud_error(e).about(&format!("function `{function}`")))
    }
}

/// The billed duration in a Lambda log tail's `REPORT` line, ms.
pub fn billed_ms_in_log(log: &str) -> Option<u64> {
    let rest = &log[log.find("Billed Duration:")? + "Billed Duration:".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Lambda's log tail, base64 (standard alphabet), as text.
fn log_tail(encoded: &str) -> Option<String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(encoded).ok().map(|log| String::from_utf8_lossy(&log).into_owned())
}

/// The rows a function's answer carries, if it has any.
fn rows_of(answer: &serde_json::Value) -> Option<ResultRows> {
    let columns: Vec<String> = answer.get("columns")?.as_array()?.iter().filter_map(|c| c.as_str().map(str::to_owned)).collect();
    let rows: Vec<Vec<Option<String>>> = answer
        .get("rows")
        .and_then(|r| r.as_array())
        .map(|rows| {
            rows.iter()
                .filter_map(|row| row.as_array())
                .map(|row| row.iter().map(|v| if v.is_null() { None } else { Some(v.as_str().map_or_else(|| v.to_string(), str::to_owned)) }).collect())
                .collect()
        })
        .unwrap_or_default();
    let rows_total = answer.get("rows_total").and_then(serde_json::Value::as_u64).unwrap_or(rows.len() as u64);
    Some(ResultRows { columns, truncated: rows_total > rows.len() as u64, rows, rows_total })
}

impl ElasticTier for Lambda {
    fn invoke(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>> {
        let (client, settings, clock, slots, tally) = (self.client.clone(), self.settings.clone(), self.clock, self.slots.clone(), self.tally.clone());
        Box::pin(async move {
            let query = &execution.query;
            let dispatched = clock.now();
            let payload = serde_json::json!({
                "query_id": query.id.0,
                "template": query.template.0,
                "sql": execution.sql.as_deref(),
                "slo_ms": query.slo.latency.as_secs_f64() * 1e3,
            });
            let _slot = slots.acquire_owned().await.map_err(|_| ExecuteError::Unavailable("the Lambda tier is shutting down".into()))?;
            let started = clock.now();
            let wall = std::time::Instant::now();
            let sent = client
                .invoke()
                .function_name(&settings.function)
                .invocation_type(InvocationType::RequestResponse)
                .log_type(LogType::Tail)
                .payload(Blob::new(payload.to_string().into_bytes()))
                .send()
                .await;
            let measured_ms = (wall.elapsed().as_secs_f64() * 1e3).ceil() as u64;
            let finished = clock.now();
            let mut tally = tally.lock().expect("the tally lock is never poisoned");
            tally.invocations += 1;
            let reply = match sent {
                Ok(reply) => reply,
                Err(error) => {
                    let throttled = error.as_service_error().is_some_and(|e| e.is_too_many_requests_exception());
                    let error = cloud_error(error);
                    tally.last_error = Some(error.to_string());
                    if throttled {
                        tally.throttled += 1;
                        return Err(ExecuteError::Throttled(format!("Lambda function `{}`: {error}", settings.function)));
                    }
                    tally.unanswered += 1;
                    return Err(ExecuteError::Unavailable(format!("Lambda function `{}` did not answer: {error}", settings.function)));
                }
            };
            let billed_ms = reply
                .log_result()
                .and_then(log_tail)
                .and_then(|log| billed_ms_in_log(&log))
                .unwrap_or(measured_ms.max(1));
            let cost = settings.price_per_request_usd + billed_ms as f64 / 1e3 * f64::from(settings.memory_mb) / 1024.0 * settings.price_per_gb_second_usd;
            tally.billed_ms += billed_ms;
            tally.billed_usd += cost;
            let answer: serde_json::Value = reply.payload().and_then(|p| serde_json::from_slice(p.as_ref()).ok()).unwrap_or_default();
            let error_message = answer.get("errorMessage").and_then(|m| m.as_str());
            if reply.function_error().is_some() || (error_message.is_some() && answer.get("errorType").is_some()) {
                tally.function_errors += 1;
                let kind = answer.get("errorType").and_then(|t| t.as_str()).or(reply.function_error()).unwrap_or("Unhandled");
                let reason = format!("the Lambda function `{}` failed ({kind}): {}", settings.function, error_message.unwrap_or("no message"));
                tally.last_error = Some(reason.clone());
                return Ok(Completion::Failed(Failure { reason, sqlstate: None, started: Some(started), finished, throttled: false }));
            }
            let report = ExecutionReport {
                query: query.id,
                target: Target::Elastic,
                arrival: query.arrival,
                dispatched,
                started: Some(started),
                finished,
                outcome: ExecutionOutcome::Completed,
            };
            Ok(Completion::Ran { report, result: Some(rows_of(&answer).unwrap_or_default()) })
        })
    }

    fn state(&self) -> ElasticTierState {
        let tally = self.tally.lock().expect("the tally lock is never poisoned");
        let running = self.settings.concurrency_limit.max(1) as usize - self.slots.available_permits();
        ElasticTierState {
            kind: "lambda",
            billed_usd: tally.billed_usd,
            detail: serde_json::json!({
                "function": self.settings.function,
                "concurrency_limit": self.settings.concurrency_limit,
                "running": running,
                "memory_mb": self.settings.memory_mb,
                "tally": &*tally,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_billed_duration_is_read_from_the_log_tail() {
        let log = "START RequestId: 1 Version: $LATEST\nEND RequestId: 1\nREPORT RequestId: 1\tDuration: 101.52 ms\tBilled Duration: 102 ms\tMemory Size: 1024 MB\n";
        assert_eq!(billed_ms_in_log(log), Some(102));
        assert_eq!(billed_ms_in_log("no report"), None);
        assert_eq!(log_tail("QmlsbGVkIER1cmF0aW9uOiA3IG1z").as_deref(), Some("Billed Duration: 7 ms"));
    }

    #[test]
    fn rows_come_from_the_answer_and_other_answers_have_none() {
        let rows = rows_of(&serde_json::json!({"columns": ["a", "b"], "rows": [[1, null], ["x", "y"]], "rows_total": 5})).unwrap();
        assert_eq!(rows.columns, ["a", "b"]);
        assert_eq!(rows.rows, vec![vec![Some("1".to_owned()), None], vec![Some("x".to_owned()), Some("y".to_owned())]]);
        assert!(rows.truncated);
        assert_eq!(rows_of(&serde_json::json!({"echo": 1})), None);
    }
}
