//! Field ownership of server-side apply and JSON merge patches, as the API server keeps
//! it in `metadata.managedFields` (kubernetes-sigs/structured-merge-diff v6.3.0, the
//! same in substance as v4.4.1: `merge/update.go` `Updater.Apply` / `Updater.Update`;
//! the conflict text from kubernetes `managedfields/internal/conflict.go`; see
//! UPSTREAM-RULES.md A2, H1–H4):
//!
//! - an apply by manager M sets the fields of its configuration and M owns exactly
//!   those afterwards; a field M applied before and omits now is removed from the
//!   object unless another manager also owns it;
//! - applying a value different from the live one of a field another manager owns is a
//!   409 Conflict, unless `force`, which moves the field to M; the same value makes the
//!   ownership shared;
//! - an update (merge patch) by manager U makes U the only owner of every field it sets;
//!   a field it deletes (null) is owned by nobody.
//!
//! Maps (`metadata.labels`, `data`, `spec…`) are granular: each key is its own field.
//! Simplification: lists are atomic (upstream merges `containers` by name; the harness
//! always applies whole lists, so the difference never shows here).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// A field: the keys from the object's root to a leaf.
pub type FieldPath = Vec<String>;

/// Who owns which fields of one object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Managed {
    /// Manager → its fields.
    pub owners: BTreeMap<String, BTreeSet<FieldPath>>,
    /// Manager → its last operation (`Apply` or `Update`).
    pub ops: BTreeMap<String, &'static str>,
}

/// An apply that conflicts with other managers' fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    /// (manager as printed, field) pairs in conflict, sorted by manager.
    pub fields: Vec<(String, String)>,
}

impl Conflict {
    /// The API server's message (`managedfields/internal/conflict.go` `getConflictMessage`,
    /// UPSTREAM-RULES.md H4): one conflict `Apply failed with 1 conflict: conflict with
    /// "m": .path`; more are grouped per manager as `conflicts with "m":\n- .a\n- .b`.
    pub fn message(&self) -> String {
        if let [(m, f)] = self.fields.as_slice() {
            return format!("Apply failed with 1 conflict: conflict with {m}: {f}");
        }
        let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (m, f) in &self.fields {
            by.entry(m).or_default().push(f);
        }
        let groups: Vec<String> = by
            .iter()
            .map(|(m, fs)| {
                if let [f] = fs.as_slice() {
                    format!("conflict with {m}: {f}")
                } else {
                    format!("conflicts with {m}:\n- {}", fs.join("\n- "))
                }
            })
            .collect();
        format!(
            "Apply failed with {} conflicts: {}",
            self.fields.len(),
            groups.join("\n")
        )
    }
}

/// Fields that identify an object; never owned, never removed.
fn identity(path: &[String]) -> bool {
    matches!(
        path.iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
        ["apiVersion"] | ["kind"] | ["metadata", "name"] | ["metadata", "namespace"]
    ) || path.first().is_some_and(|p| p == "status")
        || (path.len() >= 2
            && path[0] == "metadata"
            && matches!(
                path[1].as_str(),
                "resourceVersion" | "uid" | "creationTimestamp" | "managedFields" | "generation" | "deletionTimestamp"
            ))
}

