//! A test double for Redshift Serverless: moto does not serve it, so this
//! small server answers the calls slogate makes (CreateNamespace,
//! GetNamespace, DeleteNamespace, ListNamespaces, CreateWorkgroup,
//! GetWorkgroup, DeleteWorkgroup, ListWorkgroups and ListTagsForResource)
//! in the service's real wire protocol: JSON 1.1 over HTTP POST, the
//! operation in `X-Amz-Target`, errors as `__type` with a 4xx or 5xx
//! status. The SDK's real serialisation, SigV4 signing, retries and error
//! parsing all run against it.
//!
//! As the service does, it holds one workgroup per namespace at most, and
//! refuses to delete a namespace a workgroup still uses.
//!
//! A workgroup becomes AVAILABLE `ready_after` its creation, serving at the
//! configured endpoint (a test's PostgreSQL server, say), and is gone
//! `delete_after` a DeleteWorkgroup. Faults are injected by count:
//! throttling or 5xx answers to the next creates, workgroups that never
//! become available, and creates whose answer is held back until the test
//! lets it go (to kill a node between a create and its record).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

/// The access key the tests sign with; the stand-in refuses other keys.
pub const ACCESS_KEY: &str = "AKIDSTANDINTEST";

/// A resource's tags, (key, value).
pub type Tags = Vec<(String, String)>;

/// How the stand-in behaves.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// Namespaces that exist from the start (a producer's, say).
    pub namespaces: Vec<String>,
    /// Where every workgroup serves.
    pub endpoint: (String, u16),
    /// How long a workgroup stays CREATING.
    pub ready_after: Duration,
    /// How long a workgroup stays DELETING.
    pub delete_after: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            namespaces: vec!["analytics".into()],
            endpoint: ("127.0.0.1".into(), 5439),
            ready_after: Duration::from_millis(300),
            delete_after: Duration::from_millis(200),
        }
    }
}

struct Workgroup {
    name: String,
    namespace: String,
    base_capacity: i64,
    tags: Vec<(String, String)>,
    created: Instant,
    deleted: Option<Instant>,
    never_available: bool,
}

#[derive(Default)]
struct Faults {
    throttle_creates: u32,
    fail_creates: u32,
    never_available: u32,
    hold_creates: u32,
}

struct Namespace {
    tags: Tags,
    admin_username: Option<String>,
    database: Option<String>,
}

struct State {
    behaviour: Behaviour,
    namespaces: BTreeMap<String, Namespace>,
    workgroups: BTreeMap<String, Workgroup>,
    faults: Faults,
    calls: BTreeMap<String, u32>,
    held: u32,
    released: bool,
}

