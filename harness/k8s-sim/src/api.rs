//! The simulated API server's HTTP side: paths to resources, methods to RBAC verbs
//! (UPSTREAM-RULES.md A1: kubernetes `apiserver/pkg/endpoints/request/requestinfo.go`),
//! RBAC on every request, and get, list (label and field selectors), create, merge
//! patch, server-side apply (a create through apply is authorised as `create` too, A2:
//! `endpoints/handlers/patch.go`), delete, SelfSubjectAccessReview, and the port-forward
//! upgrade's authorisation (A4: `get`, plus `create` from 1.35).
//! The kubernetes files were read from a code index at the commits UPSTREAM-RULES.md
//! names (H); which release they belong to was not identified.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::fields::Managed;
use super::rbac::{Attributes, Authorizer};
use super::world::{Key, Object, World};

/// A request as the handler sees it.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// GET, POST, PATCH, PUT, DELETE.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query parameters.
    pub query: BTreeMap<String, String>,
    /// Content-Type.
    pub content_type: String,
    /// User-Agent.
    pub user_agent: String,
    /// Body.
    pub body: Vec<u8>,
    /// Whether it asks for a WebSocket upgrade.
    pub upgrade: bool,
}

/// The answer: status code and JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    /// HTTP status.
    pub code: u16,
    /// Body.
    pub body: Value,
}

fn status(code: u16, reason: &str, message: String) -> ApiResponse {
    ApiResponse {
        code,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": message, "reason": reason, "code": code}),
    }
}

fn ok(code: u16, body: Value) -> ApiResponse {
    ApiResponse { code, body }
}

/// Kind and apiVersion of the resources the simulator serves.
fn kind_of(group: &str, resource: &str) -> Option<(&'static str, &'static str, bool)> {
    // (kind, apiVersion, namespaced)
    Some(match (group, resource) {
        ("", "nodes") => ("Node", "v1", false),
        ("", "namespaces") => ("Namespace", "v1", false),
        ("", "configmaps") => ("ConfigMap", "v1", true),
        ("", "pods") => ("Pod", "v1", true),
        ("apps", "deployments") => ("Deployment", "apps/v1", true),
        ("nvidia.com", "clusterpolicies") => ("ClusterPolicy", "nvidia.com/v1", false),
        ("", "events") => ("Event", "v1", true),
        ("resource.k8s.io", "resourceclaims") => ("ResourceClaim", "resource.k8s.io/v1", true),
        ("resource.k8s.io", "resourceclaimtemplates") => ("ResourceClaimTemplate", "resource.k8s.io/v1", true),
        ("resource.k8s.io", "deviceclasses") => ("DeviceClass", "resource.k8s.io/v1", false),
        ("resource.k8s.io", "resourceslices") => ("ResourceSlice", "resource.k8s.io/v1", false),
        ("rbac.authorization.k8s.io", "roles") => ("Role", "rbac.authorization.k8s.io/v1", true),
        ("rbac.authorization.k8s.io", "rolebindings") => ("RoleBinding", "rbac.authorization.k8s.io/v1", true),
        ("authorization.k8s.io", "selfsubjectaccessreviews") => {
            ("SelfSubjectAccessReview", "authorization.k8s.io/v1", false)
        }
        _ => return None,
    })
}

/// Request attributes from the path and method (requestinfo.go; H6: a list or watch
/// pinned by `fieldSelector=metadata.name=N` carries the name N).
pub fn attributes(req: &ApiRequest) -> Option<Attributes> {
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g, _v, rest @ ..] => (*g, rest),
        _ => return None,
    };
    let (namespace, resource, name, sub) = match rest {
        ["namespaces", ns, r, tail @ ..] => (ns.to_string(), r.to_string(), tail.first(), tail.get(1)),
        [r, tail @ ..] => (String::new(), r.to_string(), tail.first(), tail.get(1)),
        [] => return None,
    };
    let collection = name.is_none();
    let mut name = name.map(|s| (*s).to_string()).unwrap_or_default();
    let verb = match req.method.as_str() {
        "GET" | "HEAD" if collection => {
            if let Some(n) = req
                .query
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .filter(|n| !n.contains(','))
            {
                name = n.to_string();
            }
            if req.query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                "watch"
            } else {
                "list"
            }
        }
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if collection => "deletecollection",
        "DELETE" => "delete",
        _ => return None,
    };
    Some(Attributes {
        verb: verb.into(),
        group: group.into(),
        resource,
        subresource: sub.map(|s| (*s).to_string()).unwrap_or_default(),
        namespace,
        name,
    })
}

