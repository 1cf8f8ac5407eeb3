//! The metrics options every daemon takes (`mon run`, `osd run`, `nbd serve`).

use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics over HTTP on this address (`GET /metrics`), e.g.
    /// 127.0.0.1:9300 (port 0: any free port, printed at start). Off by default. An address
    /// off loopback needs --metrics-token-file.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// File holding a token (16 to 1024 visible characters, e.g. from `openssl rand -hex
    /// 16`) that every scrape must send as `Authorization: Bearer TOKEN` (Prometheus:
    /// `authorization: {credentials_file: FILE}` in the scrape config); others get 401.
    #[arg(long, value_name = "FILE", requires = "metrics_addr")]
    pub metrics_token_file: Option<PathBuf>,
}

impl MetricsArgs {
    /// Where to serve metrics and the token they need, checked (`None`: no endpoint).
    pub fn listen(&self) -> Result<Option<cairn_metrics::Listen>> {
        let Some(addr) = self.metrics_addr else {
            return Ok(None);
        };
        let token = match &self.metrics_token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("cannot read the metrics token file {}", path.display())
                })?;
                let token = cairn_metrics::Token::parse(&text)
                    .with_context(|| format!("in {}", path.display()))?;
                Some(token)
            }
            None => None,
        };
        Ok(Some(cairn_metrics::Listen::new(addr, token)?))
    }
}
