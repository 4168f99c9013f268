//! The Helm chart (manifests/chart/gpushare-bench) against the harness it installs: its
//! RBAC is objects.rs `rbac` and `dra_rbac` rule for rule, its Service, PodMonitor and
//! NetworkPolicy are the harness's, its Job's command line is one the harness accepts and
//! plans as the values say, the results live on a claim, and every pod runs as the image's
//! non-root user. Renders with the Helm that `make deps` builds into .deps/bin.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use gpushare_bench::backend::k8s::dra::DRIVER_NAMESPACE;
use gpushare_bench::backend::k8s::manifests::{DEFAULT_IMAGE, MONITORING};
use gpushare_bench::backend::k8s::objects::{self, PluginConfigMap};
use gpushare_bench::config::cli::{Cli, Command};
use gpushare_bench::config::plan::SweepPlan;
use gpushare_bench::config::values::{PrometheusSetting, SharingApi};
use serde::Deserialize;
use serde_json::Value;

const RELEASE: &str = "gpushare-bench";
const NS: &str = "gpushare-bench";
const NODE: &str = "gpu-node-1";
const PROMETHEUS: &str = "http://prometheus-k8s.monitoring.svc:9090";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("manifests/chart/gpushare-bench")
}

/// .deps/bin/helm, or a panic that says how to get it: this test does not skip.
fn helm() -> PathBuf {
    let helm = repo().join(".deps/bin/helm");
    if !helm.is_file() {
        panic!(
            "\n\n*** {} is missing: run `make deps` (it builds Helm from harness/k8s-sim/helm). \
             The chart test does not skip without it. ***\n\n",
            helm.display()
        );
    }
    helm
}

/// `helm template RELEASE chart -n NAMESPACE ARGS…`: its stdout, or its stderr as the error.
fn helm_template(release: &str, ns: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(helm())
        .arg("template")
        .arg(release)
        .arg(chart())
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running helm: {e}"));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm's output is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The rendered objects (empty documents dropped).
fn render_as(release: &str, ns: &str, args: &[&str]) -> Vec<Value> {
    let text = helm_template(release, ns, args).unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("helm template {args:?}: bad YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The release `gpushare-bench` in namespace `gpushare-bench` for node `gpu-node-1`, plus `args`.
fn render(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--set", "node=gpu-node-1"];
    all.extend_from_slice(args);
    render_as(RELEASE, NS, &all)
}

fn kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], k: &str) -> &'a Value {
    match kind(objs, k).as_slice() {
        [o] => o,
        other => panic!("expected one {k}, rendered {}", other.len()),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list, got {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("expected a string, got {s}"))
                .to_string()
        })
        .collect()
}

/// A rule with each list as a set: the order of verbs or resources means nothing.
type Rule = BTreeMap<String, BTreeSet<String>>;

fn rule(r: &Value) -> Rule {
    r.as_object()
        .unwrap_or_else(|| panic!("a rule is an object: {r}"))
        .iter()
        .map(|(k, v)| (k.clone(), strings(v).into_iter().collect()))
        .collect()
}

/// (kind, namespace, name) of an object.
fn object_key(o: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&o["kind"]),
        text(&o["metadata"]["namespace"]),
        text(&o["metadata"]["name"]),
    )
}

/// (kind, namespace, name) of a Role or ClusterRole → its rules as a set.
type Roles = BTreeMap<(String, String, String), BTreeSet<Rule>>;

fn roles<'a>(objs: impl IntoIterator<Item = &'a Value>) -> Roles {
    objs.into_iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
        .map(|o| {
            let key = object_key(o);
            let rules = o["rules"].as_array().expect("rules").iter().map(rule).collect();
            (key, rules)
        })
        .collect()
}

/// (kind, namespace, name) of a binding → (its roleRef, its subjects).
type Bindings = BTreeMap<(String, String, String), (Value, BTreeSet<String>)>;

