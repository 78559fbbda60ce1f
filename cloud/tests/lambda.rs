//! The Lambda elastic tier through the AWS SDK: invocations on moto's
//! server (which echoes the payload or answers canned results), and
//! throttles and timeouts from a canned server moto cannot imitate.

mod support;

use std::sync::Arc;
use std::time::Duration;

use slogate_actors::backend::{Completion, ExecuteError, Execution};
use slogate_actors::clock::VirtualClock;
use slogate_actors::elastic::ElasticTier;
use slogate_cloud::aws::lambda::{Lambda, LambdaSettings};
use slogate_cloud::aws::{AwsSettings, Credentials, sdk_config};
use slogate_core::model::{PoolId, Query, QueryId, Slo, Target, TemplateId};
use slogate_core::time::Instant;
use slogate_integration::canned_http::{Answer, CannedHttp};
use slogate_integration::moto::Moto;
use support::sink::aws_settings;

fn settings(concurrency_limit: u32) -> LambdaSettings {
    LambdaSettings {
        function: "offload".into(),
        concurrency_limit,
        memory_mb: 2048,
        price_per_gb_second_usd: 0.000_016_666_7,
        price_per_request_usd: 0.000_000_2,
    }
}

async fn tier(url: String, aws: impl FnOnce(AwsSettings) -> AwsSettings) -> Lambda {
    let config = sdk_config(&aws(aws_settings(url)), Some(Credentials::new("testing", "testing", None, None, "tests"))).await.unwrap();
    Lambda::new(&config, settings(4), VirtualClock::start(1.0))
}

fn execution(id: u64, sql: &str) -> Execution {
    let query = Query {
        id: QueryId(id),
        pool: PoolId::new("p"),
        template: TemplateId(7),
        slo: Slo { latency: slogate_core::time::Duration::from_secs(2) },
        arrival: Instant::ZERO,
    };
    Execution { query, target: Target::Elastic, sql: Some(sql.into()) }
}

#[actix_rt::test]
async fn an_offload_is_an_invocation_with_the_query_as_its_payload_and_its_rows_and_bill_come_back() {
    let moto = Moto::start();
    let missing = tier(moto.url(), |a| a).await.check().await.unwrap_err();
    assert!(missing.message.contains("function `offload`"), "{missing}");
    moto.lambda_function("offload");
    let lambda = tier(moto.url(), |a| a).await;
    lambda.check().await.expect("the function exists");

    // moto echoes the payload: the query, as the function receives it.
    let Completion::Ran { report, result } = lambda.invoke(execution(11, "SELECT 1")).await.unwrap() else { panic!("expected a completion") };
    assert_eq!((report.query, report.target), (QueryId(11), Target::Elastic));
    assert!(report.finished >= report.dispatched);
    assert_eq!(result.unwrap().rows_total, 0, "an echo has no rows");

    // A canned answer with rows.
    moto.queue_lambda_result(&serde_json::json!({"columns": ["answer"], "rows": [["42"]]}));
    let Completion::Ran { result, .. } = lambda.invoke(execution(12, "SELECT 42 AS answer")).await.unwrap() else { panic!("expected a completion") };
    let rows = result.unwrap();
    assert_eq!((rows.columns.as_slice(), rows.rows[0][0].as_deref()), (["answer".to_owned()].as_slice(), Some("42")));

    // A function error fails the query with the function's message.
    moto.queue_lambda_result(&serde_json::json!({"errorMessage": "division by zero", "errorType": "ZeroDivisionError"}));
    let Completion::Failed(failure) = lambda.invoke(execution(13, "SELECT 1/0")).await.unwrap() else { panic!("expected a failure") };
    assert_eq!(failure.reason, "the Lambda function `offload` failed (ZeroDivisionError): division by zero");
    assert!(!failure.throttled);

    let state = lambda.state();
    assert_eq!(state.kind, "lambda");
    assert_eq!(state.detail["tally"]["invocations"], 3);
    assert_eq!(state.detail["tally"]["function_errors"], 1);
    // Three requests and at least a millisecond each at 2 GB.
    let floor = 3.0 * (0.000_000_2 + 0.001 * 2.0 * 0.000_016_666_7);
    assert!(state.billed_usd >= floor - 1e-12, "{} < {floor}", state.billed_usd);
}

#[actix_rt::test]
async fn a_throttle_is_retried_within_its_bound_then_reported_as_throttled() {
    let throttling = CannedHttp::start(Answer::With {
        status: 429,
        headers: vec![("x-amzn-errortype".into(), "TooManyRequestsException".into())],
        body: r#"{"Type": "User", "message": "Rate Exceeded.", "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"}"#.into(),
    });
    let lambda = tier(throttling.url(), |a| a).await;
    let error = lambda.invoke(execution(21, "SELECT 1")).await.unwrap_err();
    assert!(matches!(&error, ExecuteError::Throttled(m) if m.contains("TooManyRequestsException")), "{error:?}");
    assert_eq!(throttling.requests(), 3, "the SDK's three attempts, no more");
    assert_eq!(lambda.state().detail["tally"]["throttled"], 1);
    // The router's failure says so, and is marked throttled.
    let failed = Completion::refused(&error, Instant::ZERO);
    assert!(matches!(failed, Completion::Failed(f) if f.throttled && f.reason.contains("throttled")));
}

#[actix_rt::test]
async fn an_invocation_that_never_answers_times_out_and_fails_with_the_reason() {
    let silent = CannedHttp::start(Answer::Never);
    let lambda = Arc::new(
        tier(silent.url(), |a| AwsSettings { attempts_max: 1, attempt_timeout: Duration::from_millis(300), ..a }).await,
    );
    let started = std::time::Instant::now();
    let error = lambda.invoke(execution(31, "SELECT 1")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the attempt timeout");
    assert!(matches!(&error, ExecuteError::Unavailable(m) if m.contains("did not answer") && m.contains("Timeout")), "{error:?}");
    assert_eq!(lambda.state().detail["tally"]["unanswered"], 1);
}
