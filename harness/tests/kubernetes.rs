//! The Kubernetes backend against a mock API server that checks every request in order
//! (the kube-rs tower-test pattern): method, path, query and body, answering canned
//! objects. Every scenario runs under a timeout, so a missing call fails, not hangs.

use std::time::Duration;

use gpushare_bench::backend::k8s::backend::{KubeSettings, KubernetesBackend};
use gpushare_bench::backend::k8s::objects::{PluginConfigMap, WorkloadSpec};
use gpushare_bench::backend::{Backend, PodState, Prepared};
use gpushare_bench::domain::Strategy;
use gpushare_bench::shutdown::Shutdown;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn settings() -> KubeSettings {
    KubeSettings {
        node: "gpu-1".into(),
        workload: WorkloadSpec {
            namespace: "gpushare-bench".into(),
            image: "gpushare-workload:test".into(),
            node: "gpu-1".into(),
            args: vec!["--model".into(), "yolos-small".into()],
        },
        plugin: PluginConfigMap::default(),
        mig_layout: None,
        pods: vec![1, 3],
        switch_timeout: Duration::from_secs(5),
        poll: Duration::from_millis(5),
    }
}

fn backend(s: KubeSettings) -> (KubernetesBackend, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    (KubernetesBackend::new(client, s), handle)
}

fn node(labels: &[(&str, &str)], gpus: u32) -> Value {
    let mut l = serde_json::Map::new();
    l.insert("nvidia.com/gpu.count".into(), "1".into());
    l.insert("nvidia.com/gpu.product".into(), "NVIDIA-H100-80GB-HBM3".into());
    for (k, v) in labels {
        l.insert((*k).into(), (*v).into());
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": "gpu-1", "labels": l },
        "status": { "allocatable": { "nvidia.com/gpu": gpus.to_string(), "cpu": "16" } }
    })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message })
}

/// One expected request: method, path, a query fragment, a check of the body; and the answer.
struct Step {
    method: &'static str,
    path: String,
    query: &'static str,
    body: Box<dyn Fn(&Value) + Send>,
    code: u16,
    answer: Value,
}

fn step(method: &'static str, path: &str, query: &'static str, code: u16, answer: Value) -> Step {
    Step {
        method,
        path: path.into(),
        query,
        body: Box::new(|_| {}),
        code,
        answer,
    }
}

impl Step {
    fn body(mut self, f: impl Fn(&Value) + Send + 'static) -> Self {
        self.body = Box::new(f);
        self
    }
}

/// Plays the scenario: every request must be the next step. Returns the handle for
/// scenarios that go on answering.
async fn verify(mut handle: Handle, steps: Vec<Step>) -> Handle {
    for (i, s) in steps.into_iter().enumerate() {
        let (req, send) = handle
            .next_request()
            .await
            .unwrap_or_else(|| panic!("step {i}: no request, expected {} {}", s.method, s.path));
        assert_eq!(req.method().as_str(), s.method, "step {i}: {}", req.uri());
        assert_eq!(req.uri().path(), s.path, "step {i}");
        let query = req.uri().query().unwrap_or("").to_string();
        assert!(query.contains(s.query), "step {i}: query {query:?} lacks {:?}", s.query);
        let bytes = req.into_body().collect_bytes().await.expect("body");
        if !bytes.is_empty() {
            let v: Value = serde_json::from_slice(&bytes).expect("JSON body");
            (s.body)(&v);
        }
        let resp = Response::builder()
            .status(StatusCode::from_u16(s.code).expect("code"))
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&s.answer).expect("json")))
            .expect("response");
        send.send_response(resp);
    }
    handle
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("the scenario timed out: a request was missing or extra")
}

fn ns_answer() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpushare-bench"}})
}

fn cm_answer() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "device-plugin-config"}})
}

fn dep_answer() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpushare-workload"}})
}

/// Every prepare starts by reading the node and applying the namespace.
fn opening(node_answer: Value) -> Vec<Step> {
    vec![
        step("GET", NODE, "", 200, node_answer),
        step("PATCH", NS, "fieldManager=gpushare-bench", 200, ns_answer()),
    ]
}

const NODE: &str = "/api/v1/nodes/gpu-1";
const NS: &str = "/api/v1/namespaces/gpushare-bench";
const CM: &str = "/api/v1/namespaces/gpu-operator/configmaps/device-plugin-config";
const DEP: &str = "/apis/apps/v1/namespaces/gpushare-bench/deployments/gpushare-workload";
const PODS: &str = "/api/v1/namespaces/gpushare-bench/pods";