/// A running stand-in; it stops when dropped (its thread is detached and
/// its runtime ends with the test process).
pub struct ServerlessStandIn {
    addr: SocketAddr,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl ServerlessStandIn {
    /// Starts one on a free loopback port.
    pub fn start(behaviour: Behaviour) -> Self {
        let state = Arc::new((
            Mutex::new(State {
                namespaces: behaviour.namespaces.iter().map(|n| (n.clone(), Namespace { tags: Vec::new(), admin_username: None, database: None })).collect(),
                behaviour,
                workgroups: BTreeMap::new(), faults: Faults::default(), calls: BTreeMap::new(), held: 0, released: false }),
            Condvar::new(),
        ));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stand-in");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local addr");
        let served = state.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("the stand-in's runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let state = served.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| answer(state.clone(), request));
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                    });
                }
            });
        });
        ServerlessStandIn { addr, state }
    }

    /// Its endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.0.lock().unwrap();
        f(&mut state)
    }

    /// The next `n` creates are throttled (HTTP 400, ThrottlingException).
    pub fn throttle_creates(&self, n: u32) {
        self.with(|s| s.faults.throttle_creates = n);
    }

    /// The next `n` creates fail with HTTP 500.
    pub fn fail_creates(&self, n: u32) {
        self.with(|s| s.faults.fail_creates = n);
    }

    /// The next `n` workgroups created stay CREATING for ever.
    pub fn never_available(&self, n: u32) {
        self.with(|s| s.faults.never_available = n);
    }

    /// The next `n` creates make their workgroup, then hold their answer
    /// until [`ServerlessStandIn::release_held`].
    pub fn hold_creates(&self, n: u32) {
        self.with(|s| s.faults.hold_creates = n);
    }

    /// Waits until a create is being held, at most `timeout`.
    pub fn wait_for_held(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, changed) = &*self.state;
        let mut state = lock.lock().unwrap();
        while state.held == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = changed.wait_timeout(state, left).unwrap().0;
        }
        true
    }

    /// Lets every held create answer.
    pub fn release_held(&self) {
        self.with(|s| s.released = true);
        self.state.1.notify_all();
    }

    /// How many times `operation` was called (every attempt counts).
    pub fn calls(&self, operation: &str) -> u32 {
        self.with(|s| s.calls.get(operation).copied().unwrap_or(0))
    }

    /// The workgroups not yet gone: (name, status, tags).
    pub fn workgroups(&self) -> Vec<(String, String, Tags)> {
        self.with(|s| {
            let behaviour = s.behaviour.clone();
            s.workgroups.retain(|_, w| w.deleted.is_none_or(|d| d.elapsed() < behaviour.delete_after));
            s.workgroups.values().map(|w| (w.name.clone(), status(w, &behaviour).to_owned(), w.tags.clone())).collect()
        })
    }

    /// The namespaces that exist: (name, tags).
    pub fn namespaces(&self) -> Vec<(String, Tags)> {
        self.with(|s| s.namespaces.iter().map(|(n, ns)| (n.clone(), ns.tags.clone())).collect())
    }

    /// The admin user and database namespace `name` was created with.
    pub fn namespace_admin(&self, name: &str) -> Option<(Option<String>, Option<String>)> {
        self.with(|s| s.namespaces.get(name).map(|ns| (ns.admin_username.clone(), ns.database.clone())))
    }

    /// Makes a namespace with no workgroup, as a node that died between
    /// its two create calls leaves it.
    pub fn seed_namespace(&self, name: &str, tags: &[(&str, &str)]) {
        self.with(|s| {
            let tags = tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            s.namespaces.insert(name.to_owned(), Namespace { tags, admin_username: None, database: None });
        });
    }

    /// Makes a workgroup, in a namespace of its own name, as if another
    /// node (or an earlier life of this one) had created it.
    pub fn seed_workgroup(&self, name: &str, base_capacity: i64, tags: &[(&str, &str)]) {
        self.seed_namespace(name, tags);
        self.with(|s| {
            s.workgroups.insert(
                name.to_owned(),
                Workgroup {
                    name: name.to_owned(),
                    namespace: name.to_owned(),
                    base_capacity,
                    tags: tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                    created: Instant::now() - Duration::from_secs(3600),
                    deleted: None,
                    never_available: false,
                },
            );
        });
    }
}

fn status(workgroup: &Workgroup, behaviour: &Behaviour) -> &'static str {
    if workgroup.deleted.is_some() {
        "DELETING"
    } else if workgroup.never_available || workgroup.created.elapsed() < behaviour.ready_after {
        "CREATING"
    } else {
        "AVAILABLE"
    }
}

