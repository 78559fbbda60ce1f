//! The admin HTTP API (actix-web): every actor's observable state, recent
//! decisions, health and Prometheus metrics. Errors are JSON bodies
//! `{"error": "...", "code": "NOT_FOUND"}` with the HTTP status from
//! `slogate_proto::error::status_codes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use slogate_actors::autoscaler::{self, AutoscalerActor};
use slogate_actors::metrics::Histogram;
use slogate_actors::backend::{Backend, BackendState};
use slogate_actors::provider::Provider;
use slogate_actors::reservoir::{self, ReservoirActor};
use slogate_actors::router::{self, RouterShard};
use slogate_actors::shards::RouterShards;
use slogate_actors::tracker;
use slogate_actors::tuner;
use slogate_core::model::{ClusterState, PoolId};
use slogate_proto::GatewayError;

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The RouterShards, and which pool each owns.
    pub router: RouterShards,
    /// The Reservoir.
    pub reservoir: Addr<ReservoirActor>,
    /// Each pool's backend and provider.
    pub backends: Vec<PoolBackends>,
    /// Bearer token for protected calls; empty refuses them.
    pub token: String,
    /// Whether reads need the token.
    pub reads_require_token: bool,
    /// False once shutdown starts.
    pub ready: Arc<AtomicBool>,
    /// Latency histograms.
    pub histograms: Histograms,
    /// Each autoscaling pool's Autoscaler.
    pub autoscalers: Vec<(PoolId, Addr<AutoscalerActor>)>,
    /// Each tuned pool's Tuner.
    pub tuners: Vec<(PoolId, Addr<tuner::TunerActor>)>,
    /// Each Iconq+ pool's Retrainer (builds with the trainer).
    pub retrainers: Vec<(PoolId, Addr<slogate_actors::retrainer::RetrainerActor>)>,
    /// Calls refused for a missing or wrong token.
    pub auth_failures: Arc<std::sync::atomic::AtomicU64>,
    /// The tenants, whose tokens read their own queries and decisions.
    pub tenants: Arc<super::tenants::Tenants>,
    /// The gRPC intake's backpressure on the reservoir.
    pub intake: super::grpc::Intake,
    /// The deployment, when this node is one of several.
    pub fleet: Option<Arc<super::fleet::Fleet>>,
    /// The node's clock.
    pub clock: slogate_actors::clock::VirtualClock,
}

/// The largest request body the admin API reads, bytes.
pub const BODY_BYTES_MAX: usize = 64 << 10;

/// A pool's backend and provider.
#[derive(Clone)]
pub struct PoolBackends {
    /// The pool.
    pub pool: PoolId,
    /// What runs its queries.
    pub backend: Arc<dyn Backend>,
    /// What creates and releases its clusters.
    pub provider: Arc<dyn Provider>,
    /// Its queries' latencies.
    pub query_latency: Arc<Histogram>,
}

/// The node's latency histograms.
#[derive(Clone)]
pub struct Histograms {
    /// Wall time of each routing decision.
    pub decision_time: Arc<Histogram>,
    /// Each query's time in slogate outside the backend.
    pub added_latency: Arc<Histogram>,
    /// How late each RouterShard's lag probe fires, by shard index.
    pub event_loop_lag: Vec<Arc<Histogram>>,
}

/// A route of the admin API: its path, the one method it takes, and its
/// handler.
pub struct AdminRoute {
    /// The path, with `{name}` segments.
    pub path: &'static str,
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    handler: fn() -> actix_web::Route,
}

/// Every route of the admin API: [`routes`] registers exactly these, and
/// `/v1/openapi.json` describes exactly these (a test holds the two
/// together).
pub const ROUTES: &[AdminRoute] = &[
    AdminRoute { path: "/healthz", method: "GET", handler: || web::get().to(healthz) },
    AdminRoute { path: "/readyz", method: "GET", handler: || web::get().to(readyz) },
    AdminRoute { path: "/metrics", method: "GET", handler: || web::get().to(metrics) },
    AdminRoute { path: "/v1/openapi.json", method: "GET", handler: || web::get().to(openapi) },
    AdminRoute { path: "/v1/pools", method: "GET", handler: || web::get().to(pools) },
    AdminRoute { path: "/v1/pools/{pool}", method: "GET", handler: || web::get().to(pool) },
    AdminRoute { path: "/v1/pools/{pool}/queries", method: "GET", handler: || web::get().to(queries) },
    AdminRoute { path: "/v1/pools/{pool}/clusters", method: "POST", handler: || web::post().to(add_cluster) },
    AdminRoute { path: "/v1/pools/{pool}/clusters/{cluster}", method: "DELETE", handler: || web::delete().to(remove_cluster) },
    AdminRoute { path: "/v1/pools/{pool}/tune", method: "POST", handler: || web::post().to(tune) },
    AdminRoute { path: "/v1/pools/{pool}/shadow", method: "GET", handler: || web::get().to(shadow) },
    AdminRoute { path: "/v1/pools/{pool}/predictor/retrain", method: "POST", handler: || web::post().to(retrain) },
    AdminRoute { path: "/v1/actors", method: "GET", handler: || web::get().to(actors) },
    AdminRoute { path: "/v1/decisions", method: "GET", handler: || web::get().to(decisions) },
    AdminRoute { path: "/v1/fleet", method: "GET", handler: || web::get().to(fleet) },
    AdminRoute { path: "/v1/node", method: "GET", handler: || web::get().to(node) },
    AdminRoute { path: "/ui", method: "GET", handler: || web::get().to(super::ui::page) },
    AdminRoute { path: "/ui/app.js", method: "GET", handler: || web::get().to(super::ui::script) },
    AdminRoute { path: "/ui/style.css", method: "GET", handler: || web::get().to(super::ui::style) },
    AdminRoute { path: "/ui/uPlot.iife.min.js", method: "GET", handler: || web::get().to(super::ui::chart_script) },
    AdminRoute { path: "/ui/uPlot.min.css", method: "GET", handler: || web::get().to(super::ui::chart_style) },
];

