//! A sandbox's outbound network policy, as callers give it at create.
//!
//! The platform's own deny list (private and link-local ranges, loopback, other
//! sandboxes, the host) always applies first, so `allowOut` cannot open any of it; then
//! `denyOut`, then `allowOut`, then `allowInternetAccess` decides the rest.
//!
//! Entries are CIDRs (`203.0.113.0/24`, a bare address) or domain names
//! (`registry.example`: that name; `*.example`: its subdomains). Addresses are enforced
//! per packet; names where the connection is made (the node's egress proxy reads TLS SNI
//! or the HTTP Host of web traffic, resolves the name itself and dials only public
//! addresses) and by the DNS relay (without internet access it answers only allowed
//! names).

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Most entries a list may hold.
pub const MAX_CIDRS: usize = 256;
/// Longest domain name (RFC 1035, without the trailing dot).
const MAX_DOMAIN: usize = 253;

/// `allowInternetAccess`, `allowOut`, `denyOut` of a create request, and the body of a
/// sandbox's network update (which replaces all three).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

impl Cidr {
    /// Whether `ip` lies in this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(ip) & mask == u128::from(net)
            }
            _ => false,
        }
    }
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

/// A domain rule: `name` itself, or (`wildcard`) every name below it but not itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPattern {
    pub wildcard: bool,
    /// Lowercase, without a trailing dot.
    pub name: String,
}

impl std::fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", if self.wildcard { "*." } else { "" }, self.name)
    }
}

impl std::str::FromStr for DomainPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<DomainPattern, String> {
        let bad = || format!("{s:?} is neither a CIDR nor a domain name (like registry.example or *.example)");
        let lower = s.trim_end_matches('.').to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower),
        };
        let labels: Vec<&str> = name.split('.').collect();
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        // Two labels at least (a wildcard's base: one), and a last one that is not a
        // number (so no address passes).
        let top_ok = labels.last().is_some_and(|t| !t.bytes().all(|b| b.is_ascii_digit()));
        let min_labels = if wildcard { 1 } else { 2 };
        if name.len() > MAX_DOMAIN || labels.len() < min_labels || !labels.iter().all(|l| label_ok(l)) || !top_ok {
            return Err(bad());
        }
        Ok(DomainPattern { wildcard, name })
    }
}

impl DomainPattern {
    /// Whether `name` (any case, any trailing dot) falls under this rule.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if self.wildcard {
            name.strip_suffix(&self.name).is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        } else {
            name == self.name
        }
    }
}

/// The policy in checked form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedPolicy {
    pub allow_internet_access: bool,
    pub allow_out: Vec<Cidr>,
    pub deny_out: Vec<Cidr>,
    /// The domain names of `allowOut`.
    pub allow_domains: Vec<DomainPattern>,
    /// The domain names of `denyOut`.
    pub deny_domains: Vec<DomainPattern>,
}

impl ParsedPolicy {
    /// Whether any rule names a domain (web traffic then goes through the egress proxy).
    pub fn has_domains(&self) -> bool {
        !self.allow_domains.is_empty() || !self.deny_domains.is_empty()
    }

    /// Whether a connection to (or a lookup of) `name` is allowed by name: `denyOut` wins,
    /// then `allowOut`, then `allowInternetAccess`.
    pub fn allows_name(&self, name: &str) -> bool {
        if self.deny_domains.iter().any(|d| d.matches(name)) {
            return false;
        }
        self.allow_domains.iter().any(|d| d.matches(name)) || self.allow_internet_access
    }
}

impl NetworkPolicy {
    /// Check every entry; the message names the field and the entry at fault.
    pub fn parse(&self) -> Result<ParsedPolicy, String> {
        let list = |name: &str, v: &[String]| -> Result<(Vec<Cidr>, Vec<DomainPattern>), String> {
            if v.len() > MAX_CIDRS {
                return Err(format!("{name} holds at most {MAX_CIDRS} entries"));
            }
            let (mut cidrs, mut domains) = (vec![], vec![]);
            for entry in v.iter().map(|s| s.trim()) {
                // An entry that starts like an address is judged as one (its error says why).
                let address_like = entry.starts_with(|c: char| c.is_ascii_digit())
                    && !entry.contains(|c: char| c.is_ascii_alphabetic())
                    || entry.contains(':')
                    || entry.contains('/');
                match entry.parse::<Cidr>() {
                    Ok(c) => cidrs.push(c),
                    Err(e) if address_like => return Err(format!("{name}: {e}")),
                    Err(_) => domains.push(entry.parse::<DomainPattern>().map_err(|e| format!("{name}: {e}"))?),
                }
            }
            Ok((cidrs, domains))
        };
        let (allow_out, allow_domains) = list("allowOut", &self.allow_out)?;
        let (deny_out, deny_domains) = list("denyOut", &self.deny_out)?;
        Ok(ParsedPolicy {
            allow_internet_access: self.allow_internet_access.unwrap_or(true),
            allow_out,
            deny_out,
            allow_domains,
            deny_domains,
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
        let c: Cidr = "203.0.113.0/24".parse().unwrap();
        assert!(c.contains("203.0.113.77".parse().unwrap()) && !c.contains("203.0.114.1".parse().unwrap()));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("8.8.8.8".parse().unwrap()));
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

    #[test]
    fn domains_parse_match_and_never_pass_for_addresses() {
        let d: DomainPattern = "Registry.Example.".parse().unwrap();
        assert_eq!(d.to_string(), "registry.example");
        assert!(d.matches("registry.example") && d.matches("REGISTRY.example.") && !d.matches("x.registry.example"));
        let w: DomainPattern = "*.example".parse().unwrap();
        assert!(w.matches("a.example") && w.matches("a.b.example"));
        assert!(!w.matches("example") && !w.matches("evilexample") && !w.matches(".example"));
        for bad in
            ["", "localhost", "*.", "*", "a..b", "-a.example", "a-.example", "1.2.3.4", "a_b.example", "*.*.example"]
        {
            assert!(bad.parse::<DomainPattern>().is_err(), "{bad:?} passed");
        }
        assert!(format!("{}.example", "a".repeat(64)).parse::<DomainPattern>().is_err());
    }

    #[test]
    fn lists_mix_cidrs_and_domains_and_names_decide_in_order() {
        let p = NetworkPolicy {
            allow_internet_access: Some(false),
            allow_out: vec!["registry.example".into(), "203.0.113.0/24".into(), "*.cdn.example".into()],
            deny_out: vec!["bad.cdn.example".into()],
        }
        .parse()
        .unwrap();
        assert_eq!(p.allow_out.len(), 1);
        assert_eq!(p.allow_domains.len(), 2);
        assert!(p.has_domains());
        assert!(p.allows_name("registry.example") && p.allows_name("x.cdn.example"));
        assert!(!p.allows_name("bad.cdn.example") && !p.allows_name("other.example"));
        // A mistyped address is an address error, not a domain.
        let p = NetworkPolicy { allow_out: vec!["10.0.0.300/8".into()], ..Default::default() };
        assert!(p.parse().unwrap_err().starts_with("allowOut"));
        let p = NetworkPolicy { allow_out: vec!["1.2.3.4/33".into()], ..Default::default() };
        assert!(p.parse().is_err());
    }
}