fn bindings<'a>(objs: impl IntoIterator<Item = &'a Value>) -> Bindings {
    objs.into_iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
        .map(|o| {
            let key = object_key(o);
            let subjects = o["subjects"]
                .as_array()
                .expect("subjects")
                .iter()
                .map(|s| format!("{}/{}/{}", s["kind"], s["namespace"], s["name"]))
                .collect();
            (key, (o["roleRef"].clone(), subjects))
        })
        .collect()
}

#[test]
fn the_rbac_is_the_harnesss_rule_for_rule() {
    let objs = render(&[]);
    let want = objects::rbac(NS, &PluginConfigMap::default(), MONITORING, NODE);
    assert_eq!(
        roles(&objs),
        roles(&want),
        "Roles and ClusterRoles: chart (left) vs objects::rbac (right)"
    );
    assert_eq!(
        bindings(&objs),
        bindings(&want),
        "RoleBindings and ClusterRoleBindings: chart (left) vs objects::rbac (right)"
    );
    let sa = one(&objs, "ServiceAccount");
    assert_eq!(sa["metadata"]["name"], "gpushare-bench");
    assert_eq!(sa["metadata"]["namespace"], NS);
    assert!(
        kind(&objs, "Role")
            .iter()
            .all(|r| r["metadata"]["namespace"] != DRIVER_NAMESPACE)
    );

    let dra = render(&["--set", "dra.enabled=true,sharingApi=dra"]);
    let in_driver_ns = |o: &&Value| o["metadata"]["namespace"] == DRIVER_NAMESPACE;
    let want = objects::dra_rbac(NS, DRIVER_NAMESPACE);
    assert_eq!(
        roles(dra.iter().filter(in_driver_ns)),
        roles(&want),
        "dra.enabled: objects::dra_rbac"
    );
    assert_eq!(
        bindings(dra.iter().filter(in_driver_ns)),
        bindings(&want),
        "dra.enabled: objects::dra_rbac"
    );
}

/// Another release, namespace, node and set of namespaces: the values reach the places
/// of `rbac`'s arguments (the names then carry the release's, but for the two Roles
/// whose names kube-prometheus and doctor look for).
#[test]
fn the_rbac_follows_the_values() {
    let cm = PluginConfigMap {
        namespace: "nvidia-gpu-operator".into(),
        name: "plugin-config".into(),
        default_key: String::new(),
    };
    let objs = render_as(
        "bench",
        "team-a",
        &[
            "--set",
            "node=gpu-7.example,operatorNamespace=nvidia-gpu-operator,devicePlugin.configMap=plugin-config,monitoringNamespace=mon",
        ],
    );
    let anonymous = |r: Roles| -> BTreeSet<(String, String, BTreeSet<Rule>)> {
        r.into_iter().map(|((k, ns, _), rules)| (k, ns, rules)).collect()
    };
    let want = objects::rbac("team-a", &cm, "mon", "gpu-7.example");
    assert_eq!(anonymous(roles(&objs)), anonymous(roles(&want)));
    let names: BTreeSet<_> = roles(&objs).into_keys().map(|(_, _, n)| n).collect();
    assert!(
        names.contains("prometheus-k8s") && names.contains(objects::DCGM_SCRAPE_ROLE),
        "{names:?}"
    );
    for (_, subjects) in bindings(&objs).into_values() {
        for s in subjects {
            assert!(
                s == "\"ServiceAccount\"/\"team-a\"/\"bench-gpushare-bench\""
                    || s == "\"ServiceAccount\"/\"mon\"/\"prometheus-k8s\"",
                "{s}"
            );
        }
    }
}

#[test]
fn service_podmonitor_and_networkpolicy_are_the_harnesss() {
    let objs = render(&[]);
    for (k, want) in [
        ("Service", objects::service(NS)),
        ("PodMonitor", objects::pod_monitor(NS)),
        ("NetworkPolicy", objects::prometheus_ingress_policy(NS, MONITORING)),
    ] {
        let got = one(&objs, k);
        assert_eq!(got["spec"], want["spec"], "{k}: chart (left) vs objects.rs (right)");
        assert_eq!(got["metadata"]["namespace"], want["metadata"]["namespace"], "{k}");
    }
}

