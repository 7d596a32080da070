//! The server's settings: plain data, no machinery, so a CLI can fill it from flags and a
//! file, and tests from a temp directory.

use lizard_api::Region;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings of a control-plane server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Holds `lizard.db` (and whatever else the server keeps).
    pub data_dir: PathBuf,
    /// The region this server places sandboxes in.
    pub region: String,
    /// Public sandbox URLs are `{id}-{port}.sandbox.{region}.{domain}`.
    pub domain: String,
    /// What `GET /v1/regions` lists. Empty: just [`Self::region`].
    pub regions: Vec<Region>,
    /// The owner account's email, set on first start.
    pub owner_email: String,
    /// The owner account's plan, set on first start.
    pub owner_plan: String,
    /// Prices, free credits, metering tick and the grace period at zero balance.
    pub billing: crate::billing::BillingConfig,
    /// How long a paused sandbox is kept before it is killed.
    pub paused_retention_ms: u64,
}

/// Default [`ServerConfig::paused_retention_ms`]: 7 days.
pub const DEFAULT_PAUSED_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Default listen address: loopback only, since the API is reachable by key alone.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7171";

impl ServerConfig {
    /// Defaults for everything but the data directory: region `local`, domain
    /// `lizard.localhost` (resolves to loopback without DNS setup), loopback port 7171.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid address"),
            data_dir: data_dir.into(),
            region: "local".into(),
            domain: "lizard.localhost".into(),
            regions: Vec::new(),
            owner_email: "owner@lizard.localhost".into(),
            owner_plan: "free".into(),
            billing: crate::billing::BillingConfig::default(),
            paused_retention_ms: DEFAULT_PAUSED_RETENTION_MS,
        }
    }

    /// `sandbox.{region}.{domain}`: the suffix of every public sandbox host of `region`.
    pub fn sandbox_domain(&self, region: &str) -> String {
        format!("sandbox.{region}.{}", self.domain)
    }

    /// The regions to list: the configured ones, or this server's own.
    pub fn effective_regions(&self) -> Vec<Region> {
        if !self.regions.is_empty() {
            return self.regions.clone();
        }
        vec![Region {
            id: self.region.clone(),
            name: self.region.clone(),
            sandbox_domain: self.sandbox_domain(&self.region),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = ServerConfig::new("/tmp/x");
        assert_eq!(c.region, "local");
        assert_eq!(c.domain, "lizard.localhost");
        assert!(c.listen.ip().is_loopback());
        let r = c.effective_regions();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].sandbox_domain, "sandbox.local.lizard.localhost");
    }
}