/// `unix_s` as ISO 8601 (`2026-12-04T18:50:29Z`).
fn date_time(unix_s: u64) -> String {
    let (days, rest) = ((unix_s / 86_400) as i64, unix_s % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

fn arn(name: &str) -> String {
    format!("arn:aws:redshift-serverless:us-east-1:123456789012:workgroup/{name}")
}

fn namespace_arn(name: &str) -> String {
    format!("arn:aws:redshift-serverless:us-east-1:123456789012:namespace/{name}")
}

fn describe_namespace(name: &str) -> Value {
    json!({ "namespaceName": name, "namespaceArn": namespace_arn(name), "namespaceId": format!("ns-{}", name.len()), "status": "AVAILABLE" })
}

fn tags_of(input: &Value) -> Tags {
    input
        .get("tags")
        .and_then(Value::as_array)
        .map(|tags| tags.iter().filter_map(|t| Some((t.get("key")?.as_str()?.to_owned(), t.get("value")?.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

fn describe(workgroup: &Workgroup, behaviour: &Behaviour) -> Value {
    let status = status(workgroup, behaviour);
    // The service's model declares creationDate as an ISO 8601 string.
    let created = date_time(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs().saturating_sub(workgroup.created.elapsed().as_secs()));
    let mut body = json!({
        "workgroupName": workgroup.name,
        "workgroupArn": arn(&workgroup.name),
        "workgroupId": format!("wg-{}", workgroup.name.len()),
        "namespaceName": workgroup.namespace,
        "baseCapacity": workgroup.base_capacity,
        "status": status,
        "creationDate": created,
        "port": behaviour.endpoint.1,
        "publiclyAccessible": false,
    });
    if status == "AVAILABLE" {
        body["endpoint"] = json!({ "address": behaviour.endpoint.0, "port": behaviour.endpoint.1 });
    }
    body
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.1")
        .header("x-amzn-errortype", kind)
        .body(Full::new(Bytes::from(json!({ "__type": kind, "message": message }).to_string())))
        .unwrap()
}

fn ok(body: Value) -> Response<Full<Bytes>> {
    Response::builder().status(StatusCode::OK).header("content-type", "application/x-amz-json-1.1").body(Full::new(Bytes::from(body.to_string()))).unwrap()
}

async fn answer(state: Arc<(Mutex<State>, Condvar)>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = request.headers().get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let signed = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(&format!("AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")) && v.contains("/redshift-serverless/aws4_request"));
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let Some(operation) = target.strip_prefix("RedshiftServerless.").map(str::to_owned) else {
        return Ok(error(StatusCode::BAD_REQUEST, "UnknownOperationException", &format!("unknown target `{target}`")));
    };
    if !signed {
        return Ok(error(StatusCode::FORBIDDEN, "UnrecognizedClientException", "the request is not signed with the test credentials"));
    }
    let input: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return Ok(error(StatusCode::BAD_REQUEST, "SerializationException", &e.to_string())),
    };
    let hold = {
        let mut guard = state.0.lock().unwrap();
        *guard.calls.entry(operation.clone()).or_insert(0) += 1;
        let reply = handle(&mut guard, &operation, &input);
        let hold = operation == "CreateWorkgroup" && reply.status() == StatusCode::OK && guard.faults.hold_creates > 0;
        if hold {
            guard.faults.hold_creates -= 1;
            guard.held += 1;
            state.1.notify_all();
        }
        (hold, reply)
    };
    let (hold, reply) = hold;
    if hold {
        // Hold the answer until the test lets it go, polling so that the
        // runtime's threads stay free.
        loop {
            if state.0.lock().unwrap().released {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(reply)
}

fn handle(state: &mut State, operation: &str, input: &Value) -> Response<Full<Bytes>> {
    let name = |key: &str| input.get(key).and_then(Value::as_str).map(str::to_owned);
    let behaviour = state.behaviour.clone();
    state.workgroups.retain(|_, w| w.deleted.is_none_or(|d| d.elapsed() < behaviour.delete_after));
    match operation {
        "GetNamespace" => {
            let namespace = name("namespaceName").unwrap_or_default();
            if state.namespaces.contains_key(&namespace) {
                ok(json!({ "namespace": describe_namespace(&namespace) }))
            } else {
                error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &format!("Namespace {namespace} not found"))
            }
        }
        "CreateNamespace" => {
            let Some(namespace) = name("namespaceName") else {
                return error(StatusCode::BAD_REQUEST, "ValidationException", "namespaceName is required");
            };
            if state.namespaces.contains_key(&namespace) {
                return error(StatusCode::BAD_REQUEST, "ConflictException", &format!("Namespace {namespace} already exists"));
            }
            let created = Namespace { tags: tags_of(input), admin_username: name("adminUsername"), database: name("dbName") };
            state.namespaces.insert(namespace.clone(), created);
            ok(json!({ "namespace": describe_namespace(&namespace) }))
        }
        "DeleteNamespace" => {
            let namespace = name("namespaceName").unwrap_or_default();
            if !state.namespaces.contains_key(&namespace) {
                return error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &format!("Namespace {namespace} not found"));
            }
            if state.workgroups.values().any(|w| w.namespace == namespace) {
                return error(StatusCode::BAD_REQUEST, "ConflictException", &format!("Namespace {namespace} has a workgroup; delete it first"));
            }
            state.namespaces.remove(&namespace);
            ok(json!({ "namespace": describe_namespace(&namespace) }))
        }
        "ListNamespaces" => {
            let start: usize = name("nextToken").and_then(|t| t.parse().ok()).unwrap_or(0);
            let all: Vec<Value> = state.namespaces.keys().map(|n| describe_namespace(n)).collect();
            let mut body = json!({ "namespaces": all.iter().skip(start).take(2).cloned().collect::<Vec<_>>() });
            if start + 2 < all.len() {
                body["nextToken"] = json!((start + 2).to_string());
            }
            ok(body)
        }
        "CreateWorkgroup" => {
            if state.faults.throttle_creates > 0 {
                state.faults.throttle_creates -= 1;
                return error(StatusCode::BAD_REQUEST, "ThrottlingException", "Rate exceeded");
            }
            if state.faults.fail_creates > 0 {
                state.faults.fail_creates -= 1;
                return error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerException", "The service failed to process the request");
            }
            let (Some(workgroup), Some(namespace)) = (name("workgroupName"), name("namespaceName")) else {
                return error(StatusCode::BAD_REQUEST, "ValidationException", "workgroupName and namespaceName are required");
            };
            if !state.namespaces.contains_key(&namespace) {
                return error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &format!("Namespace {namespace} not found"));
            }
            if let Some(other) = state.workgroups.values().find(|w| w.namespace == namespace) {
                return error(StatusCode::BAD_REQUEST, "ConflictException", &format!("Namespace {namespace} already has workgroup {}", other.name));
            }
            let base_capacity = input.get("baseCapacity").and_then(Value::as_i64).unwrap_or(128);
            if !(8..=1024).contains(&base_capacity) || base_capacity % 8 != 0 {
                return error(StatusCode::BAD_REQUEST, "ValidationException", &format!("baseCapacity {base_capacity} must be a multiple of 8 between 8 and 1024"));
            }
            if state.workgroups.contains_key(&workgroup) {
                return error(StatusCode::BAD_REQUEST, "ConflictException", &format!("Workgroup {workgroup} already exists"));
            }
            let tags = tags_of(input);
            let never_available = state.faults.never_available > 0;
            if never_available {
                state.faults.never_available -= 1;
            }
            let created =
                Workgroup { name: workgroup.clone(), namespace, base_capacity, tags, created: Instant::now(), deleted: None, never_available };
            let body = json!({ "workgroup": describe(&created, &behaviour) });
            state.workgroups.insert(workgroup, created);
            ok(body)
        }
        "GetWorkgroup" | "DeleteWorkgroup" => {
            let workgroup = name("workgroupName").unwrap_or_default();
            let Some(found) = state.workgroups.get_mut(&workgroup) else {
                return error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &format!("Workgroup {workgroup} not found"));
            };
            if operation == "DeleteWorkgroup" && found.deleted.is_none() {
                found.deleted = Some(Instant::now());
            }
            ok(json!({ "workgroup": describe(found, &behaviour) }))
        }
        "ListWorkgroups" => {
            // Pages of two, so that the client must follow nextToken.
            let start: usize = name("nextToken").and_then(|t| t.parse().ok()).unwrap_or(0);
            let all: Vec<Value> = state.workgroups.values().map(|w| describe(w, &behaviour)).collect();
            let page: Vec<Value> = all.iter().skip(start).take(2).cloned().collect();
            let mut body = json!({ "workgroups": page });
            if start + 2 < all.len() {
                body["nextToken"] = json!((start + 2).to_string());
            }
            ok(body)
        }
        "ListTagsForResource" => {
            let arn_asked = name("resourceArn").unwrap_or_default();
            let tags = match state.workgroups.values().find(|w| arn(&w.name) == arn_asked) {
                Some(w) => Some(&w.tags),
                None => state.namespaces.iter().find(|(n, _)| namespace_arn(n) == arn_asked).map(|(_, ns)| &ns.tags),
            };
            match tags {
                Some(tags) => ok(json!({ "tags": tags.iter().map(|(k, v)| json!({ "key": k, "value": v })).collect::<Vec<_>>() })),
                None => error(StatusCode::BAD_REQUEST, "ResourceNotFoundException", &format!("Resource {arn_asked} not found")),
            }
        }
        other => error(StatusCode::BAD_REQUEST, "UnknownOperationException", &format!("the stand-in does not serve {other}")),
    }
}
