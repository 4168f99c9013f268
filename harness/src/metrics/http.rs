//! A small HTTP/1 client (hyper) for scraping pods and calling the Prometheus API:
//! GET with a timeout, the cause of a failure in words.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A plain HTTP client with connection reuse.
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A new HTTP client.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// GETs a URL within `timeout`: (status, body), or why there was no answer.
pub async fn http_get(client: &HttpClient, url: &str, timeout: Duration) -> std::result::Result<(u16, String), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    let fut = async {
        let resp = client.get(uri).await.map_err(|e| {
            // hyper-util's error hides the cause (connection refused, DNS) one level down.
            let cause = std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            format!("{e}{cause}")
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).map_err(|_| "the body is not UTF-8".to_string())?;
        Ok((status, text))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f64())),
    }
}

/// Whether a pod on this machine answers `/healthz` with 200.
pub async fn healthz(port: u16) -> bool {
    ready(port, "/healthz").await
}

/// Whether `http://127.0.0.1:PORT{path}` answers 2xx within a second.
pub async fn ready(port: u16, path: &str) -> bool {
    matches!(
        http_get(
            &http_client(),
            &format!("http://127.0.0.1:{port}{path}"),
            Duration::from_secs(1)
        )
        .await,
        Ok((200..=299, _))
    )
}
