//! A simulated Kubernetes cluster with one GPU node under the NVIDIA GPU operator, for
//! testing the Kubernetes backend against the real components' rules rather than
//! against what the backend expects.
//!
//! It is an in-process API server on a loopback port that kube-rs talks to over HTTP,
//! enforcing RBAC (from the harness's own `manifests/base/rbac.yaml`), server-side
//! apply field ownership and create-vs-patch authorisation, and playing the operator's
//! components by their upstream rules (device-plugin config validation, config-manager
//! delays and crash loops, plugin restarts, the GFD labels and allocatable they publish,
//! the MPS control-daemon pod, mig-parted's state machine, pods Pending while the plugin
//! restarts, Failed pods). Time is virtual and runs `speed` times faster than the wall
//! clock, so minutes of operator behaviour take a fraction of a second.
//!
//! **This is a test double.** Each rule cites the upstream file and version it
//! reproduces (UPSTREAM-RULES.md); nothing here was observed on a real cluster.
//!
//! [`control_plane`] is the other way to test: Kubernetes' own API server, controllers
//! and scheduler (v1.34, built from their Go modules) on loopback.

pub mod api;
pub mod cluster;
pub mod control_plane;
pub mod dra;
pub mod fields;
pub mod gpu;
pub mod key;
pub mod kubelet;
pub mod node;
pub mod rbac;
pub mod world;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

use self::api::ApiRequest;
use self::rbac::Authorizer;
pub use self::world::{ClusterSpec, PodFacts, Timings, World};

/// Who a bearer token is.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// User name (`system:serviceaccount:ns:name`).
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
}

struct Shared {
    world: World,
    /// Virtual seconds added to the clock (a test that lets time pass jumps it ahead).
    skipped: f64,
    authz: Authorizer,
    tokens: BTreeMap<String, Identity>,
    /// Requests served, for tests: (method, path, status).
    requests: Vec<(String, String, u16)>,
}

/// A running simulated cluster.
pub struct SimCluster {
    shared: Arc<Mutex<Shared>>,
    addr: SocketAddr,
    clock: Clock,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimCluster({})", self.addr)
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    base: f64,
    speed: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        self.base + self.start.elapsed().as_secs_f64() * self.speed
    }
}

/// The token the harness's client carries.
pub const HARNESS_TOKEN: &str = "harness";

impl SimCluster {
    /// Starts the cluster: the world from `spec` (operands settled), RBAC from `rbac`
    /// objects (the harness is ServiceAccount `gpushare-bench/gpushare-bench`, token
    /// [`HARNESS_TOKEN`]), virtual time `speed` × wall time.
    pub async fn start(spec: ClusterSpec, rbac: &[Value], speed: f64) -> std::io::Result<Self> {
        let mut world = World::new(spec);
        world.add_rbac(rbac);
        let base = world.now;
        let mut tokens = BTreeMap::new();
        tokens.insert(
            HARNESS_TOKEN.to_string(),
            Identity {
                user: rbac::service_account_user("gpushare-bench", "gpushare-bench"),
                groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
            },
        );
        let shared = Arc::new(Mutex::new(Shared {
            world,
            skipped: 0.0,
            authz: Authorizer::from_objects(rbac),
            tokens,
            requests: Vec::new(),
        }));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let clock = Clock {
            start: Instant::now(),
            base,
            speed,
        };
        let task = tokio::spawn(serve(listener, shared.clone(), clock));
        Ok(Self {
            shared,
            addr,
            clock,
            task,
        })
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client authenticated as the harness.
    pub fn client(&self) -> kube::Client {
        self.client_as(HARNESS_TOKEN)
    }

    /// A kube client with a bearer token.
    pub fn client_as(&self, token: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().unwrap_or_default());
        config.default_namespace = "default".into();
        config.auth_info.token = Some(token.to_string().into());
        // Construction only fails for TLS settings, which a plain-HTTP config has none of.
        kube::Client::try_from(config).unwrap_or_else(|e| panic!("kube client for the simulator: {e}"))
    }

    /// Adds a token for another identity (a user with other RBAC, Prometheus' SA).
    pub fn add_identity(&self, token: &str, identity: Identity) {
        self.lock().tokens.insert(token.into(), identity);
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the world, advanced to now (test setup and assertions). Virtual time
    /// `f` lets pass (`World::settle`) moves the clock ahead for everyone.
    pub fn with<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        let mut s = self.lock();
        let now = self.clock.now() + s.skipped;
        s.world.advance(now);
        let out = f(&mut s.world);
        let ahead = s.world.now - now;
        if ahead > 0.0 {
            s.skipped += ahead;
        }
        out
    }

    /// Requests served so far: (method, path, status).
    pub fn requests(&self) -> Vec<(String, String, u16)> {
        self.lock().requests.clone()
    }

    /// The world's event log (virtual times), for failing tests' messages.
    pub fn log(&self) -> String {
        self.lock().world.log.join("\n")
    }
}

async fn serve(listener: TcpListener, shared: Arc<Mutex<Shared>>, clock: Clock) {
    while let Ok((stream, _)) = listener.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let shared = shared.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    let header = |h: &str| {
                        parts
                            .headers
                            .get(h)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    let query: BTreeMap<String, String> = parts
                        .uri
                        .query()
                        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                        .unwrap_or_default();
                    let request = ApiRequest {
                        method: parts.method.to_string(),
                        path: parts.uri.path().to_string(),
                        query,
                        content_type: header("content-type"),
                        user_agent: header("user-agent"),
                        body: body.to_vec(),
                        upgrade: header("upgrade").eq_ignore_ascii_case("websocket"),
                    };
                    let token = header("authorization").trim_start_matches("Bearer ").to_string();
                    let response = {
                        let mut s = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        let now = clock.now() + s.skipped;
                        s.world.advance(now);
                        let response = match s.tokens.get(&token).cloned() {
                            None => api::ApiResponse {
                                code: 401,
                                body: serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
                            },
                            Some(id) => {
                                let groups: Vec<&str> = id.groups.iter().map(String::as_str).collect();
                                let Shared { world, authz, .. } = &mut *s;
                                api::handle(world, authz, &id.user, &groups, &request)
                            }
                        };
                        s.requests
                            .push((request.method.clone(), request.path.clone(), response.code));
                        response
                    };
                    let body = serde_json::to_vec(&response.body).unwrap_or_default();
                    let mut out = hyper::Response::new(Full::new(Bytes::from(body)));
                    *out.status_mut() =
                        hyper::StatusCode::from_u16(response.code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
                    out.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, std::convert::Infallible>(out)
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
