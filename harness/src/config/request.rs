//! `--request URL --body FILE`: the requests the harness's own load generator sends to a
//! server of the user's, as the run records them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The recorded request plan (`run.json` `plan.request`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestPlan {
    /// The URL of every request, `{port}` the pod's port (`--request`).
    pub url: String,
    /// The file whose bytes are POSTed with each request (`--body`); none: GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<PathBuf>,
    /// Its size when the run began: a resume refuses a body that changed size.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub body_bytes: u64,
    /// Streamed answers of an OpenAI-compatible server (`--stream`): the harness writes
    /// each request's body and times every token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamPlan>,
}

/// Which OpenAI-compatible API a streamed request goes to: where an answer's text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// `/v1/completions`: the prompt as token ids, the text in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: the prompt as one user message of words, the text in
    /// `choices[0].delta.content`.
    Chat,
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Api::Completions => "completions",
            Api::Chat => "chat",
        })
    }
}

/// The streamed requests (`run.json` `plan.request.stream`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamPlan {
    /// The API (`--stream`).
    pub api: Api,
    /// The `model` field of every request (`--served-model`).
    pub model: String,
    /// Prompt tokens per request (`--prompt-tokens`).
    pub prompt_tokens: crate::config::values::Lengths,
    /// `max_tokens` per request, with `ignore_eos`, so each answer has that many
    /// (`--output-tokens`).
    pub output_tokens: crate::config::values::Lengths,
    /// `--lengths`: each request's prompt and output token counts, drawn from these
    /// pairs (then `prompt_tokens` and `output_tokens` give their ranges).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lengths: Vec<[u32; 2]>,
    /// The file the pairs were read from, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths_file: Option<String>,
    /// The server's own time-to-first-token histogram (`--server-ttft-metric`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_ttft_metric: Option<String>,
    /// The server's own inter-token histogram (`--server-itl-metric`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_itl_metric: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The largest `--body` read: the harness holds it in memory for every pod.
pub const MAX_BODY: u64 = 64 << 20;

impl RequestPlan {
    /// Checks `--request` and reads the size of `--body` (the error is the reason, for
    /// the flag that is wrong: `(flag, value, reason)`).
    pub fn new(url: &str, body: Option<&Path>) -> Result<Self, (&'static str, String, String)> {
        check_url(url).map_err(|r| ("--request", url.to_string(), r))?;
        let (body, body_bytes) = match body {
            None => (None, 0),
            Some(path) => {
                let bad = |r: String| ("--body", path.display().to_string(), r);
                let size = body_size(path).map_err(bad)?;
                // Recorded absolute, so a resume from another directory reads the same file.
                let full = std::fs::canonicalize(path).map_err(|e| bad(format!("cannot read: {e}")))?;
                (Some(full), size)
            }
        };
        Ok(Self {
            url: url.to_string(),
            body,
            body_bytes,
            stream: None,
        })
    }

    /// Checks a plan read back from run.json (the body file is read when the run starts).
    pub fn validate(&self) -> Result<(), String> {
        check_url(&self.url)
    }

    /// The URL for a pod listening on `port`.
    pub fn url_for(&self, port: u16) -> String {
        self.url.replace("{port}", &port.to_string())
    }

    /// Reads the body (the run's start and every resume): its size must still be the
    /// recorded one.
    pub fn read_body(&self) -> Result<Option<Vec<u8>>, String> {
        let Some(path) = &self.body else { return Ok(None) };
        let bytes = crate::files::read_bytes(path, crate::files::limits::INPUT).map_err(|e| e.to_string())?;
        if bytes.len() as u64 != self.body_bytes {
            return Err(format!(
                "{} bytes now, {} when the run began: the requests would differ",
                bytes.len(),
                self.body_bytes
            ));
        }
        Ok(Some(bytes))
    }

    /// The Content-Type of the body: JSON for `*.json`, else bytes.
    pub fn content_type(&self) -> &'static str {
        match self.body.as_ref().and_then(|p| p.extension()) {
            Some(e) if e == "json" => "application/json",
            _ => "application/octet-stream",
        }
    }
}

fn check_url(url: &str) -> Result<(), String> {
    if !url.starts_with("http://") {
        return Err("give an http:// URL with {port}, e.g. http://127.0.0.1:{port}/infer".into());
    }
    if !url.contains("{port}") {
        return Err("put {port} where the pod's port goes, e.g. http://127.0.0.1:{port}/infer".into());
    }
    let example = url.replace("{port}", "9400");
    let uri: hyper::Uri = example.parse().map_err(|e| format!("not a URL: {e}"))?;
    if uri.host().is_none_or(str::is_empty) || uri.port_u16() != Some(9400) {
        return Err("the URL needs a host and {port} as its port, e.g. http://127.0.0.1:{port}/infer".into());
    }
    Ok(())
}

fn body_size(path: &Path) -> Result<u64, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a file".into());
    }
    if meta.len() > MAX_BODY {
        return Err(format!("{} bytes; at most {MAX_BODY} (64 MiB)", meta.len()));
    }
    std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    Ok(meta.len())
}
