//! RBAC as the API server's authorizer applies it: Roles and ClusterRoles granted to a
//! subject through RoleBindings and ClusterRoleBindings, each rule matching by verb, API
//! group, resource (`pods/portforward` for a subresource) and, when it lists any,
//! resource name. Rules from kubernetes `plugin/pkg/auth/authorizer/rbac/rbac.go`
//! (`RuleAllows`) and `pkg/apis/rbac/v1/evaluation_helpers.go` (`VerbMatches`,
//! `APIGroupMatches`, `ResourceMatches`, `ResourceNameMatches`): a rule with
//! resourceNames never matches a request without a name (list, watch, create by POST);
//! the denial text follows `responsewriters.forbiddenMessage`. See UPSTREAM-RULES.md
//! A1, A2, H2.
//! The kubernetes files were read from a code index at the commits UPSTREAM-RULES.md
//! names (H); which release they belong to was not identified.

use serde_json::Value;

/// What a request asks to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Attributes {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group ("" for core).
    pub group: String,
    /// Resource, plural (`pods`).
    pub resource: String,
    /// Subresource (`portforward`), or empty.
    pub subresource: String,
    /// Namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// Object name, empty for collections.
    pub name: String,
}

impl Attributes {
    fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The 403 message (`responsewriters/errors.go` `forbiddenMessage`, apimachinery
    /// `NewForbidden`; H7): `pods "p" is forbidden: User "u" cannot get resource
    /// "pods/portforward" in API group "" in the namespace "ns"`: the prefix names the
    /// resource with its group, never the subresource, and no name for list or create.
    pub fn forbidden_message(&self, user: &str) -> String {
        let resource = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let what = if self.name.is_empty() || matches!(self.verb.as_str(), "list" | "watch") {
            resource
        } else {
            format!("{resource} \"{}\"", self.name)
        };
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", self.namespace)
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.verb,
            self.resource_path(),
            self.group
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn allows(&self, a: &Attributes) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        let resource = a.resource_path();
        let resource_ok = self
            .resources
            .iter()
            .any(|r| r == "*" || *r == resource || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource)));
        has(&self.verbs, &a.verb)
            && has(&self.groups, &a.group)
            && resource_ok
            && (self.names.is_empty() || (!a.name.is_empty() && self.names.contains(&a.name)))
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Grant {
    /// Namespace the rules apply in; None: everywhere (ClusterRoleBinding).
    namespace: Option<String>,
    rules: Vec<Rule>,
}

/// Who may do what.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Authorizer {
    grants: Vec<(String, Grant)>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn rules(role: &Value) -> Vec<Rule> {
    role.get("rules")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .map(|r| Rule {
                    verbs: strings(r, "verbs"),
                    groups: strings(r, "apiGroups"),
                    resources: strings(r, "resources"),
                    names: strings(r, "resourceNames"),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The user name of a ServiceAccount.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

impl Authorizer {
    /// Builds the grants from RBAC objects (Roles, ClusterRoles and their bindings; other
    /// kinds are ignored). A binding to a missing role grants nothing, as upstream.
    pub fn from_objects(objects: &[Value]) -> Self {
        let meta = |o: &Value, k: &str| {
            o.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let kind = |o: &Value| o.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        let find = |k: &str, name: &str, ns: &str| {
            objects
                .iter()
                .find(|o| kind(o) == k && meta(o, "name") == name && (k == "ClusterRole" || meta(o, "namespace") == ns))
        };
        let mut grants = Vec::new();
        for b in objects {
            let bkind = kind(b);
            if bkind != "RoleBinding" && bkind != "ClusterRoleBinding" {
                continue;
            }
            let ns = meta(b, "namespace");
            let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
            let Some(role) = find(role_kind, role_name, &ns) else {
                continue;
            };
            let grant = Grant {
                namespace: (bkind == "RoleBinding").then(|| ns.clone()),
                rules: rules(role),
            };
            for s in b.get("subjects").and_then(Value::as_array).into_iter().flatten() {
                let name = s["name"].as_str().unwrap_or_default();
                let user = match s["kind"].as_str() {
                    Some("ServiceAccount") => {
                        service_account_user(s["namespace"].as_str().unwrap_or(ns.as_str()), name)
                    }
                    _ => name.to_string(),
                };
                grants.push((user, grant.clone()));
            }
        }
        Self { grants }
    }

    /// Whether `user` (with its groups) may do `a`.
    pub fn allows(&self, user: &str, groups: &[&str], a: &Attributes) -> bool {
        // system:basic-user, bound to system:authenticated by default: self reviews.
        if a.group == "authorization.k8s.io"
            && matches!(
                a.resource.as_str(),
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            )
            && a.verb == "create"
        {
            return true;
        }
        self.grants.iter().any(|(who, g)| {
            (who == user || groups.contains(&who.as_str()))
                && g.namespace.as_ref().is_none_or(|ns| *ns == a.namespace)
                && g.rules.iter().any(|r| r.allows(a))
        })
    }
}

/// The RBAC objects of a multi-document YAML file (`manifests/base/rbac.yaml`).
pub fn objects_from_yaml(text: &str) -> Result<Vec<Value>, String> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).map_err(|e| e.to_string()))
        .collect()
}

/// `objects` with the verbs of rule `rule` of Role `role` replaced (tests: an older or
/// narrower grant than the manifests').
pub fn with_rule_verbs(mut objects: Vec<Value>, role: &str, rule: usize, verbs: &[&str]) -> Vec<Value> {
    for o in &mut objects {
        if o["metadata"]["name"] == role && o["kind"] == "Role" {
            o["rules"][rule]["verbs"] = serde_json::json!(verbs);
        }
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: String::new(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn resource_names_match_only_named_requests_in_the_bound_namespace() {
        let objs = vec![
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "ops"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["get", "patch", "list"]},
                             {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "ops"},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "bench"}]}),
        ];
        let a = Authorizer::from_objects(&objs);
        let u = service_account_user("bench", "sa");
        assert!(a.allows(&u, &[], &attrs("patch", "configmaps", "", "ops", "cfg")));
        assert!(!a.allows(&u, &[], &attrs("patch", "configmaps", "", "ops", "other")));
        assert!(
            !a.allows(&u, &[], &attrs("list", "configmaps", "", "ops", "")),
            "list has no name"
        );
        assert!(!a.allows(&u, &[], &attrs("patch", "configmaps", "", "default", "cfg")));
        assert!(a.allows(&u, &[], &attrs("get", "pods", "portforward", "ops", "prom-0")));
        assert!(!a.allows(&u, &[], &attrs("create", "pods", "portforward", "ops", "prom-0")));
        assert_eq!(
            attrs("create", "pods", "portforward", "ops", "prom-0").forbidden_message(&u),
            "pods \"prom-0\" is forbidden: User \"system:serviceaccount:bench:sa\" cannot create resource \"pods/portforward\" in API group \"\" in the namespace \"ops\""
        );
    }
}
