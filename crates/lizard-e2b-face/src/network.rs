//! E2B's egress lists as Lizard's network policy.
//!
//! The two rules differ in which list wins: in E2B an `allowOut` entry opens what
//! `denyOut` closes, and `0.0.0.0/0` in `denyOut` (or `allow_internet_access: false`)
//! closes everything else; in Lizard `denyOut` wins, and `allowInternetAccess: false`
//! closes everything else. So a closed E2B policy becomes Lizard's closed one with the
//! same `allowOut` (its other `denyOut` entries are closed anyway, and any of them that
//! `allowOut` names is open in E2B too); an open one keeps its `denyOut`, and an
//! `allowOut` address inside one of its ranges, which Lizard could not open, is refused.

use lizard_api::network::NetworkPolicy;
use lizard_e2b::rest::ALL_TRAFFIC;

/// Lizard's policy for E2B's `allow_internet_access`, `allowOut` and `denyOut`, or why
/// it cannot hold them.
pub fn policy(internet: Option<bool>, allow_out: &[String], deny_out: &[String]) -> Result<NetworkPolicy, String> {
    let closes_all = |entry: &String| entry.trim() == ALL_TRAFFIC;
    if internet == Some(false) || deny_out.iter().any(closes_all) {
        let closed =
            NetworkPolicy { allow_internet_access: Some(false), allow_out: allow_out.to_vec(), deny_out: vec![] };
        closed.parse()?;
        return Ok(closed);
    }
    let both =
        NetworkPolicy { allow_internet_access: None, allow_out: allow_out.to_vec(), deny_out: deny_out.to_vec() };
    let parsed = both.parse()?;
    for allowed in &parsed.allow_out {
        if let Some(denied) = parsed.deny_out.iter().find(|d| d.contains(allowed.addr) || allowed.contains(d.addr)) {
            return Err(format!(
                "allowOut {}/{} overlaps denyOut {}/{}: an exception inside a denied range is served only when \
                 denyOut also denies all traffic ({ALL_TRAFFIC})",
                allowed.addr, allowed.prefix, denied.addr, denied.prefix
            ));
        }
    }
    // Everything outside denyOut is open: allowOut adds nothing.
    Ok(NetworkPolicy { allow_internet_access: None, allow_out: vec![], deny_out: deny_out.to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn all_traffic_denied_becomes_closed_with_the_allowed_open() {
        let p = policy(None, &list(&["1.1.1.1", "registry.example"]), &list(&[ALL_TRAFFIC, "8.8.8.8"])).unwrap();
        assert_eq!(p.allow_internet_access, Some(false));
        assert_eq!(p.allow_out, list(&["1.1.1.1", "registry.example"]));
        assert!(p.deny_out.is_empty());
        let off = policy(Some(false), &[], &[]).unwrap();
        assert_eq!((off.allow_internet_access, off.allow_out.len()), (Some(false), 0));
    }

    #[test]
    fn an_open_policy_keeps_its_denials_and_refuses_an_exception_inside_one() {
        let p = policy(None, &list(&["1.1.1.1"]), &list(&["8.8.8.0/24"])).unwrap();
        assert_eq!((p.allow_internet_access, p.deny_out.clone()), (None, list(&["8.8.8.0/24"])));
        let e = policy(Some(true), &list(&["8.8.8.8"]), &list(&["8.8.8.0/24"])).unwrap_err();
        assert!(e.contains("8.8.8.8/32") && e.contains("8.8.8.0/24"), "{e}");
        assert!(policy(None, &list(&["not a cidr/"]), &[]).is_err());
    }
}