fn label_body(key: &'static str, want: Value) -> impl Fn(&Value) + Send + 'static {
    move |v| assert_eq!(v["metadata"]["labels"][key], want, "{v}")
}

fn pod(name: &str, ready: bool, pending: bool) -> Value {
    let mut status =
        json!({ "podIP": format!("10.0.0.{}", name.len()), "phase": if pending { "Pending" } else { "Running" } });
    status["conditions"] = if pending {
        json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." }])
    } else {
        json!([{ "type": "PodScheduled", "status": "True" }, { "type": "Ready", "status": if ready { "True" } else { "False" } }])
    };
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "namespace": "gpushare-bench" }, "status": status })
}

fn pod_list(items: Vec<Value>) -> Value {
    json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items })
}

fn switch_steps(strategy: &'static str, entry: &'static str, replicas: u32) -> Vec<Step> {
    vec![
        step("PATCH", CM, "fieldManager=gpushare-bench", 200, cm_answer()).body(move |v| {
            let cfg = v["data"][entry].as_str().expect("our entry");
            assert!(cfg.starts_with("version: v1"), "{v}");
            if strategy != "none" {
                assert!(cfg.contains(&format!("replicas: {replicas}")), "{v}");
            }
        }),
        step("PATCH", NODE, "", 200, node(&[], 1)).body(label_body("nvidia.com/device-plugin.config", json!(entry))),
        // Not switched yet, then switched.
        step(
            "GET",
            NODE,
            "",
            200,
            node(&[("nvidia.com/device-plugin.config", entry)], 1),
        ),
        step(
            "GET",
            NODE,
            "",
            200,
            node(
                &[
                    ("nvidia.com/gpu.sharing-strategy", strategy),
                    ("nvidia.com/gpu.replicas", &replicas.to_string()),
                ],
                replicas,
            ),
        ),
    ]
}

#[tokio::test]
async fn time_slicing_switch_scale_readiness_stop_and_restore() {
    let (mut b, handle) = backend(settings());
    let mut steps = opening(node(&[("nvidia.com/device-plugin.config", "site-default")], 1));
    steps.extend(switch_steps("time-slicing", "gpushare-time-slicing-3", 3));
    steps.extend([
        step("PATCH", DEP, "fieldManager=gpushare-bench", 200, dep_answer()).body(|v| {
            assert_eq!(v["spec"]["replicas"], 3);
            assert_eq!(
                v["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"],
                "gpu-1"
            );
            assert_eq!(
                v["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
                1
            );
        }),
        step(
            "GET",
            PODS,
            "labelSelector=gpushare.dev%2Fcell%3Dtime-slicing-3",
            200,
            pod_list(vec![pod("w-a", false, false)]),
        ),
        // Readiness: two ready, one unschedulable (an outcome, not a hang).
        step(
            "GET",
            PODS,
            "",
            200,
            pod_list(vec![
                pod("w-a", true, false),
                pod("w-b", true, false),
                pod("w-c", false, true),
            ]),
        ),
        // stop_pods: last states, delete, wait until gone.
        step(
            "GET",
            PODS,
            "",
            200,
            pod_list(vec![
                pod("w-a", true, false),
                pod("w-b", true, false),
                pod("w-c", false, true),
            ]),
        ),
        step("DELETE", DEP, "", 200, dep_answer()),
        step(
            "GET",
            PODS,
            "labelSelector=app.kubernetes.io%2Fname%3Dgpushare-workload",
            200,
            pod_list(vec![]),
        ),
        // restore: nothing left to delete; the label as it was; our entry removed.
        step(
            "DELETE",
            DEP,
            "",
            404,
            status(404, "NotFound", "deployments.apps \"gpushare-workload\" not found"),
        ),
        step("GET", PODS, "", 200, pod_list(vec![])),
        step("PATCH", NODE, "", 200, node(&[], 1))
            .body(label_body("nvidia.com/device-plugin.config", json!("site-default"))),
        step("PATCH", CM, "", 200, cm_answer())
            .body(|v| assert_eq!(v, &json!({"data": {"gpushare-time-slicing-3": null}}))),
    ]);
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        assert_eq!(
            b.prepare(Strategy::TimeSlicing, &Shutdown::new())
                .await
                .expect("prepare"),
            Prepared::Ready
        );
        b.launch(Strategy::TimeSlicing, 3, &Shutdown::new())
            .await
            .expect("launch");
        let pods = b
            .wait_ready(Duration::from_secs(5), &Shutdown::new())
            .await
            .expect("ready");
        assert_eq!(pods.iter().filter(|p| p.state == PodState::Running).count(), 2);
        assert!(matches!(&pods[2].state, PodState::Pending(r) if r.contains("Insufficient nvidia.com/gpu")));
        assert_eq!(pods[0].metrics_url.as_deref(), Some("http://10.0.0.3:9400/metrics"));
        b.stop_pods(&Shutdown::new()).await.expect("stop");
        b.restore(&Shutdown::new()).await.expect("restore");
        server.await.expect("verifier");
    })
    .await;
}