/// Label selector matching (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma = and).
pub fn selector_matches(selector: &str, labels: &Value) -> bool {
    selector.split(',').filter(|s| !s.trim().is_empty()).all(|term| {
        let term = term.trim();
        let get = |k: &str| labels.get(k.trim()).and_then(Value::as_str);
        if let Some((k, v)) = term.split_once("!=") {
            get(k) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            get(k) == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            get(k).is_none()
        } else {
            get(term).is_some()
        }
    })
}

fn field_matches(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return false;
        };
        let path: Vec<&str> = k.trim_end_matches('=').split('.').collect();
        let have = path.iter().try_fold(obj, |o, p| o.get(*p)).and_then(Value::as_str);
        have == Some(v.trim_start_matches('='))
    })
}

fn manager_of(req: &ApiRequest) -> String {
    req.query.get("fieldManager").cloned().unwrap_or_else(|| {
        // The API server's default: the User-Agent before its first `/`, else `unknown`
        // (buildmanagerinfo.go, H3; kube-rs sends no User-Agent).
        let prefix = req.user_agent.split('/').next().unwrap_or_default().trim();
        if prefix.is_empty() {
            "unknown".to_string()
        } else {
            prefix.to_string()
        }
    })
}

fn not_found(a: &Attributes) -> ApiResponse {
    let what = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    status(404, "NotFound", format!("{what} \"{}\" not found", a.name))
}

fn with_meta(o: &Object) -> Value {
    let mut v = o.value.clone();
    v["metadata"]["managedFields"] = o.managed.to_json();
    v
}