/// The OpenAPI 3.1 description of [`ROUTES`], their bodies and errors.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Routes of the admin API ([`ROUTES`]). A path it has answers any other
/// method with 405 and an `Allow` header, and a path it lacks with 404,
/// both as JSON.
pub fn routes(config: &mut web::ServiceConfig) {
    for route in ROUTES {
        config.service(resource(route.path, route.method).route((route.handler)()));
    }
    config.default_service(web::to(|request: HttpRequest| async move {
        error_response(&GatewayError::NoRoute { method: request.method().to_string(), path: clipped(request.path()) })
    }));
}

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(OPENAPI_JSON)
}

/// A route at `path` that answers methods other than `allowed` with 405.
fn resource(path: &'static str, allowed: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |request: HttpRequest| async move {
        let error = GatewayError::MethodNotAllowed { method: request.method().to_string(), path: clipped(request.path()), allowed: allowed.to_owned() };
        let mut response = error_response(&error);
        response.headers_mut().insert(actix_web::http::header::ALLOW, actix_web::http::header::HeaderValue::from_static(allowed));
        response
    }))
}

/// At most 200 bytes of a client's path, for an error message.
fn clipped(path: &str) -> String {
    let mut end = path.len().min(200);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path[..end].to_owned()
}

/// Reads a request body of at most [`BODY_BYTES_MAX`] bytes.
async fn read_body(mut payload: web::Payload) -> Result<web::BytesMut, GatewayError> {
    use futures_util::StreamExt as _;
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| GatewayError::InvalidArgument(format!("cannot read the request body: {e}")))?;
        if body.len() + chunk.len() > BODY_BYTES_MAX {
            return Err(GatewayError::BodyTooLarge { max: BODY_BYTES_MAX });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A JSON object body as `T`: arrays and scalars are refused even where
/// serde would read them as `T`'s fields in order.
fn object_body<T: serde::de::DeserializeOwned>(body: &[u8], example: &str) -> Result<T, GatewayError> {
    let shape = |reason: String| GatewayError::InvalidArgument(format!("body must be a JSON object like {example}: {reason}"));
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| shape(e.to_string()))?;
    if !value.is_object() {
        return Err(shape("got another JSON value".into()));
    }
    serde_json::from_value(value).map_err(|e| shape(e.to_string()))
}

/// A cluster id from a path: `c3` or `3`, ASCII digits only.
pub fn parse_cluster_id(text: &str) -> Result<slogate_core::model::ClusterId, GatewayError> {
    let digits = text.strip_prefix('c').unwrap_or(text);
    let malformed = || GatewayError::InvalidArgument(format!("cluster id must look like `c3` or `3`, got `{}`", clipped(text)));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    digits.parse::<u32>().map(slogate_core::model::ClusterId).map_err(|_| malformed())
}

/// Whether `presented` is `expected`, in time independent of where they
/// differ (only the length shows).
fn tokens_match(presented: &str, expected: &str) -> bool {
    let (a, b) = (presented.as_bytes(), expected.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// A JSON error response for `error`.
pub fn error_response(error: &GatewayError) -> HttpResponse {
    #[derive(Serialize)]
    struct Body {
        error: String,
        code: String,
    }
    let status = StatusCode::from_u16(error.http_status()).expect("mapped statuses are valid");
    let code = format!("{:?}", error.to_status().code());
    HttpResponse::build(status).json(Body { error: error.to_string(), code: upper_snake(&code) })
}

fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_uppercase());
    }
    out
}

fn authorised(request: &HttpRequest, state: &AdminState, write: bool) -> Result<(), GatewayError> {
    if !write && !state.reads_require_token {
        return Ok(());
    }
    let presented = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(token) if !state.token.is_empty() && tokens_match(token, &state.token) => Ok(()),
        _ => {
            let failures = state.auth_failures.fetch_add(1, Ordering::Relaxed) + 1;
            let peer = request.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::warn!(message = "Admin call refused: missing or wrong token.", path = %clipped(request.path()), %peer, failures);
            Err(GatewayError::Unauthenticated)
        }
    }
}

/// Who reads queries and decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Viewer {
    /// The operator: everything.
    All,
    /// A tenant: its own only.
    Tenant(String),
}

impl Viewer {
    fn tenant(&self) -> Option<String> {
        match self {
            Viewer::All => None,
            Viewer::Tenant(name) => Some(name.clone()),
        }
    }
}

/// Who may read queries and decisions: the admin token reads all, a
/// tenant's token its own; with tenants configured, nothing without one.
fn viewer(request: &HttpRequest, state: &AdminState) -> Result<Viewer, GatewayError> {
    let presented = super::tenants::bearer(request.headers().get("authorization").and_then(|v| v.to_str().ok()));
    match presented {
        Some(token) if !state.token.is_empty() && tokens_match(token, &state.token) => Ok(Viewer::All),
        Some(token) => match state.tenants.find(token) {
            Some(tenant) => Ok(Viewer::Tenant(tenant.name.clone())),
            None => authorised(request, state, true).map(|()| Viewer::All),
        },
        None if state.tenants.enabled() => authorised(request, state, true).map(|()| Viewer::All),
        None => authorised(request, state, false).map(|()| Viewer::All),
    }
}

