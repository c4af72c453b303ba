//! Kiln's query API over Connect with binary protobuf, as Grafana's own Pyroscope datasource
//! calls it.

use std::time::Duration;

use prost::Message;

use crate::frames::FrameError;
use crate::query::{Settings, SettingsError};

/// A failed call, with what a Grafana user needs to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach Kiln at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("Kiln refused the credentials (HTTP {status}): {message}")]
    Auth { status: u16, message: String },
    #[error("Kiln answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("invalid answer from Kiln: {0}")]
    Decode(#[from] prost::DecodeError),
    /// Kiln's answer does not make a Grafana frame.
    #[error("invalid answer from Kiln: {0}")]
    Frame(#[from] FrameError),
    #[error("invalid datasource settings: {0}")]
    Settings(String),
}

impl ClientError {
    /// HTTP-like status for `DataResponse.status` and resource calls.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unreachable { .. } => 502,
            Self::Auth { status, .. } | Self::Status { status, .. } => *status,
            Self::Decode(_) | Self::Frame(_) => 502,
            Self::Settings(_) => 400,
        }
    }
}

impl From<SettingsError> for ClientError {
    fn from(e: SettingsError) -> Self {
        Self::Settings(e.to_string())
    }
}

/// A client for one datasource instance.
#[derive(Debug, Clone)]
pub struct KilnClient {
    http: reqwest::Client,
    settings: Settings,
}

impl KilnClient {
    pub fn new(settings: Settings) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .danger_accept_invalid_certs(settings.tls_skip_verify)
            .build()
            .map_err(|e| ClientError::Settings(e.to_string()))?;
        Ok(Self { http, settings })
    }

    /// This client for a query that names its tenants (none: the datasource's).
    pub fn for_tenants(&self, tenants: &[String]) -> Self {
        let picked: Vec<&str> = tenants
            .iter()
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
            .collect();
        if picked.is_empty() {
            return self.clone();
        }
        let mut c = self.clone();
        c.settings.tenant = Some(picked.join("|"));
        c
    }

    /// The settings this client was made for.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Calls `querier.v1.QuerierService/<method>`.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, ClientError> {
        let url = format!("{}/querier.v1.QuerierService/{method}", self.settings.url);
        let mut r = self
            .http
            .post(&url)
            .header("Content-Type", "application/proto")
            .header("Connect-Protocol-Version", "1")
            .body(req.encode_to_vec());
        if let Some(token) = &self.settings.token {
            r = r.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(tenant) = &self.settings.tenant {
            r = r.header("X-Scope-OrgID", tenant);
        }
        let resp = r.send().await.map_err(|e| ClientError::Unreachable {
            url: self.settings.url.clone(),
            reason: error_chain(&e),
        })?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| ClientError::Unreachable {
            url: self.settings.url.clone(),
            reason: error_chain(&e),
        })?;
        if status != 200 {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
            return Err(match status {
                401 | 403 => ClientError::Auth { status, message },
                _ => ClientError::Status { status, message },
            });
        }
        Ok(Resp::decode(body.as_ref())?)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