/// The Job's container and pod.
fn job(objs: &[Value]) -> (&Value, &Value) {
    let pod = &one(objs, "Job")["spec"]["template"]["spec"];
    let c = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "gpushare-bench"))
        .expect("the Job's container gpushare-bench");
    (pod, c)
}

/// The Job's command line through the harness's own parser and planner.
fn job_plan(objs: &[Value]) -> (&'static str, SweepPlan) {
    let (_, c) = job(objs);
    assert_eq!(c["command"], serde_json::json!(["gpushare-bench"]));
    let argv = std::iter::once("gpushare-bench".to_string()).chain(strings(&c["args"]));
    let cli =
        Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("the harness refuses the Job's args {}: {e}", c["args"]));
    let planned = match cli.command {
        Command::Sweep(a) => {
            assert!(a.quiet);
            ("sweep", SweepPlan::from_options(a.options))
        }
        Command::Isolation(a) => ("isolation", gpushare_bench::isolation::command::plan(*a)),
        Command::Capacity(a) => ("capacity", gpushare_bench::capacity::command::plan(*a)),
        other => panic!("the Job runs {other:?}"),
    };
    let plan = planned
        .1
        .unwrap_or_else(|e| panic!("the harness cannot plan the Job's args {}: {e}", c["args"]));
    (planned.0, plan)
}

#[test]
fn the_jobs_command_line_is_one_the_harness_plans() {
    for (values, command, api) in [
        (vec![], "sweep", SharingApi::DevicePlugin),
        (
            vec!["--set", "dra.enabled=true,sharingApi=dra"],
            "sweep",
            SharingApi::Dra,
        ),
        (
            vec!["--set", "run.command=isolation"],
            "isolation",
            SharingApi::DevicePlugin,
        ),
        (
            vec![
                "--set",
                "run.command=capacity",
                "--set-json",
                r#"run.args=["--load","poisson:20","--slo","p99=25ms","--strategies","exclusive,mps"]"#,
            ],
            "capacity",
            SharingApi::DevicePlugin,
        ),
    ] {
        let (got, plan) = job_plan(&render(&values));
        assert_eq!(got, command, "{values:?}");
        let k = plan
            .kubernetes()
            .unwrap_or_else(|| panic!("{values:?}: not the kubernetes backend"));
        assert_eq!(k.node, NODE);
        assert_eq!(k.namespace, NS);
        assert_eq!(k.image, DEFAULT_IMAGE, "the chart's default image is the harness's");
        assert_eq!(k.operator_namespace, PluginConfigMap::default().namespace);
        assert_eq!(k.sharing.api(), api, "{values:?}");
        assert_eq!(plan.out, Path::new("/results"));
        assert_eq!(plan.prometheus, PrometheusSetting::Url(PROMETHEUS.into()));
    }
    // The workload pods get the chart's image and pull secrets.
    let objs = render(&[
        "--set",
        "image.registry=ghcr.io/acme,image.tag=9.9.9,operatorNamespace=nvidia-gpu-operator",
        "--set-json",
        r#"imagePullSecrets=[{"name":"regcred"}]"#,
    ]);
    let (_, plan) = job_plan(&objs);
    let k = plan.kubernetes().expect("kubernetes");
    assert_eq!(k.image, "ghcr.io/acme/gpushare-workload:9.9.9");
    assert_eq!(job(&objs).1["image"], "ghcr.io/acme/gpushare-workload:9.9.9");
    assert_eq!(k.image_pull_secrets, ["regcred"]);
    assert_eq!(k.operator_namespace, "nvidia-gpu-operator");
}

