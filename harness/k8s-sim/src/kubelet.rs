//! What the kubelet makes of a container's `command` and `args` before it starts the
//! container: `$(NAME)` references expanded from the container's environment, `$$`
//! turned into `$` (rule I6 in UPSTREAM-RULES.md).
//!
//! Rules from kubernetes `pkg/kubelet/container/helpers.go`
//! (`ExpandContainerCommandAndArgs`: each command and args element expanded with a
//! mapping from the container's resolved environment) and
//! `third_party/forked/golang/expansion/expand.go` (`Expand`, `tryReadVariableName`),
//! read at commit fde22c3f9aac:
//! - `$$` is an escaped `$`: one `$` is written and scanning goes on after both;
//! - `$(NAME)` up to the first `)` is replaced by NAME's value, or left as it was when
//!   NAME is not in the environment;
//! - `$(` without a closing `)` stays as it is, and so does a `$` before any other
//!   character or at the very end.
//!
//! Not modelled: the service-link variables the kubelet adds (`<SERVICE>_SERVICE_HOST`,
//! ...) and the expansion of env values against earlier ones; the harness's pods use
//! neither.

use std::collections::BTreeMap;

use serde_json::Value;

/// `input` with its `$(NAME)` references expanded from `env` (`expand.go` `Expand`).
pub fn expand(input: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(next) = after.chars().next() else {
            // A `$` at the very end is copied with the rest.
            out.push('$');
            rest = after;
            break;
        };
        match next {
            '$' => {
                out.push('$');
                rest = &after[1..];
            }
            '(' => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match env.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            c => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The environment the kubelet resolves for a pod's container: literal values, and
/// `fieldRef` `metadata.name` / `metadata.namespace` from the pod.
pub fn environment(pod: &Value, container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let Some(name) = e["name"].as_str() else { continue };
        let value = match (e["value"].as_str(), e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => pod["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            (None, Some("metadata.namespace")) => pod["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
            _ => continue,
        };
        env.insert(name.to_string(), value);
    }
    env
}

/// The command and args the container runtime gets for a pod's first container, as
/// the kubelet expands them (`ExpandContainerCommandAndArgs`); empty where the pod
/// leaves the image's ENTRYPOINT or CMD.
pub fn command_and_args(pod: &Value) -> (Vec<String>, Vec<String>) {
    let c = &pod["spec"]["containers"][0];
    let env = environment(pod, c);
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| expand(s, &env))
            .collect()
    };
    (list(&c["command"]), list(&c["args"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_escapes_and_leftovers_expand_as_the_kubelet_does() {
        let env: BTreeMap<String, String> = [("PORT", "9400"), ("POD", "p-1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (input, want) in [
            ("--port=$(PORT)", "--port=9400"),
            ("$(POD)/$(PORT)", "p-1/9400"),
            ("$$(PORT)", "$(PORT)"),
            ("$(hostname)", "$(hostname)"),
            ("echo $$", "echo $"),
            ("$$$$", "$$"),
            ("cost $5", "cost $5"),
            ("tail $", "tail $"),
            ("$(PORT", "$(PORT"),
            ("a $( b", "a $( b"),
            ("é$é", "é$é"),
            ("$(NOPE) $(PORT)", "$(NOPE) 9400"),
        ] {
            assert_eq!(expand(input, &env), want, "{input:?}");
        }
    }

    #[test]
    fn the_containers_environment_resolves_values_and_the_pods_name() {
        let pod = json!({
            "metadata": {"name": "w-1", "namespace": "ns"},
            "spec": {"containers": [{
                "command": ["/bin/sh", "-c", "serve --port $(PORT) --name $(POD) $$HOME"],
                "env": [
                    {"name": "PORT", "value": "9400"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ]
            }]}
        });
        let (command, args) = command_and_args(&pod);
        assert_eq!(command, ["/bin/sh", "-c", "serve --port 9400 --name w-1 $HOME"]);
        assert!(args.is_empty());
    }
}