/// Every leaf field of a configuration (objects recurse; scalars, nulls and lists are leaves).
pub fn leaves(v: &Value) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut BTreeSet<FieldPath>) {
        match v {
            // An empty map sets nothing (`data: {}` owns no key).
            Value::Object(m) => {
                for (k, child) in m {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() && !identity(path) {
                    out.insert(path.clone());
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// The value at a path.
pub fn get<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn set(v: &mut Value, path: &[String], value: Value) {
    let mut cur = v;
    for k in &path[..path.len() - 1] {
        if !cur.get(k).is_some_and(Value::is_object) {
            cur[k] = Value::Object(Map::new());
        }
        cur = &mut cur[k];
    }
    cur[&path[path.len() - 1]] = value;
}

/// Removes a field and the objects it leaves empty.
fn remove(v: &mut Value, path: &[String]) {
    fn go(v: &mut Value, path: &[String]) -> bool {
        let Some(m) = v.as_object_mut() else { return false };
        if path.len() == 1 {
            m.remove(&path[0]);
        } else if let Some(child) = m.get_mut(&path[0])
            && go(child, &path[1..])
        {
            m.remove(&path[0]);
        }
        m.is_empty()
    }
    go(v, path);
}

fn dotted(path: &[String]) -> String {
    format!(".{}", path.join("."))
}

impl Managed {
    /// Server-side apply of `config` by `manager` onto `live` (None: the object is
    /// created). Returns the new object, or the conflicts.
    pub fn apply(
        &mut self,
        live: Option<&Value>,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, Conflict> {
        let wanted = leaves(config);
        let mut obj = live.cloned().unwrap_or_else(|| Value::Object(Map::new()));
        let mut conflicts = Vec::new();
        for path in &wanted {
            let new = get(config, path);
            if get(&obj, path) == new {
                continue;
            }
            for (other, fields) in &self.owners {
                if other != manager && fields.contains(path) {
                    let shown = match self.ops.get(other) {
                        Some(&"Update") => format!("\"{other}\" using v1"),
                        _ => format!("\"{other}\""),
                    };
                    conflicts.push((shown, dotted(path)));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(Conflict { fields: conflicts });
        }
        if force {
            for (other, fields) in self.owners.iter_mut() {
                if other == manager {
                    continue;
                }
                fields.retain(|p| !wanted.contains(p) || get(&obj, p) == get(config, p));
            }
        }
        let before = self.owners.remove(manager).unwrap_or_default();
        for gone in before.difference(&wanted) {
            if !self.owners.values().any(|f| f.contains(gone)) {
                remove(&mut obj, gone);
            }
        }
        for path in &wanted {
            if let Some(v) = get(config, path) {
                set(&mut obj, path, v.clone());
            }
        }
        // Identity fields come from the configuration.
        for k in ["apiVersion", "kind"] {
            if let Some(v) = config.get(k) {
                obj[k] = v.clone();
            }
        }
        for k in ["name", "namespace"] {
            if let Some(v) = config.get("metadata").and_then(|m| m.get(k)) {
                set(&mut obj, &["metadata".into(), k.into()], v.clone());
            }
        }
        self.owners.insert(manager.to_string(), wanted);
        self.ops.insert(manager.to_string(), "Apply");
        self.owners.retain(|_, f| !f.is_empty());
        self.ops.retain(|m, _| self.owners.contains_key(m));
        Ok(obj)
    }

    /// A JSON merge patch (RFC 7386) by `manager`, an `Update` (smd `Updater.Update`,
    /// H3): it takes the fields whose value it changes or adds (writing an unchanged
    /// value takes nothing) from every other manager; fields it deletes are owned by
    /// nobody.
    pub fn merge_patch(&mut self, live: &Value, patch: &Value, manager: &str) -> Value {
        let mut obj = live.clone();
        merge(&mut obj, patch);
        let mut set_fields = BTreeSet::new();
        let mut deleted = BTreeSet::new();
        fn walk(p: &Value, path: &mut Vec<String>, set: &mut BTreeSet<FieldPath>, del: &mut BTreeSet<FieldPath>) {
            match p {
                Value::Object(m) => {
                    for (k, v) in m {
                        path.push(k.clone());
                        walk(v, path, set, del);
                        path.pop();
                    }
                }
                Value::Null => {
                    del.insert(path.clone());
                }
                _ => {
                    if !identity(path) {
                        set.insert(path.clone());
                    }
                }
            }
        }
        walk(patch, &mut Vec::new(), &mut set_fields, &mut deleted);
        set_fields.retain(|p| get(live, p) != get(&obj, p));
        for fields in self.owners.values_mut() {
            fields.retain(|f| !set_fields.contains(f) && !deleted.iter().any(|d| f.starts_with(d)));
        }
        if !set_fields.is_empty() {
            self.owners.entry(manager.to_string()).or_default().extend(set_fields);
            self.ops.insert(manager.to_string(), "Update");
        }
        self.owners.retain(|_, f| !f.is_empty());
        self.ops.retain(|m, _| self.owners.contains_key(m));
        obj
    }

    /// `metadata.managedFields` as the API server shows it (fieldsV1 in its `f:` form).
    pub fn to_json(&self) -> Value {
        let entries: Vec<Value> = self
            .owners
            .iter()
            .map(|(m, fields)| {
                let mut f = Value::Object(Map::new());
                for path in fields {
                    let p: Vec<String> = path.iter().map(|k| format!("f:{k}")).collect();
                    set(&mut f, &p, Value::Object(Map::new()));
                }
                serde_json::json!({
                    "manager": m,
                    "operation": self.ops.get(m).copied().unwrap_or("Update"),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": f,
                })
            })
            .collect();
        Value::Array(entries)
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let Some(t) = target.as_object_mut() else { return };
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_apply_that_omits_a_field_it_applied_removes_it() {
        let mut m = Managed::default();
        let a = json!({"data": {"a": "1"}});
        let obj = m.apply(None, &a, "bench", false).expect("no conflict");
        let obj = m
            .apply(Some(&obj), &json!({"data": {"b": "2"}}), "bench", false)
            .expect("no conflict");
        assert_eq!(
            obj["data"],
            json!({"b": "2"}),
            "key a was applied by bench only, so it goes"
        );
    }

    #[test]
    fn a_field_another_manager_owns_stays_and_conflicts_unless_forced() {
        let mut m = Managed::default();
        let live = m.merge_patch(&json!({}), &json!({"data": {"user": "x", "k": "1"}}), "kubectl");
        let err = m
            .apply(Some(&live), &json!({"data": {"k": "2"}}), "bench", false)
            .expect_err("conflict");
        assert_eq!(
            err.message(),
            "Apply failed with 1 conflict: conflict with \"kubectl\" using v1: .data.k"
        );
        // Same value: shared, no conflict; then bench omits it: kubectl still owns it.
        let live = m
            .apply(Some(&live), &json!({"data": {"k": "1"}}), "bench", false)
            .expect("same value");
        let live = m.apply(Some(&live), &json!({"data": {}}), "bench", false).expect("ok");
        assert_eq!(live["data"], json!({"user": "x", "k": "1"}));
        let live = m
            .apply(Some(&live), &json!({"data": {"k": "2"}}), "bench", true)
            .expect("forced");
        assert_eq!(live["data"]["k"], "2");
        let live = m.apply(Some(&live), &json!({"data": {}}), "bench", false).expect("ok");
        assert_eq!(
            live["data"],
            json!({"user": "x"}),
            "forced field moved to bench, and went with it"
        );
    }
}
