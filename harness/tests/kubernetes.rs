//! Pod states read from Pod objects as the API server returns them. The backend's
//! requests are tested against the simulated cluster (`backend::k8s::sim`, with its
//! sweep-level tests in `backend/k8s/sim_tests.rs`), which enforces the API server's and
//! the GPU operator's rules instead of replaying a request script.

use gpushare_bench::backend::PodState;
use serde_json::json;

#[test]
fn pod_states_from_real_pod_objects() {
    use gpushare_bench::backend::k8s::base::pod_state;
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
    // Rejected at admission by the device plugin's Allocate (kubelet `rejectPod`,
    // UPSTREAM-RULES.md H13): Failed, never retried.
    let rejected: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "w-3" },
        "status": { "phase": "Failed", "reason": "UnexpectedAdmissionError",
                    "message": "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu, which is unexpected" }
    }))
    .expect("pod");
    assert!(
        matches!(pod_state(&rejected), PodState::Exited { code: None, detail } if detail.starts_with("UnexpectedAdmissionError: Pod was rejected"))
    );
}
