//! The HTTP side: `/metrics` (Prometheus text format) and `/healthz` (200 once warm,
//! 503 before), served by hyper on a listener bound before the model loads, so a port
//! in use is reported at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{Result, WorkloadError};
use crate::metrics::WorkloadMetrics;

/// Binds the address now (std listener, so the caller gets a clear error before any
/// model is loaded).
pub fn bind(addr: &str) -> Result<std::net::TcpListener> {
    let listen_err = |source| WorkloadError::Listen {
        addr: addr.to_string(),
        source,
    };
    let parsed: SocketAddr = addr.parse().map_err(|_| {
        listen_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an address of the form IP:PORT (e.g. 127.0.0.1:9400 or 0.0.0.0:9400)",
        ))
    })?;
    let listener = std::net::TcpListener::bind(parsed).map_err(listen_err)?;
    listener.set_nonblocking(true).map_err(listen_err)?;
    Ok(listener)
}

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Answers one request (pure: no I/O besides reading the metrics).
pub fn route(method: &Method, path: &str, metrics: &WorkloadMetrics) -> Response<Full<Bytes>> {
    match (method, path) {
        (&Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        (&Method::GET, "/healthz") => {
            if metrics.ready.get() == 1 {
                respond(StatusCode::OK, "text/plain", "ok\n")
            } else {
                respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "warming up\n")
            }
        }
        (&Method::GET, "/") => respond(
            StatusCode::OK,
            "text/plain",
            "gpushare-workload: GET /metrics (Prometheus), GET /healthz (200 once warm)\n",
        ),
        (&Method::GET, _) => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        _ => respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n"),
    }
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<WorkloadMetrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let listener = TcpListener::from_std(listener).map_err(|source| WorkloadError::Io {
        what: "starting the HTTP server".into(),
        source,
    })?;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let resp = route(req.method(), req.uri().path(), &metrics);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    // A client that hangs up mid-request is not our error.
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Identity;

    #[test]
    fn healthz_turns_ok_when_ready() {
        let m = WorkloadMetrics::new(&Identity {
            pod: "p".into(),
            strategy: "s".into(),
        })
        .expect("metrics");
        assert_eq!(
            route(&Method::GET, "/healthz", &m).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.ready.set(1);
        assert_eq!(route(&Method::GET, "/healthz", &m).status(), StatusCode::OK);
        assert_eq!(route(&Method::GET, "/nope", &m).status(), StatusCode::NOT_FOUND);
        assert_eq!(
            route(&Method::POST, "/metrics", &m).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn bind_names_the_address() {
        let held = bind("127.0.0.1:0").expect("ephemeral port");
        let addr = held.local_addr().expect("address").to_string();
        let err = bind(&addr).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with(&format!("cannot listen on {addr}")), "{err}");
        let err = bind("localhost").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("IP:PORT"), "{err}");
    }
}
