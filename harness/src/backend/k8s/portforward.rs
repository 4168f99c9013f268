//! A local port forwarded to the cluster's Prometheus pod through the API server (the
//! `kubectl port-forward` of kube-rs), for clusters whose Prometheus the harness cannot
//! reach directly.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::net::TcpListener;

use super::base::kube_error;
use crate::error::{BenchError, Result};

/// A running forward; stops when dropped.
#[derive(Debug)]
pub struct Forward {
    /// http://127.0.0.1:PORT
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Finds a running Prometheus pod (`selector` in `namespace`) and forwards a local port
/// to its `port`.
pub async fn to_prometheus(client: Client, namespace: &str, selector: &str, port: u16) -> Result<Forward> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| kube_error(&format!("looking for Prometheus pods ({selector}) in {namespace}"), e))?;
    let pod = list
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .and_then(|p| p.metadata.name.clone())
        .ok_or_else(|| {
            BenchError::kube(format!(
                "no running Prometheus pod matches {selector} in namespace {namespace}; pass --prometheus URL"
            ))
        })?;
    // One forward now, so that a missing permission (kube-rs's port-forward is a WebSocket
    // GET: `get` on pods/portforward, plus `create` from Kubernetes 1.35) is an error at
    // the start naming the permission, not a Prometheus error in the first cell.
    let probe = pods
        .portforward(&pod, &[port])
        .await
        .map_err(|e| kube_error(&format!("port-forward to Prometheus pod {namespace}/{pod}:{port}"), e))?;
    drop(probe);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io("binding the port-forward"))?;
    let local = listener
        .local_addr()
        .map_err(BenchError::io("reading the port-forward's address"))?;
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (pods, pod) = (pods.clone(), pod.clone());
            tokio::spawn(async move {
                // Errors are logged, not swallowed: a failing forward shows up as a
                // Prometheus error whose cause is here (GPUSHARE_LOG=warn shows it).
                let mut forwarder = match pods.portforward(&pod, &[port]).await {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!("{}", kube_error(&format!("port-forward to pod {pod}:{port}"), e));
                        return;
                    }
                };
                match forwarder.take_stream(port) {
                    Some(mut upstream) => {
                        if let Err(e) = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await {
                            tracing::warn!("port-forward to pod {pod}:{port}: {e}");
                        }
                    }
                    None => tracing::warn!("port-forward to pod {pod}:{port}: no stream for the port"),
                }
                if let Err(e) = forwarder.join().await {
                    tracing::warn!("port-forward to pod {pod}:{port} ended with: {e}");
                }
            });
        }
    });
    Ok(Forward {
        url: format!("http://{local}"),
        task,
    })
}