#[tokio::test]
async fn mps_is_configured_per_cell_with_its_replicas() {
    let (mut b, handle) = backend(settings());
    let mut steps = opening(node(&[], 1));
    steps.extend(switch_steps("mps", "gpushare-mps-5", 5));
    steps.extend([
        step("PATCH", DEP, "", 200, dep_answer()).body(|v| assert_eq!(v["spec"]["replicas"], 5)),
        step("GET", PODS, "", 200, pod_list(vec![])),
    ]);
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        assert_eq!(
            b.prepare(Strategy::Mps, &Shutdown::new()).await.expect("prepare"),
            Prepared::Ready
        );
        b.launch(Strategy::Mps, 5, &Shutdown::new()).await.expect("launch");
        server.await.expect("verifier");
    })
    .await;
}

fn mig_prefix() -> Vec<Step> {
    let mut steps = opening(node(
        &[
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig.config", "all-disabled"),
        ],
        1,
    ));
    steps.extend(switch_steps("none", "gpushare-exclusive", 1));
    steps.push(
        step("PATCH", NODE, "", 200, node(&[], 1)).body(label_body("nvidia.com/mig.config", json!("all-1g.10gb"))),
    );
    steps
}

fn mig_node(state: &str) -> Value {
    node(
        &[
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig.config", "all-1g.10gb"),
            ("nvidia.com/mig.config.state", state),
        ],
        7,
    )
}

#[tokio::test]
async fn mig_waits_for_the_mig_manager_to_succeed() {
    let (mut b, handle) = backend(settings());
    let mut steps = mig_prefix();
    steps.extend([
        step("GET", NODE, "", 200, mig_node("pending")),
        step("GET", NODE, "", 200, mig_node("success")),
    ]);
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        assert_eq!(
            b.prepare(Strategy::Mig, &Shutdown::new()).await.expect("prepare"),
            Prepared::Ready
        );
        server.await.expect("verifier");
    })
    .await;
}

#[tokio::test]
async fn mig_failure_is_reported_clearly() {
    let (mut b, handle) = backend(settings());
    let mut steps = mig_prefix();
    steps.push(step("GET", NODE, "", 200, mig_node("failed")));
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        let err = b
            .prepare(Strategy::Mig, &Shutdown::new())
            .await
            .expect_err("failed state")
            .to_string();
        assert!(
            err.contains("MIG reconfiguration of node gpu-1 to all-1g.10gb failed"),
            "{err}"
        );
        server.await.expect("verifier");
    })
    .await;
}

#[tokio::test]
async fn mig_that_never_settles_times_out_with_the_labels_it_saw() {
    let mut s = settings();
    s.switch_timeout = Duration::from_millis(100);
    s.poll = Duration::from_millis(20);
    let (mut b, handle) = backend(s);
    let server = tokio::spawn(async move {
        let mut handle = verify(handle, mig_prefix()).await;
        // Answer "pending" until the backend gives up.
        while let Ok(Some((req, send))) = tokio::time::timeout(Duration::from_secs(2), handle.next_request()).await {
            assert_eq!(req.uri().path(), NODE);
            send.send_response(
                Response::builder()
                    .status(200)
                    .body(Body::from(serde_json::to_vec(&mig_node("pending")).expect("json")))
                    .expect("resp"),
            );
        }
    });
    within(async {
        let err = b
            .prepare(Strategy::Mig, &Shutdown::new())
            .await
            .expect_err("timeout")
            .to_string();
        assert!(
            err.contains("did not apply MIG layout all-1g.10gb within 0 s")
                && err.contains("nvidia.com/mig.config.state=pending"),
            "{err}"
        );
    })
    .await;
    drop(b);
    within(server).await.expect("verifier");
}