/// Handles one request as `user` (with `groups`) against the world (already advanced to
/// now).
pub fn handle(world: &mut World, authz: &Authorizer, user: &str, groups: &[&str], req: &ApiRequest) -> ApiResponse {
    // Discovery of the server's version is open to every authenticated user
    // (system:public-info-viewer).
    if req.method == "GET" && req.path == "/version" {
        return ok(
            200,
            json!({"major": "1", "minor": world.spec.minor_version.to_string(),
                   "gitVersion": format!("v1.{}.0-sim", world.spec.minor_version),
                   "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                   "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        );
    }
    let Some(a) = attributes(req) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({})", req.path),
        );
    };
    if !authz.allows(user, groups, &a) {
        return status(403, "Forbidden", a.forbidden_message(user));
    }
    if a.subresource == "portforward" {
        // 1.35: the WebSocket upgrade also needs `create` (AuthorizePodWebsocketUpgradeCreatePermission).
        if world.spec.minor_version >= 35 && req.upgrade {
            let create = Attributes {
                verb: "create".into(),
                ..a.clone()
            };
            if !authz.allows(user, groups, &create) {
                return status(403, "Forbidden", create.forbidden_message(user));
            }
        }
        return status(
            501,
            "NotImplemented",
            "the simulated cluster authorises port-forwards but carries no traffic".into(),
        );
    }
    if !a.subresource.is_empty() {
        return status(
            404,
            "NotFound",
            format!("subresource {} is not simulated", a.subresource),
        );
    }
    let Some((kind, api_version, namespaced)) = kind_of(&a.group, &a.resource) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({})", a.resource),
        );
    };
    if kind == "SelfSubjectAccessReview" {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let r = &body["spec"]["resourceAttributes"];
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        let asked = Attributes {
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            subresource: s("subresource"),
            namespace: s("namespace"),
            name: s("name"),
        };
        let allowed = authz.allows(user, groups, &asked);
        let mut out = body.clone();
        out["status"] = json!({"allowed": allowed});
        return ok(201, out);
    }
    let ns = if namespaced { a.namespace.clone() } else { String::new() };
    let key = Key::new(&a.resource, &ns, &a.name);
    match a.verb.as_str() {
        "get" => match world.objects.get(&key) {
            Some(o) => ok(200, with_meta(o)),
            None => not_found(&a),
        },
        "list" => {
            let labels = req.query.get("labelSelector").cloned().unwrap_or_default();
            let fields = req.query.get("fieldSelector").cloned().unwrap_or_default();
            let items: Vec<Value> = world
                .objects
                .iter()
                .filter(|(k, _)| k.resource == a.resource && (ns.is_empty() || k.namespace == ns))
                .filter(|(_, o)| selector_matches(&labels, &o.value["metadata"]["labels"]))
                .filter(|(_, o)| field_matches(&fields, &o.value))
                .map(|(_, o)| with_meta(o))
                .collect();
            ok(
                200,
                json!({"kind": format!("{kind}List"), "apiVersion": api_version,
                       "metadata": {"resourceVersion": world.rv.to_string()}, "items": items}),
            )
        }
        "create" => {
            let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
                return status(400, "BadRequest", "the request body is not JSON".into());
            };
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let key = Key::new(&a.resource, &ns, &name);
            if world.objects.contains_key(&key) {
                return status(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", a.resource),
                );
            }
            let mut managed = Managed::default();
            let value = managed.merge_patch(&json!({}), &body, &manager_of(req));
            if let Some(e) = claim_invalid(kind, &name, &value, None) {
                return e;
            }
            store(world, key.clone(), value, managed);
            ok(201, with_meta(&world.objects[&key]))
        }
        "patch" => patch(world, authz, user, groups, req, &a, key, (kind, api_version)),
        "delete" => {
            if !world.objects.contains_key(&key) {
                return not_found(&a);
            }
            let body = with_meta(&world.objects[&key]);
            let finalized = world.objects[&key].value["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            if a.resource == "pods" {
                world.terminate_pod(&ns, &a.name);
            } else if finalized {
                // An object with finalizers stays, marked for deletion, until they are
                // removed (J7: apiserver `registry/generic/registry/store.go` `Delete`).
                let ts = world.timestamp();
                if let Some(o) = world.objects.get_mut(&key)
                    && o.value["metadata"]["deletionTimestamp"].is_null()
                {
                    o.value["metadata"]["deletionTimestamp"] = json!(ts);
                }
            } else {
                world.objects.remove(&key);
            }
            world.controllers();
            ok(200, body)
        }
        other => status(405, "MethodNotAllowed", format!("{other} is not simulated")),
    }
}

/// API validation of a ResourceClaim or ResourceClaimTemplate (J3): its devices, and a
/// spec that does not change once created (`ValidateResourceClaimUpdate`:
/// `spec: Invalid value: …: field is immutable`).
fn claim_invalid(kind: &str, name: &str, value: &Value, before: Option<&Value>) -> Option<ApiResponse> {
    let (path, devices, spec) = match kind {
        "ResourceClaim" => ("spec", &value["spec"]["devices"], &value["spec"]),
        "ResourceClaimTemplate" => ("spec.spec", &value["spec"]["spec"]["devices"], &value["spec"]),
        _ => return None,
    };
    let mut errs = super::dra::validate_claim_spec(devices, path);
    if let Some(b) = before
        && b["spec"] != *spec
    {
        errs.push(format!("spec: Invalid value: {spec}: field is immutable"));
    }
    (!errs.is_empty()).then(|| status(422, "Invalid", super::dra::invalid_message(kind, name, &errs)))
}

fn store(world: &mut World, key: Key, mut value: Value, managed: Managed) {
    world.rv += 1;
    value["metadata"]["resourceVersion"] = json!(world.rv.to_string());
    if value["metadata"]["creationTimestamp"].is_null() {
        value["metadata"]["creationTimestamp"] = json!(world.timestamp());
        value["metadata"]["uid"] = json!(format!("uid-{}", world.rv));
    }
    world.objects.insert(key, Object { value, managed });
}