#[test]
fn the_chart_version_is_the_harnesss() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_yaml_ng::from_str(&text).expect("Chart.yaml is YAML");
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"), "Chart.yaml appVersion");
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"), "Chart.yaml version");
}

/// The claim the volume named `name` of a pod mounts (and that it is one).
fn claim_of<'a>(pod: &'a Value, name: &str) -> &'a str {
    let v = pod["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no volume {name}"));
    assert!(v.get("emptyDir").is_none(), "{v}");
    v["persistentVolumeClaim"]["claimName"]
        .as_str()
        .unwrap_or_else(|| panic!("volume {name} is not a PersistentVolumeClaim: {v}"))
}

fn mount_at<'a>(c: &'a Value, path: &str) -> &'a Value {
    c["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["mountPath"] == path))
        .unwrap_or_else(|| panic!("nothing mounted at {path}"))
}

#[test]
fn the_results_are_on_a_claim_the_reader_mounts_read_only() {
    let objs = render(&[]);
    let (pod, c) = job(&objs);
    let m = mount_at(c, "/results");
    let claim = claim_of(pod, m["name"].as_str().expect("name"));
    let pvc = one(&objs, "PersistentVolumeClaim");
    assert_eq!(pvc["metadata"]["name"], claim);
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .all(|v| v.get("emptyDir").is_none()),
        "no emptyDir in the Job"
    );

    let reader = one(&objs, "Pod");
    let rc = &reader["spec"]["containers"][0];
    assert_eq!(rc["command"], serde_json::json!(["sleep", "infinity"]));
    assert_eq!(rc["image"], c["image"]);
    let rm = mount_at(rc, "/results");
    assert_eq!(rm["readOnly"], true);
    assert_eq!(claim_of(&reader["spec"], rm["name"].as_str().expect("name")), claim);

    // A claim of one's own: no claim made, no reader when asked for none.
    let objs = render(&[
        "--set",
        "results.persistence.existingClaim=x,results.reader.enabled=false",
    ]);
    assert!(kind(&objs, "PersistentVolumeClaim").is_empty());
    assert!(kind(&objs, "Pod").is_empty());
    let (pod, c) = job(&objs);
    assert_eq!(
        claim_of(pod, mount_at(c, "/results")["name"].as_str().expect("name")),
        "x"
    );
}

#[test]
fn every_pod_runs_as_the_images_non_root_user() {
    let objs = render(&["--set", "dra.enabled=true"]);
    let pods: Vec<&Value> = kind(&objs, "Job")
        .into_iter()
        .map(|j| &j["spec"]["template"]["spec"])
        .chain(kind(&objs, "Pod").into_iter().map(|p| &p["spec"]))
        .collect();
    assert_eq!(pods.len(), 2, "the Job's pod and the reader");
    for pod in pods {
        let sc = &pod["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{sc}");
        assert_eq!(sc["runAsUser"], 10001, "{sc}");
        for c in pod["containers"].as_array().expect("containers") {
            let csc = &c["securityContext"];
            assert_eq!(csc["allowPrivilegeEscalation"], false, "{}", c["name"]);
            assert!(
                strings(&csc["capabilities"]["drop"]).contains(&"ALL".to_string()),
                "{}",
                c["name"]
            );
            assert!(
                csc.get("runAsUser").is_none() && csc.get("runAsNonRoot").is_none(),
                "{csc}"
            );
            assert_ne!(csc["privileged"], true);
        }
    }
}

#[test]
fn without_a_node_the_chart_refuses_to_render() {
    let err = helm_template(RELEASE, NS, &[]).expect_err("rendered without node");
    assert!(err.contains("node is required"), "{err}");
    let err = helm_template(
        RELEASE,
        NS,
        &["--set", "node=gpu-node-1", "--set-json", r#"run.args=["--node=other"]"#],
    )
    .expect_err("run.args may not set --node");
    assert!(err.contains("run.args") && err.contains("--node"), "{err}");
}