#[tokio::test]
async fn node_not_found_is_one_clear_error() {
    let (mut b, handle) = backend(settings());
    let server = tokio::spawn(verify(
        handle,
        vec![step(
            "GET",
            NODE,
            "",
            404,
            status(404, "NotFound", "nodes \"gpu-1\" not found"),
        )],
    ));
    within(async {
        let err = b
            .prepare(Strategy::Exclusive, &Shutdown::new())
            .await
            .expect_err("no node")
            .to_string();
        assert_eq!(
            err,
            "Kubernetes: reading node gpu-1: not found: nodes \"gpu-1\" not found"
        );
        server.await.expect("verifier");
    })
    .await;
}

#[tokio::test]
async fn rbac_forbidden_names_the_permission_and_restore_still_runs() {
    let (mut b, handle) = backend(settings());
    let mut steps = opening(node(&[], 1));
    steps.extend([
        step(
            "PATCH",
            CM,
            "",
            403,
            status(
                403,
                "Forbidden",
                "configmaps \"device-plugin-config\" is forbidden: User \"ci\" cannot patch resource \"configmaps\" in the namespace \"gpu-operator\"",
            ),
        ),
        // The failure aborts the switch; restore deletes nothing and leaves the node alone
        // (nothing was changed yet).
        step("DELETE", DEP, "", 404, status(404, "NotFound", "not found")),
        step("GET", PODS, "", 200, pod_list(vec![])),
    ]);
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        let err = b
            .prepare(Strategy::Exclusive, &Shutdown::new())
            .await
            .expect_err("forbidden")
            .to_string();
        assert!(
            err.contains("forbidden") && err.contains("RBAC") && err.contains("gpu-operator"),
            "{err}"
        );
        b.restore(&Shutdown::new()).await.expect("restore");
        server.await.expect("verifier");
    })
    .await;
}

#[tokio::test]
async fn restore_after_a_failed_cell_puts_back_labels_and_entries() {
    let (mut b, handle) = backend(settings());
    let mut steps = opening(node(&[], 1));
    steps.extend(switch_steps("none", "gpushare-exclusive", 1));
    steps.extend([
        step("PATCH", DEP, "", 500, status(500, "InternalError", "etcd timeout")),
        step("DELETE", DEP, "", 404, status(404, "NotFound", "not found")),
        step("GET", PODS, "", 200, pod_list(vec![])),
        // The label did not exist before: it is removed.
        step("PATCH", NODE, "", 200, node(&[], 1)).body(label_body("nvidia.com/device-plugin.config", Value::Null)),
        step("PATCH", CM, "", 200, cm_answer()).body(|v| assert_eq!(v, &json!({"data": {"gpushare-exclusive": null}}))),
    ]);
    let server = tokio::spawn(verify(handle, steps));
    within(async {
        assert_eq!(
            b.prepare(Strategy::Exclusive, &Shutdown::new()).await.expect("prepare"),
            Prepared::Ready
        );
        let err = b
            .launch(Strategy::Exclusive, 1, &Shutdown::new())
            .await
            .expect_err("apply fails")
            .to_string();
        assert!(err.contains("etcd timeout"), "{err}");
        b.restore(&Shutdown::new()).await.expect("restore");
        server.await.expect("verifier");
    })
    .await;
}

#[test]
fn pod_states_from_real_pod_objects() {
    use gpushare_bench::backend::k8s::backend::pod_state;
    let crash: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "w-1" },
        "status": {
            "conditions": [{ "type": "PodScheduled", "status": "True" }, { "type": "Ready", "status": "False" }],
            "containerStatuses": [{
                "name": "workload", "image": "x", "imageID": "", "ready": false, "restartCount": 3,
                "state": { "waiting": { "reason": "CrashLoopBackOff" } },
                "lastState": { "terminated": { "exitCode": 4, "reason": "Error", "message": "gpushare-workload: out of GPU memory" } }
            }]
        }
    }))
    .expect("pod");
    match pod_state(&crash) {
        PodState::Exited { code: Some(4), detail } => assert!(
            detail.contains("CrashLoopBackOff") && detail.contains("3 restarts"),
            "{detail}"
        ),
        other => panic!("{other:?}"),
    }
    let killed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "w-2" },
        "status": { "containerStatuses": [{ "name": "workload", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": 137, "reason": "OOMKilled" } } }] }
    }))
    .expect("pod");
    assert!(
        matches!(pod_state(&killed), PodState::Exited { code: Some(137), detail } if detail.starts_with("OOMKilled"))
    );
}