#[allow(clippy::too_many_arguments)]
fn patch(
    world: &mut World,
    authz: &Authorizer,
    user: &str,
    groups: &[&str],
    req: &ApiRequest,
    a: &Attributes,
    key: Key,
    (kind, api_version): (&str, &str),
) -> ApiResponse {
    let apply = req.content_type.starts_with("application/apply-patch");
    let body: Value = if apply {
        match serde_yaml_ng::from_slice(&req.body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", format!("error decoding YAML: {e}")),
        }
    } else if req.content_type.starts_with("application/merge-patch+json")
        || req.content_type.starts_with("application/strategic-merge-patch+json")
    {
        match serde_json::from_slice(&req.body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", format!("error decoding patch: {e}")),
        }
    } else {
        return status(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {})",
                req.content_type
            ),
        );
    };
    let before_labels = world.node_labels();
    let existing = world.objects.get(&key).cloned();
    let manager = manager_of(req);
    let (value, managed, code) = if apply {
        if !req.query.contains_key("fieldManager") {
            return status(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
                    .into(),
            );
        }
        if body["kind"].as_str() != Some(kind) || body["apiVersion"].as_str() != Some(api_version) {
            return status(
                400,
                "BadRequest",
                format!("the apply configuration must say kind {kind}, apiVersion {api_version}"),
            );
        }
        if existing.is_none() {
            // The apply patcher creates the object: authorised as `create` (patch.go).
            let create = Attributes {
                verb: "create".into(),
                ..a.clone()
            };
            if !authz.allows(user, groups, &create) {
                return status(403, "Forbidden", create.forbidden_message(user));
            }
        }
        let mut managed = existing.as_ref().map(|o| o.managed.clone()).unwrap_or_default();
        let force = req.query.get("force").is_some_and(|f| f == "true");
        match managed.apply(existing.as_ref().map(|o| &o.value), &body, &manager, force) {
            Ok(v) => (v, managed, if existing.is_some() { 200 } else { 201 }),
            Err(c) => return status(409, "Conflict", c.message()),
        }
    } else {
        let Some(o) = &existing else { return not_found(a) };
        let mut managed = o.managed.clone();
        let v = managed.merge_patch(&o.value, &body, &manager);
        (v, managed, 200)
    };
    if let Some(e) = claim_invalid(kind, &a.name, &value, existing.as_ref().map(|o| &o.value)) {
        return e;
    }
    let mut value = value;
    if let Some(o) = &existing {
        for k in ["creationTimestamp", "uid"] {
            value["metadata"][k] = o.value["metadata"][k].clone();
        }
        if value.get("status").is_none() && o.value.get("status").is_some() {
            value["status"] = o.value["status"].clone();
        }
    }
    store(world, key.clone(), value, managed);
    match a.resource.as_str() {
        "nodes" => world.labels_changed(&before_labels),
        "configmaps" => world.configmap_changed(),
        _ => world.controllers(),
    }
    ok(code, with_meta(&world.objects[&key]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str) -> ApiRequest {
        ApiRequest {
            method: method.into(),
            path: path.into(),
            query: BTreeMap::new(),
            content_type: String::new(),
            user_agent: "kube-rs/5".into(),
            body: Vec::new(),
            upgrade: false,
        }
    }

    #[test]
    fn paths_and_methods_become_rbac_attributes() {
        let a = attributes(&req("PATCH", "/apis/apps/v1/namespaces/b/deployments/w")).expect("valid");
        assert_eq!(
            (
                a.verb.as_str(),
                a.group.as_str(),
                a.resource.as_str(),
                a.namespace.as_str(),
                a.name.as_str()
            ),
            ("patch", "apps", "deployments", "b", "w")
        );
        let a = attributes(&req("GET", "/api/v1/namespaces/m/pods/p/portforward")).expect("valid");
        assert_eq!((a.verb.as_str(), a.subresource.as_str()), ("get", "portforward"));
        let a = attributes(&req("GET", "/api/v1/nodes")).expect("valid");
        assert_eq!((a.verb.as_str(), a.namespace.as_str()), ("list", ""));
        assert!(selector_matches("app=x,tier!=db", &json!({"app": "x"})));
        assert!(!selector_matches("app=x", &json!({"app": "y"})));
    }
}