fn mailbox(_: actix::MailboxError) -> GatewayError {
    GatewayError::Unavailable("an actor is not answering".into())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

async fn readyz(state: web::Data<AdminState>) -> HttpResponse {
    if state.ready.load(Ordering::Relaxed) {
        HttpResponse::Ok().body("ready\n")
    } else {
        error_response(&GatewayError::ShuttingDown)
    }
}

/// `GET /v1/node`: this node: its version, readiness, clock (virtual
/// seconds since start, and how many pass per real second), whether reads
/// need the token, and its pools.
async fn node(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Err(e) = authorised(&request, &state, false) {
        return error_response(&e);
    }
    let node_id = state.fleet.as_ref().map(|f| f.node_id.clone()).unwrap_or_default();
    let pools: Vec<&str> = state.backends.iter().map(|b| b.pool.as_str()).collect();
    HttpResponse::Ok().json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "node_id": node_id,
        "ready": state.ready.load(Ordering::Relaxed),
        "virtual_now_s": state.clock.now().as_secs_f64(),
        "calendar_now_s": state.clock.calendar_now_s(),
        "time_compression": state.clock.compression(),
        "reads_require_token": state.reads_require_token,
        "pools": pools,
    }))
}

/// A pool as the admin API shows it.
#[derive(Serialize)]
struct PoolView {
    #[serde(flatten)]
    router: router::PoolState,
    /// What the clusters have billed so far, dollars: the vendor's bill
    /// when the backend knows it, else the trackers' estimates.
    billed_usd: f64,
    /// What the elastic tier billed so far, dollars (zero without one).
    elastic_billed_usd: f64,
    /// The two together: what the pool has cost.
    total_billed_usd: f64,
    backend: Option<BackendState>,
}

fn backend_unavailable(error: slogate_actors::backend::ExecuteError) -> GatewayError {
    GatewayError::Unavailable(error.to_string())
}

/// The shard that owns `pool`.
fn shard_of<'a>(state: &'a AdminState, pool: &PoolId) -> Result<&'a Addr<RouterShard>, GatewayError> {
    state.router.for_pool(pool).ok_or_else(|| GatewayError::UnknownPool(pool.to_string()))
}

/// The states of `pool`'s cluster trackers, by cluster id.
async fn tracker_states(state: &AdminState, pool: &PoolId) -> Result<Vec<tracker::TrackerState>, GatewayError> {
    let mut states = Vec::new();
    for (_, tracker) in shard_of(state, pool)?.send(router::GetTrackers(pool.clone())).await.map_err(mailbox)? {
        states.push(tracker.send(tracker::GetState).await.map_err(mailbox)?);
    }
    Ok(states)
}

async fn pool_views(state: &AdminState) -> Result<Vec<PoolView>, GatewayError> {
    let router = state.router.state().await.map_err(mailbox)?;
    views_of(state, router.pools).await
}

/// `pool`'s state, from its own shard alone.
async fn pool_state(state: &AdminState, pool: &PoolId) -> Result<router::PoolState, GatewayError> {
    let shard = shard_of(state, pool)?.send(router::GetState).await.map_err(mailbox)?;
    shard.pools.into_iter().find(|p| p.id == *pool).ok_or_else(|| GatewayError::UnknownPool(pool.to_string()))
}

async fn views_of(state: &AdminState, pools: Vec<router::PoolState>) -> Result<Vec<PoolView>, GatewayError> {
    let mut views = Vec::new();
    for pool in pools {
        let backend = match state.backends.iter().find(|b| b.pool == pool.id) {
            Some(backends) => Some(backends.backend.state().await.map_err(backend_unavailable)?),
            None => None,
        };
        let billed_usd = match backend.as_ref().and_then(|b| b.vendor_billed_usd) {
            Some(billed) => billed,
            None => tracker_states(state, &pool.id).await?.iter().map(|t| t.billed_usd_estimate).sum(),
        };
        let elastic_billed_usd = backend.as_ref().map_or(0.0, |b| b.elastic_billed_usd);
        views.push(PoolView { router: pool, billed_usd, elastic_billed_usd, total_billed_usd: billed_usd + elastic_billed_usd, backend });
    }
    Ok(views)
}

async fn pools(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    let result = async {
        authorised(&request, &state, false)?;
        pool_views(&state).await
    }
    .await;
    match result {
        Ok(views) => HttpResponse::Ok().json(views),
        Err(e) => error_response(&e),
    }
}

async fn pool(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>) -> HttpResponse {
    let name = path.into_inner();
    let result = async {
        authorised(&request, &state, false)?;
        let pool = pool_state(&state, &PoolId::new(name.as_str())).await?;
        Ok::<_, GatewayError>(views_of(&state, vec![pool]).await?.remove(0))
    }
    .await;
    match result {
        Ok(view) => HttpResponse::Ok().json(view),
        Err(e) => error_response(&e),
    }
}

/// `?state=running|done&limit=N`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueriesQuery {
    state: Option<String>,
    limit: Option<usize>,
}

