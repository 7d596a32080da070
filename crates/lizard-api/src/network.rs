//! A sandbox's outbound network policy, as callers give it at create.
//!
//! The platform's own deny list (private and link-local ranges, loopback, other
//! sandboxes, the host) always applies first, so `allowOut` cannot open any of it; then
//! `denyOut`, then `allowOut`, then `allowInternetAccess` decides the rest.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Most entries a list may hold.
pub const MAX_CIDRS: usize = 256;

/// `allowInternetAccess`, `allowOut`, `denyOut` of a create request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    /// Whether destinations in neither list are reachable (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// CIDRs (`203.0.113.0/24`, or a bare address) reachable even without internet
    /// access; never any the platform denies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// CIDRs never reachable; wins over `allowOut`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
}

/// An address range, normalized to its network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?} is not a CIDR (like 203.0.113.0/24)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: prefix must be 0..={max}"))?
            }
            Some(_) => return Err(format!("{s:?}: prefix must be 0..={max}")),
        };
        let addr = match addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0)).into()),
            IpAddr::V6(a) => {
                IpAddr::V6((u128::from(a) & u128::MAX.checked_shl(128 - prefix as u32).unwrap_or(0)).into())
            }
        };
        Ok(Cidr { addr, prefix })
    }
}

/// The policy in checked form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedPolicy {
    pub allow_internet_access: bool,
    pub allow_out: Vec<Cidr>,
    pub deny_out: Vec<Cidr>,
}

impl NetworkPolicy {
    /// Check every entry; the message names the field and the entry at fault.
    pub fn parse(&self) -> Result<ParsedPolicy, String> {
        let list = |name: &str, v: &[String]| -> Result<Vec<Cidr>, String> {
            if v.len() > MAX_CIDRS {
                return Err(format!("{name} holds at most {MAX_CIDRS} entries"));
            }
            v.iter().map(|s| s.trim().parse::<Cidr>().map_err(|e| format!("{name}: {e}"))).collect()
        };
        Ok(ParsedPolicy {
            allow_internet_access: self.allow_internet_access.unwrap_or(true),
            allow_out: list("allowOut", &self.allow_out)?,
            deny_out: list("denyOut", &self.deny_out)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_normalize() {
        assert_eq!("203.0.113.7/24".parse::<Cidr>().unwrap().to_string(), "203.0.113.0/24");
        assert_eq!("203.0.113.7".parse::<Cidr>().unwrap().to_string(), "203.0.113.7/32");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().to_string(), "0.0.0.0/0");
        assert_eq!("2001:db8::1/32".parse::<Cidr>().unwrap().to_string(), "2001:db8::/32");
        for bad in ["", "1.2.3.4/33", "1.2.3/8", "1.2.3.4/", "1.2.3.4/+8", "x/8", "::/129", "1.2.3.4/08x"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn policy_defaults_to_internet_and_names_the_bad_field() {
        let p: NetworkPolicy = serde_json::from_str("{}").unwrap();
        assert!(p.parse().unwrap().allow_internet_access);
        let p: NetworkPolicy = serde_json::from_str(r#"{"allowInternetAccess":false,"denyOut":["nope"]}"#).unwrap();
        assert!(p.parse().unwrap_err().starts_with("denyOut"));
        let p = NetworkPolicy { allow_out: vec!["1.1.1.1".into(); MAX_CIDRS + 1], ..Default::default() };
        assert!(p.parse().is_err());
    }
}
