//! Kubernetes' own control plane (v1.34.4: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kubectl, built from their Go modules by `make deps`) on loopback,
//! with the manifests applied the way the docs tell users to: every answer here is
//! Kubernetes', not a simulation's.

use std::path::Path;
use std::time::{Duration, Instant};

use gpushare_k8s_sim::control_plane::ControlPlane;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::ListParams;

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_control_plane_schedules_serves_dra_and_enforces_the_harness_rbac() {
    let dir = tempfile::tempdir().expect("tmp");
    let cp = ControlPlane::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));

    // DRA's API is served at v1, as Kubernetes 1.34 serves it by default.
    let groups = ok(
        &cp.kubectl(&["api-resources", "--api-group=resource.k8s.io", "-o", "name"]),
        "api-resources",
    );
    for r in [
        "resourceclaims",
        "resourceclaimtemplates",
        "resourceslices",
        "deviceclasses",
    ] {
        assert!(groups.contains(&format!("{r}.resource.k8s.io")), "{groups}");
    }

    // The namespaces of the GPU operator and kube-prometheus exist on a real cluster;
    // then the base manifests go on with kubectl, as the docs say.
    for ns in ["gpu-operator", "monitoring"] {
        ok(&cp.kubectl(&["create", "namespace", ns]), "create namespace");
    }
    // kube-prometheus's prometheus-k8s may list pods only in the namespaces its own
    // manifests name (v0.18.0 `prometheus-roleSpecificNamespaces.yaml`): the base's Role
    // is what lets it discover the workload pods.
    // Likewise the DCGM exporter's endpoints in the GPU operator's namespace, where the
    // operator puts its ServiceMonitor.
    let prometheus_may_list = |what: &str, ns: &str| {
        let out = cp.kubectl(&[
            "auth",
            "can-i",
            "list",
            what,
            "-n",
            ns,
            "--as=system:serviceaccount:monitoring:prometheus-k8s",
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let discovery = [("pods", "gpushare-bench"), ("endpoints", "gpu-operator")];
    for (what, ns) in discovery {
        assert_eq!(prometheus_may_list(what, ns), "no", "{what} in {ns}");
    }
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    for f in [
        "base/namespace.yaml",
        "base/rbac.yaml",
        "node/rbac.yaml",
        "workload/deployment.yaml",
    ] {
        ok(
            &cp.kubectl(&["apply", "-f", &manifests.join(f).to_string_lossy()]),
            &format!("kubectl apply -f {f}"),
        );
    }

    for (what, ns) in discovery {
        assert_eq!(prometheus_may_list(what, ns), "yes", "{what} in {ns}");
    }
    // The harness may label the node the manifests were generated for (here the
    // placeholder) and no other, and port-forward to Prometheus's pods and no other.
    let harness_may = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.push("--as=system:serviceaccount:gpushare-bench:gpushare-bench");
        String::from_utf8_lossy(&cp.kubectl(&all).stdout).trim().to_string()
    };
    for (args, want) in [
        (&["patch", "nodes/replace-with-the-gpu-node"][..], "yes"),
        (&["patch", "nodes/gpu-node-2"][..], "no"),
        (
            &[
                "get",
                "pods/prometheus-k8s-0",
                "--subresource=portforward",
                "-n",
                "monitoring",
            ][..],
            "yes",
        ),
        (
            &[
                "create",
                "pods/prometheus-k8s-1",
                "--subresource=portforward",
                "-n",
                "monitoring",
            ][..],
            "yes",
        ),
        (
            &["get", "pods/grafana-0", "--subresource=portforward", "-n", "monitoring"][..],
            "no",
        ),
    ] {
        assert_eq!(harness_may(args), want, "can-i {args:?}");
    }

    // The namespace enforces the restricted Pod Security Standard: the API server refuses
    // the reader's pod, and the Job controller the Job's, unless they pass it.
    // The in-cluster harness Job and the NetworkPolicy that lets it reach Prometheus
    // (kube-prometheus's own admits only its components): the policy's `from` selects the
    // pod the real Job controller makes and the namespace it runs in.
    let job_file = manifests.join("node/harness-job.yaml");
    ok(
        &cp.kubectl(&["apply", "-f", &job_file.to_string_lossy()]),
        "kubectl apply -f node/harness-job.yaml",
    );
    let text = std::fs::read_to_string(&job_file).expect("harness-job.yaml");
    let policy: serde_yaml_ng::Value = text
        .split("\n---")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(d).ok())
        .find(|d| d.get("kind").and_then(|k| k.as_str()) == Some("NetworkPolicy"))
        .expect("a NetworkPolicy beside the Job");
    let from = &policy["spec"]["ingress"][0]["from"][0];
    let selector = |s: &serde_yaml_ng::Value| -> String {
        s["matchLabels"]
            .as_mapping()
            .expect("matchLabels")
            .iter()
            .map(|(k, v)| format!("{}={}", k.as_str().unwrap_or_default(), v.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let namespaces = ok(
        &cp.kubectl(&[
            "get",
            "namespaces",
            "-l",
            &selector(&from["namespaceSelector"]),
            "-o",
            "name",
        ]),
        "namespaces of the policy",
    );
    assert_eq!(namespaces.trim(), "namespace/gpushare-bench");
    let start = Instant::now();
    loop {
        let pods = ok(
            &cp.kubectl(&[
                "get",
                "pods",
                "-n",
                "gpushare-bench",
                "-l",
                &selector(&from["podSelector"]),
                "-o",
                "name",
            ]),
            "the Job's pods",
        );
        if pods.contains("pod/gpushare-bench-") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the policy selects no pod of the Job; controller-manager: {}",
            cp.log_tail("kube-controller-manager")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The Deployment and ReplicaSet controllers make the pods; with no node, the
    // scheduler says they cannot be scheduled.
    let admin = cp.client(&cp.admin_kubeconfig()).await.expect("admin client");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "gpushare-bench");
    let start = Instant::now();
    let unschedulable = loop {
        let list = pods.list(&ListParams::default()).await.expect("list pods");
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter_map(|p| {
                let c = p.status.as_ref()?.conditions.as_ref()?;
                c.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                    .and_then(|c| c.reason.clone())
            })
            .collect();
        if !reasons.is_empty() {
            break reasons;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no pod marked unschedulable; controller-manager: {}\nscheduler: {}",
            cp.log_tail("kube-controller-manager"),
            cp.log_tail("kube-scheduler")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(unschedulable.iter().all(|r| r == "Unschedulable"), "{unschedulable:?}");

    // Every Deployment, ResourceClaim and ResourceClaimTemplate a default sweep would
    // server-side apply, on both sharing paths (from --dry-run), passes the real API
    // server's validation (a server-side dry run: nothing is stored). The harness applies
    // with force: the Deployment's fields belong to kubectl's client-side apply above.
    for api in ["device-plugin", "dra"] {
        let plan = std::process::Command::new(env!("CARGO_BIN_EXE_gpushare-bench"))
            .args([
                "sweep",
                "--backend",
                "kubernetes",
                "--node",
                "gpu-node-1",
                "--sharing-api",
                api,
                "--dry-run",
            ])
            .output()
            .expect("gpushare-bench");
        let text = ok(&plan, "sweep --dry-run");
        let objects: Vec<String> = text
            .split("\n---")
            .filter(|doc| {
                let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).unwrap_or_default();
                matches!(
                    v.get("kind").and_then(|k| k.as_str()),
                    Some("Deployment" | "ResourceClaim" | "ResourceClaimTemplate")
                )
            })
            .map(str::to_string)
            .collect();
        assert!(objects.len() >= 16, "{api}: {} objects in\n{text}", objects.len());
        let file = dir.path().join(format!("{api}.yaml"));
        std::fs::write(&file, objects.join("\n---\n")).expect("write");
        ok(
            &cp.kubectl(&[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--force-conflicts",
                "--field-manager=gpushare-bench",
                "-f",
                &file.to_string_lossy(),
            ]),
            &format!("{api}: the sweep's objects against the API server"),
        );
    }

    // As the harness's service account (manifests/base/rbac.yaml), with a token from the
    // API server: its own namespace may be read, another may not, and no namespace may be
    // deleted. Each 403 is the real RBAC authorizer's.
    let sa = cp
        .service_account_kubeconfig("gpushare-bench", "gpushare-bench")
        .unwrap_or_else(|e| panic!("{e}"));
    let harness = cp.client(&sa).await.expect("service-account client");
    let namespaces: Api<Namespace> = Api::all(harness);
    assert!(
        namespaces.get("gpushare-bench").await.is_ok(),
        "resourceNames grants it"
    );
    for (what, result) in [
        ("get namespace default", namespaces.get("default").await.map(|_| ())),
        (
            "delete namespace gpushare-bench",
            namespaces
                .delete("gpushare-bench", &Default::default())
                .await
                .map(|_| ()),
        ),
    ] {
        match result {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{what}: {s:?}"),
            other => panic!("{what}: want the API server's 403, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_overlay_removes_only_what_the_overlay_made() {
    // The docs' order: the base (namespace, RBAC, Service, PodMonitor's CRD from
    // kube-prometheus), the DRA Role, then the DRA overlay by hand; deleting the overlay
    // (as the harness's message about leftover claims says) must leave the base alone.
    let dir = tempfile::tempdir().expect("tmp");
    let cp = ControlPlane::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    for ns in ["gpu-operator", "monitoring", "dra-driver-nvidia-gpu"] {
        ok(&cp.kubectl(&["create", "namespace", ns]), "create namespace");
    }
    let crd = dir.path().join("podmonitor-crd.json");
    std::fs::write(&crd, gpushare_k8s_sim::node::POD_MONITOR_CRD).expect("write");
    ok(&cp.kubectl(&["apply", "-f", &crd.to_string_lossy()]), "PodMonitor CRD");
    ok(
        &cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/podmonitors.monitoring.coreos.com",
        ]),
        "CRD established",
    );
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    let kustomize = |verb: &str, dir: &str| {
        let path = manifests.join(dir);
        ok(
            &cp.kubectl(&[verb, "-k", &path.to_string_lossy()]),
            &format!("kubectl {verb} -k manifests/{dir}"),
        )
    };
    kustomize("apply", "base");
    kustomize("apply", "dra");
    kustomize("apply", "overlays/dra");
    let deleted = kustomize("delete", "overlays/dra");
    assert!(
        deleted.contains("deployment.apps \"gpushare-workload\" deleted")
            && deleted.contains("resourceclaim.resource.k8s.io \"gpushare-mps-7\" deleted"),
        "{deleted}"
    );
    for (kind, ns, name) in [
        ("namespace", "", "gpushare-bench"),
        ("serviceaccount", "gpushare-bench", "gpushare-bench"),
        ("role", "gpushare-bench", "gpushare-bench-workload"),
        ("role", "dra-driver-nvidia-gpu", "gpushare-bench-dra-driver"),
        ("service", "gpushare-bench", "gpushare-workload"),
    ] {
        let mut args = vec!["get", kind, name];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let out = cp.kubectl(&args);
        assert!(
            out.status.success(),
            "{kind} {ns}/{name} went with the overlay: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The Helm chart's objects, for a release in a namespace of their own, as this API
    // server admits them (its schemas, defaulting and validation, with the PodMonitor CRD
    // installed): a server-side dry run creates nothing.
    let helm = manifests.join("../.deps/bin/helm");
    assert!(helm.is_file(), "{} is missing: run `make deps`", helm.display());
    ok(&cp.kubectl(&["create", "namespace", "bench-chart"]), "create namespace");
    let rendered = std::process::Command::new(&helm)
        .args([
            "template",
            "bench",
            "-n",
            "bench-chart",
            "--set",
            "node=gpu-node-1",
            "--set",
        ])
        .arg("dra.enabled=true,sharingApi=dra,dcgmScrapeRole=false")
        .arg(manifests.join("chart/gpushare-bench"))
        .output()
        .expect("helm template");
    let chart = ok(&rendered, "helm template");
    let file = dir.path().join("chart.yaml");
    std::fs::write(&file, &chart).expect("write");
    let applied = ok(
        &cp.kubectl(&["apply", "--dry-run=server", "-f", &file.to_string_lossy()]),
        "kubectl apply --dry-run=server the chart",
    );
    for object in [
        "serviceaccount/bench-gpushare-bench",
        "persistentvolumeclaim/bench-gpushare-bench-results",
        "job.batch/bench-gpushare-bench",
        "pod/bench-gpushare-bench-results",
        "role.rbac.authorization.k8s.io/bench-gpushare-bench-dra-driver",
        "podmonitor.monitoring.coreos.com/",
        "networkpolicy.networking.k8s.io/",
    ] {
        assert!(applied.contains(object), "{object} not admitted: {applied}");
    }
}