async fn queries(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>) -> HttpResponse {
    let name = path.into_inner();
    let params = match web::Query::<QueriesQuery>::from_query(request.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return error_response(&GatewayError::InvalidArgument(format!("query string: {e}"))),
    };
    let result = async {
        let viewer = viewer(&request, &state)?;
        let limit = params.limit.unwrap_or(100).min(10_000);
        let which = params.state.as_deref().unwrap_or("running");
        let pool = pool_state(&state, &PoolId::new(name.as_str())).await?;
        match which {
            "running" => {
                let mine: Option<std::collections::HashSet<slogate_core::model::QueryId>> = match viewer.tenant() {
                    Some(tenant) => Some(
                        shard_of(&state, &pool.id)?.send(router::GetTenantInFlight { pool: pool.id.clone(), tenant }).await.map_err(mailbox)?.into_iter().collect(),
                    ),
                    None => None,
                };
                let running: Vec<serde_json::Value> = pool
                    .clusters
                    .iter()
                    .filter(|c| c.state != ClusterState::Gone)
                    .flat_map(|c| c.running.iter().map(move |q| (c.id, q)))
                    .filter(|(_, q)| mine.as_ref().is_none_or(|mine| mine.contains(&q.id)))
                    .map(|(cluster, q)| serde_json::json!({"cluster": cluster, "query": q}))
                    .take(limit)
                    .collect();
                Ok(serde_json::json!({"state": "running", "queries": running}))
            }
            "done" => {
                let done = shard_of(&state, &pool.id)?.send(router::GetRecentOutcomes { pool: pool.id.clone(), limit, tenant: viewer.tenant() }).await.map_err(mailbox)?;
                Ok(serde_json::json!({"state": "done", "queries": done}))
            }
            other => Err(GatewayError::InvalidArgument(format!("state must be `running` or `done`, got `{other}`"))),
        }
    }
    .await;
    match result {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(e) => error_response(&e),
    }
}

/// `GET /v1/actors?pool=NAME`'s query.
#[derive(Deserialize)]
struct ActorsQuery {
    pool: Option<String>,
}

/// One pool's actors on this node: its RouterShard's view of it, its
/// trackers, backend, provider, Autoscaler and Tuner.
pub async fn pool_actors(state: &AdminState, pool: &PoolId) -> Result<serde_json::Value, GatewayError> {
    let router = pool_state(state, pool).await?;
    let backends = state.backends.iter().find(|b| b.pool == *pool).ok_or_else(|| GatewayError::UnknownPool(pool.to_string()))?;
    let backend = backends.backend.state().await.map_err(backend_unavailable)?;
    let provider = backends.provider.state().await.map_err(backend_unavailable)?;
    let trackers = tracker_states(state, pool).await?;
    let autoscaler = match state.autoscalers.iter().find(|(id, _)| id == pool) {
        Some((_, actor)) => Some(actor.send(autoscaler::GetState).await.map_err(mailbox)?),
        None => None,
    };
    let tuner = match state.tuners.iter().find(|(id, _)| id == pool) {
        Some((_, actor)) => Some(actor.send(tuner::GetState).await.map_err(mailbox)?),
        None => None,
    };
    Ok(serde_json::json!({
        "node": state.fleet.as_ref().map(|f| f.node_id.clone()).unwrap_or_default(),
        "pool": router,
        "cluster_trackers": trackers,
        "backend": backend,
        "provider": provider,
        "autoscaler": autoscaler,
        "tuner": tuner,
    }))
}

async fn actors(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    let params = match web::Query::<ActorsQuery>::from_query(request.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return error_response(&GatewayError::InvalidArgument(format!("query string: {e}"))),
    };
    if let Some(pool) = params.pool {
        let result = async {
            authorised(&request, &state, false)?;
            let pool = PoolId::new(pool);
            shard_of(&state, &pool)?;
            // In a fleet, the pool's owner shows its actors.
            if let Some(fleet) = &state.fleet
                && let super::fleet::Placement::Remote { node, addr } = fleet.placement(&pool.0)
            {
                let json = fleet
                    .pool_actors_of(&addr, &pool.0)
                    .await
                    .map_err(|status| GatewayError::Unavailable(format!("pool `{pool}`'s owner {node} did not answer: {}", status.message())))?;
                return serde_json::from_str(&json).map_err(|e| GatewayError::Internal(format!("node {node} answered with bad JSON: {e}")));
            }
            pool_actors(&state, &pool).await
        }
        .await;
        return match result {
            Ok(body) => HttpResponse::Ok().json(body),
            Err(e) => error_response(&e),
        };
    }
    let result = async {
        authorised(&request, &state, false)?;
        let router = state.router.state().await.map_err(mailbox)?;
        let reservoir = state.reservoir.send(reservoir::GetState).await.map_err(mailbox)?;
        let mut backend_states = serde_json::Map::new();
        let mut trackers = serde_json::Map::new();
        let mut providers = serde_json::Map::new();
        for backends in &state.backends {
            let pool = &backends.pool;
            let backend = backends.backend.state().await.map_err(backend_unavailable)?;
            backend_states.insert(pool.to_string(), serde_json::to_value(backend).expect("state serialises"));
            let provider = backends.provider.state().await.map_err(backend_unavailable)?;
            providers.insert(pool.to_string(), serde_json::to_value(provider).expect("state serialises"));
            let pool_trackers = tracker_states(&state, pool).await?;
            trackers.insert(pool.to_string(), serde_json::to_value(pool_trackers).expect("state serialises"));
        }
        let mut autoscalers = serde_json::Map::new();
        for (pool, actor) in &state.autoscalers {
            let autoscaler = actor.send(autoscaler::GetState).await.map_err(mailbox)?;
            autoscalers.insert(pool.to_string(), serde_json::to_value(autoscaler).expect("state serialises"));
        }
        let mut tuners = serde_json::Map::new();
        for (pool, actor) in &state.tuners {
            let tuner = actor.send(tuner::GetState).await.map_err(mailbox)?;
            tuners.insert(pool.to_string(), serde_json::to_value(tuner).expect("state serialises"));
        }
        let mut retrainers = serde_json::Map::new();
        for (pool, actor) in &state.retrainers {
            let retrainer = actor.send(slogate_actors::retrainer::GetState).await.map_err(mailbox)?;
            retrainers.insert(pool.to_string(), serde_json::to_value(retrainer).expect("state serialises"));
        }
        Ok::<_, GatewayError>(serde_json::json!({
            "router_shard": router,
            "autoscalers": autoscalers,
            "tuners": tuners,
            "retrainers": retrainers,
            "cluster_trackers": trackers,
            "providers": providers,
            "reservoir": reservoir,
            "backends": backend_states,
        }))
    }
    .await;
    match result {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(e) => error_response(&e),
    }
}

/// `GET /v1/fleet`: this node's view of the deployment (members, each
/// pool's owner, the pools it is handing over, its lease, the moves it
/// made) and each member's own report over the Node service (an error in
/// place of a member that does not answer within a second). A single node
/// reports itself as the only member, owning every pool.
async fn fleet(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Err(error) = authorised(&request, &state, false) {
        return error_response(&error);
    }
    let Some(fleet) = &state.fleet else {
        let pools: Vec<&str> = state.backends.iter().map(|b| b.pool.as_str()).collect();
        return HttpResponse::Ok().json(serde_json::json!({
            "mode": "single",
            "node_id": "",
            "members": {},
            "owners": pools.iter().map(|p| (p.to_string(), serde_json::Value::String(String::new()))).collect::<serde_json::Map<_, _>>(),
            "owned": pools,
        }));
    };
    let view = fleet.view();
    let mut reports = serde_json::Map::new();
    let asked: Vec<_> = view
        .members
        .iter()
        .filter(|(id, _)| **id != fleet.node_id)
        .map(|(id, addr)| {
            let fleet = fleet.clone();
            let (id, addr) = (id.clone(), addr.clone());
            async move { (id, fleet.state_of(&addr, std::time::Duration::from_secs(1)).await) }
        })
        .collect();
    for (id, report) in futures_util::future::join_all(asked).await {
        let value = match report {
            Ok(state) => serde_json::json!({
                "grpc_addr": state.grpc_addr,
                "pools_owned": state.pools_owned,
                "lease_left_s": state.lease_left_s,
                "forwarded": state.forwarded,
                "received": state.received,
            }),
            Err(status) => serde_json::json!({ "error": format!("{:?}: {}", status.code(), status.message()) }),
        };
        reports.insert(id, value);
    }
    let own = fleet.state();
    reports.insert(
        fleet.node_id.clone(),
        serde_json::json!({
            "grpc_addr": own.grpc_addr,
            "pools_owned": own.pools_owned,
            "lease_left_s": own.lease_left_s,
            "forwarded": own.forwarded,
            "received": own.received,
        }),
    );
    HttpResponse::Ok().json(serde_json::json!({
        "mode": fleet.mode_name(),
        "node_id": fleet.node_id,
        "deployment": fleet.deployment,
        "coordinator_reachable": view.coordinator_reachable,
        "read_age_s": fleet.now_s() - view.read_at_s,
        "lease_left_s": own.lease_left_s,
        "members": view.members,
        "owners": view.owners,
        "owned": own.pools_owned,
        "releasing": view.releasing,
        "moves": fleet.moves(),
        "relearned": fleet.relearned_counts(),
        "reforwarded": fleet.reforwarded.load(Ordering::Relaxed),
        "reports": reports,
    }))
}

/// `GET /v1/pools/{pool}/shadow`: a shadow-mode pool's comparison. The
/// acting policy's placements as they ran (realised VR, the pool's bill)
/// and as slogate predicted them (VR, and the cost its billing model says
/// they add), against slogate's predictions for its own choices, on the
/// same model. The spinups and releases slogate's autoscaler or tuner
/// asked for are in `would_provision` (the provider is a dry run).
async fn shadow(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>) -> HttpResponse {
    let pool = PoolId::new(path.into_inner());
    let result = async {
        authorised(&request, &state, false)?;
        let router_state = pool_state(&state, &pool).await?;
        let report = shard_of(&state, &pool)?.send(router::GetShadow(pool.clone())).await.map_err(mailbox)?;
        let report = report.ok_or_else(|| GatewayError::NotShadowed(pool.to_string()))?;
        let view = views_of(&state, vec![router_state]).await?.remove(0);
        let would_provision = match state.backends.iter().find(|b| b.pool == pool) {
            Some(backends) => backends.provider.state().await.map_err(backend_unavailable)?.recent,
            None => Vec::new(),
        };
        Ok::<_, GatewayError>(serde_json::json!({
            "pool": pool.0,
            "mode": "shadow",
            "acting": report.acting,
            "shadow": report.shadow,
            "decisions": report.decisions,
            "agreed": report.agreed,
            "agreement": report.agreement,
            "actual": {
                "finished": report.finished,
                "violations": report.violations,
                "vr": report.realised_vr,
                "billed_usd": view.total_billed_usd,
                "slogate_predicted": report.actual_predicted,
            },
            "slogate": {
                "predicted": report.shadow_predicted,
            },
            "would_provision": would_provision,
            "recent": report.recent,
        }))
    }
    .await;
    match result {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/pools/{pool}/tune`: starts a tuning run (202), unless one is
/// going (409). Progress and the result show in `GET /v1/actors`.
async fn tune(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>) -> HttpResponse {
    let pool = PoolId::new(path.into_inner());
    let result = async {
        authorised(&request, &state, true)?;
        let Some((_, tuner)) = state.tuners.iter().find(|(id, _)| *id == pool) else {
            let exists = state.backends.iter().any(|b| b.pool == pool);
            return Err(if exists { GatewayError::NoTuner(pool.to_string()) } else { GatewayError::UnknownPool(pool.to_string()) });
        };
        tuner.send(tuner::StartTuning { reason: "operator".to_owned() }).await.map_err(mailbox)?.map_err(router_error)
    }
    .await;
    match result {
        Ok(()) => HttpResponse::Accepted().json(serde_json::json!({"pool": pool.0, "state": "tuning"})),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/pools/{pool}/predictor/retrain`: starts retraining the
/// pool's Iconq+ model (202), unless a run is going (409). The pool must
/// predict with Iconq+ on a node built with the trainer (409 otherwise).
/// Progress, the model in force and the last run's scores show in `GET
/// /v1/actors`.
async fn retrain(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>) -> HttpResponse {
    let pool = PoolId::new(path.into_inner());
    let result = async {
        authorised(&request, &state, true)?;
        let Some((_, retrainer)) = state.retrainers.iter().find(|(id, _)| *id == pool) else {
            if !state.backends.iter().any(|b| b.pool == pool) {
                return Err(GatewayError::UnknownPool(pool.to_string()));
            }
            return Err(GatewayError::Conflict(format!(
                "pool `{pool}` has no learned model to retrain: it needs predictor = \"iconq\" on a slogate built with the trainer (--features learn)"
            )));
        };
        retrainer.send(slogate_actors::retrainer::StartRetraining { reason: "operator".to_owned() }).await.map_err(mailbox)?.map_err(router_error)
    }
    .await;
    match result {
        Ok(()) => HttpResponse::Accepted().json(serde_json::json!({"pool": pool.0, "state": "retraining"})),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/pools/{pool}/clusters` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCluster {
    /// Size in RPU.
    size: u32,
}

/// The size a `POST /v1/pools/{pool}/clusters` body asks for: a JSON
/// object `{"size": N}` with N in 1–1024 RPU.
pub fn parse_new_cluster(body: &[u8]) -> Result<slogate_core::model::Rpu, GatewayError> {
    let new: NewCluster = object_body(body, r#"{"size": 16}"#)?;
    if new.size == 0 || new.size > 1_024 {
        return Err(GatewayError::InvalidArgument(format!("size must be 1–1024 RPU, got {}", new.size)));
    }
    Ok(slogate_core::model::Rpu(new.size))
}

/// In a fleet, only a pool's owner adds or removes its clusters (another
/// node's would be clusters nobody routes to, and a cloud pool's owner
/// reconciles its resources when it takes the pool over).
fn owner_only(state: &AdminState, pool: &PoolId) -> Result<(), GatewayError> {
    let Some(fleet) = &state.fleet else { return Ok(()) };
    match fleet.placement(&pool.0) {
        super::fleet::Placement::Local => Ok(()),
        super::fleet::Placement::Remote { node, .. } => {
            Err(GatewayError::Conflict(format!("this node does not own pool `{pool}` now; ask its owner, node `{node}`")))
        }
        super::fleet::Placement::Unowned => Err(GatewayError::Conflict(format!("pool `{pool}` is changing hands; ask again shortly"))),
    }
}

fn router_error(error: slogate_actors::Error) -> GatewayError {
    super::grpc::gateway_error(error)
}

async fn add_cluster(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<String>, payload: web::Payload) -> HttpResponse {
    let pool = PoolId::new(path.into_inner());
    let result = async {
        authorised(&request, &state, true)?;
        let body = read_body(payload).await?;
        let size = parse_new_cluster(&body)?;
        shard_of(&state, &pool)?;
        owner_only(&state, &pool)?;
        let cluster = shard_of(&state, &pool)?
            .send(router::RequestCluster { pool: pool.clone(), size })
            .await
            .map_err(mailbox)?
            .map_err(router_error)?;
        Ok(cluster)
    }
    .await;
    match result {
        Ok(cluster) => HttpResponse::Accepted().json(serde_json::json!({"cluster": cluster, "state": "starting"})),
        Err(e) => error_response(&e),
    }
}

/// `DELETE /v1/pools/{pool}/clusters/{cluster}` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveClusterQuery {
    /// Release the pool's last ready cluster too.
    #[serde(default)]
    force: bool,
}

async fn remove_cluster(request: HttpRequest, state: web::Data<AdminState>, path: web::Path<(String, String)>) -> HttpResponse {
    let (pool, cluster) = path.into_inner();
    let result = async {
        authorised(&request, &state, true)?;
        let cluster = parse_cluster_id(&cluster)?;
        let query = web::Query::<RemoveClusterQuery>::from_query(request.query_string())
            .map_err(|e| GatewayError::InvalidArgument(format!("query string: {e} (the only parameter is force=true|false)")))?;
        let pool = PoolId::new(pool);
        shard_of(&state, &pool)?;
        owner_only(&state, &pool)?;
        let release = router::ReleaseCluster { pool: pool.clone(), cluster, force: query.force };
        shard_of(&state, &pool)?.send(release).await.map_err(mailbox)?.map_err(router_error)?;
        Ok(cluster)
    }
    .await;
    match result {
        Ok(cluster) => HttpResponse::Accepted().json(serde_json::json!({"cluster": cluster, "state": "draining"})),
        Err(e) => error_response(&e),
    }
}

/// `?limit=N`.
/// `GET /v1/decisions` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsQuery {
    limit: Option<usize>,
    /// `routing` (default) or `scaling`.
    kind: Option<String>,
    /// Only this pool's.
    pool: Option<String>,
    /// Only this tenant's routing decisions (an operator's filter; a
    /// tenant sees its own only).
    tenant: Option<String>,
}

/// One pool's scaling decision.
#[derive(Serialize)]
struct PoolScaleDecision {
    pool: PoolId,
    #[serde(flatten)]
    decision: slogate_core::scale::ScaleDecision,
}

/// `GET /v1/decisions?limit=N&kind=routing|scaling&pool=P&tenant=T`: the
/// newest routing decisions, or every autoscaling pool's newest scaling
/// decisions (fired triggers, selections with each candidate, spinups,
/// teardowns), of one pool or tenant if asked.
async fn decisions(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    let params = match web::Query::<DecisionsQuery>::from_query(request.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return error_response(&GatewayError::InvalidArgument(format!("query string: {e}"))),
    };
    let limit = params.limit.unwrap_or(100).min(10_000);
    let result = async {
        let viewer = viewer(&request, &state)?;
        let pool = params.pool.map(PoolId::new);
        if let Some(pool) = &pool {
            shard_of(&state, pool)?;
        }
        match params.kind.as_deref().unwrap_or("routing") {
            "routing" => {
                let tenant = match (viewer.tenant(), params.tenant) {
                    (Some(own), Some(asked)) if own != asked => {
                        return Err(GatewayError::PermissionDenied(format!("a tenant reads its own decisions, not tenant `{asked}`'s")));
                    }
                    (Some(own), _) => Some(own),
                    (None, asked) => asked,
                };
                let decisions = state.router.decisions(limit, tenant, pool).await.map_err(mailbox)?;
                Ok(serde_json::to_value(decisions).expect("decisions serialise"))
            }
            "scaling" => {
                if viewer != Viewer::All {
                    return Err(GatewayError::PermissionDenied("scaling decisions are the operator's: use the admin token".into()));
                }
                let mut all = Vec::new();
                for (pool, actor) in state.autoscalers.iter().filter(|(id, _)| pool.as_ref().is_none_or(|p| p == id)) {
                    for decision in actor.send(autoscaler::GetScaleDecisions { limit }).await.map_err(mailbox)? {
                        all.push(PoolScaleDecision { pool: pool.clone(), decision });
                    }
                }
                Ok(serde_json::to_value(all).expect("decisions serialise"))
            }
            other => Err(GatewayError::InvalidArgument(format!("kind `{other}` is not one of routing, scaling"))),
        }
    }
    .await;
    match result {
        Ok(decisions) => HttpResponse::Ok().json(decisions),
        Err(e) => error_response(&e),
    }
}

async fn metrics(request: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    use std::fmt::Write as _;
    let result = async {
        authorised(&request, &state, false)?;
        let reservoir = state.reservoir.send(reservoir::GetState).await.map_err(mailbox)?;
        Ok::<_, GatewayError>((pool_views(&state).await?, reservoir))
    }
    .await;
    let (views, reservoir) = match result {
        Ok(found) => found,
        Err(e) => return error_response(&e),
    };
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&PoolView) -> f64| {
        writeln!(out, "# HELP slogate_{name} {help}\n# TYPE slogate_{name} {kind}").expect("write to String");
        for view in &views {
            writeln!(out, "slogate_{name}{{pool=\"{}\"}} {}", view.router.id.0, value(view)).expect("write to String");
        }
    };
    family("submissions_total", "counter", "Queries accepted.", &|v| v.router.stats.accepted as f64);
    family("deduplicated_total", "counter", "Retries answered from the idempotency table.", &|v| v.router.stats.deduplicated as f64);
    family("refused_total", "counter", "Submissions refused at the admission limit.", &|v| v.router.stats.refused as f64);
    family("completed_total", "counter", "Queries completed.", &|v| v.router.stats.completed as f64);
    family("timed_out_total", "counter", "Queries cancelled at the backend's timeout.", &|v| v.router.stats.timed_out as f64);
    family("failed_total", "counter", "Queries that failed.", &|v| v.router.stats.failed as f64);
    family("offloads_rerouted_total", "counter", "Offloads the elastic tier throttled, routed to a cluster instead.", &|v| v.router.stats.offloads_rerouted as f64);
    family("slo_violations_total", "counter", "Queries that missed their SLO.", &|v| v.router.stats.violations as f64);
    family("in_flight", "gauge", "Queries in flight.", &|v| v.router.in_flight as f64);
    family("offloaded_total", "counter", "Queries sent to the elastic tier.", &|v| v.router.stats.offloaded as f64);
    family("elastic_billed_usd", "counter", "Dollars the elastic tier billed so far.", &|v| v.elastic_billed_usd);
    family("billed_usd", "counter", "Dollars the clusters billed so far (the vendor's bill, or slogate's estimate).", &|v| v.billed_usd);
    writeln!(
        out,
        "# HELP slogate_cluster_queries Queries on each cluster: executing, or waiting in its admission queue.\n# TYPE slogate_cluster_queries gauge"
    )
    .expect("write to String");
    for view in &views {
        let Some(backend) = &view.backend else { continue };
        for cluster in &view.router.clusters {
            let executing = backend.executing.iter().find(|(id, _)| *id == cluster.id).map_or(0, |&(_, n)| n);
            let waiting = cluster.running.len().saturating_sub(executing);
            let (pool, id) = (&view.router.id.0, cluster.id.0);
            writeln!(out, "slogate_cluster_queries{{pool=\"{pool}\",cluster=\"c{id}\",state=\"executing\"}} {executing}").expect("write to String");
            writeln!(out, "slogate_cluster_queries{{pool=\"{pool}\",cluster=\"c{id}\",state=\"waiting\"}} {waiting}").expect("write to String");
        }
    }
    let pools: Vec<String> = state.backends.iter().map(|b| format!("pool=\"{}\"", b.pool.0)).collect();
    let latencies: Vec<(&str, &Histogram)> = pools.iter().map(String::as_str).zip(state.backends.iter().map(|b| &*b.query_latency)).collect();
    slogate_actors::metrics::render_family(&mut out, "slogate_query_latency_seconds", "Each query's latency, arrival to end of its run, in the node's (virtual) seconds.", &latencies);
    state.histograms.decision_time.render(&mut out, "slogate_decision_time_seconds", "Wall time of each routing decision.", "");
    let shards: Vec<String> = (0..state.histograms.event_loop_lag.len()).map(|k| format!("shard=\"{k}\"")).collect();
    let lag: Vec<(&str, &Histogram)> = shards.iter().map(String::as_str).zip(state.histograms.event_loop_lag.iter().map(|h| &**h)).collect();
    slogate_actors::metrics::render_family(
        &mut out,
        "slogate_event_loop_lag_seconds",
        "How long a message sent to each RouterShard every 10 ms waits before its handler runs: behind the messages ahead of it and whatever else runs on the shard's thread.",
        &lag,
    );
    state.histograms.added_latency.render(
        &mut out,
        "slogate_gateway_added_latency_seconds",
        "Each query's time in slogate outside the backend.",
        "",
    );
    if state.tenants.enabled() {
        writeln!(out, "# HELP slogate_tenant_in_flight Queries in progress per tenant.\n# TYPE slogate_tenant_in_flight gauge").expect("write to String");
        for tenant in state.tenants.iter() {
            writeln!(out, "slogate_tenant_in_flight{{tenant=\"{}\"}} {}", tenant.name, tenant.in_flight()).expect("write to String");
        }
        writeln!(out, "# HELP slogate_tenant_throttled_total Submissions refused by a tenant's rate or in-flight limit.\n# TYPE slogate_tenant_throttled_total counter")
            .expect("write to String");
        for tenant in state.tenants.iter() {
            writeln!(out, "slogate_tenant_throttled_total{{tenant=\"{}\"}} {}", tenant.name, tenant.throttled.load(Ordering::Relaxed)).expect("write to String");
        }
    }
    writeln!(
        out,
        "# HELP slogate_grpc_auth_failures_total gRPC calls refused for a missing or unknown tenant token.\n# TYPE slogate_grpc_auth_failures_total counter\nslogate_grpc_auth_failures_total {}",
        state.tenants.failures.load(Ordering::Relaxed)
    )
    .expect("write to String");
    let mut node_metric = |name: &str, kind: &str, help: &str, value: u64| {
        writeln!(out, "# HELP slogate_{name} {help}\n# TYPE slogate_{name} {kind}\nslogate_{name} {value}").expect("write to String");
    };
    node_metric("reservoir_executions", "gauge", "Executions in the reservoir's log.", reservoir.executions);
    node_metric("reservoir_storage_errors_total", "counter", "Reservoir writes or flushes that failed.", reservoir.storage_errors);
    node_metric(
        "reservoir_pruned_rows_total",
        "counter",
        "Rows the reservoir's retention deleted: executions, idempotency records and history.",
        reservoir.executions_pruned + reservoir.idempotency_pruned + reservoir.history_rows_pruned,
    );
    if let Some(bytes) = reservoir.disk_bytes {
        node_metric("reservoir_disk_bytes", "gauge", "Bytes the reservoir's store takes on disk.", bytes);
    }
    node_metric("reservoir_backlog", "gauge", "Updates waiting for the reservoir's thread.", state.intake.reservoir_backlog.len() as u64);
    node_metric(
        "intake_held_total",
        "counter",
        "Queries the gRPC intake held while the reservoir's backlog was over reservoir.backlog_max.",
        state.intake.held.load(Ordering::Relaxed),
    );
    let failures = state.auth_failures.load(Ordering::Relaxed);
    writeln!(
        out,
        "# HELP slogate_admin_auth_failures_total Admin calls refused for a missing or wrong token.\n# TYPE slogate_admin_auth_failures_total counter\nslogate_admin_auth_failures_total {failures}"
    )
    .expect("write to String");
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_c_and_digits_or_digits_only() {
        assert_eq!(parse_cluster_id("c3").unwrap().0, 3);
        assert_eq!(parse_cluster_id("17").unwrap().0, 17);
        for bad in ["cccc4", "+3", "c+3", "c", "", "-1", "c3x", "٣", "99999999999"] {
            assert!(parse_cluster_id(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn bodies_must_be_objects_even_where_serde_reads_arrays_as_structs() {
        assert_eq!(object_body::<NewCluster>(br#"{"size": 16}"#, "x").unwrap().size, 16);
        for bad in [&b"[16]"[..], b"16", b"\"16\"", br#"{"size": 16, "extra": 1}"#, b"{size:"] {
            let error = object_body::<NewCluster>(bad, r#"{"size": 16}"#).err().expect("refused");
            assert_eq!(error.http_status(), 400, "{error}");
        }
    }

    #[test]
    fn the_openapi_description_lists_exactly_the_routes_the_server_registers_each_with_its_errors() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut described = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("a path item") {
                described.insert((path.clone(), method.to_uppercase()));
                let responses = operation["responses"].as_object().unwrap_or_else(|| panic!("{method} {path} has responses"));
                assert!(responses.keys().any(|code| code.starts_with('2')), "{method} {path} documents its success");
                for (code, response) in responses.iter().filter(|(code, _)| !code.starts_with('2')) {
                    assert_eq!(response["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/Error", "{method} {path} {code}");
                }
                // Every `{name}` in the path is a declared path parameter.
                let declared: Vec<&str> = operation["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "path").filter_map(|p| p["name"].as_str()).collect();
                let templated: Vec<&str> = path.split('/').filter_map(|part| part.strip_prefix('{')?.strip_suffix('}')).collect();
                assert_eq!(declared, templated, "{method} {path}'s path parameters");
            }
        }
        let registered: std::collections::BTreeSet<(String, String)> = ROUTES.iter().map(|route| (route.path.to_owned(), route.method.to_owned())).collect();
        assert_eq!(described, registered, "openapi.json against ROUTES");
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(tokens_match("s3cret", "s3cret"));
        assert!(!tokens_match("s3cres", "s3cret"));
        assert!(!tokens_match("s3cre", "s3cret"));
        assert!(!tokens_match("", "s3cret"));
    }
}
