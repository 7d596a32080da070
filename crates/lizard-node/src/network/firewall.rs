//! The nftables rulesets: the host's (one table per node, shared by its sandboxes) and
//! each sandbox namespace's (the platform's deny list, then the sandbox's own lists, then
//! its internet switch).

use super::forbidden::{host_subnets, PLATFORM_DENY};
use super::netlink::{NS_IF, TAP_IF};
use lizard_agent_proto::net::GATEWAY;
use lizard_api::network::{Cidr, ParsedPolicy};
use std::net::Ipv4Addr;

/// The root namespace's rules: nothing from a sandbox link reaches the host itself or
/// another sandbox link; the pool is masqueraded out of the uplink; TCP MSS follows
/// the route's MTU (uplinks are often below the guests' 1500).
pub(super) fn host_ruleset(table: &str, link_prefix: &str, pool: &str) -> String {
    let t = table;
    let links = format!("{link_prefix}*");
    let deny = PLATFORM_DENY.join(", ");
    format!(
        "table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n\
         \tchain input {{ type filter hook input priority filter - 5; policy accept;\n\
         \t\tiifname \"{links}\" drop\n\t}}\n\
         \tchain forward {{ type filter hook forward priority filter - 5; policy accept;\n\
         \t\tiifname \"{links}\" ip daddr {{ {deny}, {pool} }} drop\n\
         \t\tiifname \"{links}\" tcp flags syn tcp option maxseg size set rt mtu\n\
         \t\toifname \"{links}\" tcp flags syn tcp option maxseg size set rt mtu\n\t}}\n\
         \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {pool} ip daddr != {pool} masquerade\n\t}}\n}}\n"
    )
}

/// The namespace's rules: the guest may send DNS to the gateway and nothing else to
/// the namespace itself; what it forwards passes the platform's deny list, then the
/// user's lists, then the internet switch; everything leaving is SNATed to the slot's
/// address. A policy that names domains has the guest's TCP to ports 80 and 443
/// redirected to the egress proxy on the gateway (see [`super::egress`]), which judges
/// those connections by name.
///
/// For a fresh namespace (nothing in it yet): the closed table ([`closed_table`]) and
/// what `policy` adds to it ([`policy_additions`]), in one transaction.
pub(super) fn sandbox_ruleset(pool: &str, ns_addr: Ipv4Addr, policy: &ParsedPolicy) -> String {
    closed_table(pool, ns_addr) + &policy_additions(policy)
}

/// [`sandbox_ruleset`] for a namespace that has rules already: it first makes sure the
/// table exists, then deletes it and makes it anew, all in one transaction, leaving
/// nothing of the old rules. (Deleting costs the kernel a wait of ≈10 ms that adding does
/// not; a fresh namespace, or a closed table that only gains a policy, skips it.)
pub(super) fn replacement_ruleset(pool: &str, ns_addr: Ipv4Addr, policy: &ParsedPolicy) -> String {
    "table inet lizard\ndelete table inet lizard\n".to_string() + &sandbox_ruleset(pool, ns_addr, policy)
}

/// The namespace's table with no policy in it: DNS to the gateway, nothing forwarded
/// but replies (the forward chain ends after the platform's deny list, its policy drop).
fn closed_table(pool: &str, ns_addr: Ipv4Addr) -> String {
    let mut deny: Vec<String> = PLATFORM_DENY.iter().map(|s| s.to_string()).collect();
    deny.push(pool.to_string());
    deny.extend(host_subnets());
    format!(
        "table inet lizard {{\n\tset platform_deny {}\n\
         \tchain input {{ type filter hook input priority filter; policy drop;\n\
         \t\tiif \"lo\" accept\n\
         \t\tct state established,related accept\n\
         \t\tiifname \"{TAP_IF}\" ip daddr {GATEWAY} meta l4proto {{ tcp, udp }} th dport 53 accept\n\t}}\n\
         \tchain forward {{ type filter hook forward priority filter; policy drop;\n\
         \t\tiifname \"{NS_IF}\" oifname \"{TAP_IF}\" ct state established,related accept\n\
         \t\tiifname != \"{TAP_IF}\" drop\n\
         \t\toifname != \"{NS_IF}\" drop\n\
         \t\tmeta nfproto != ipv4 drop\n\
         \t\tip daddr @platform_deny drop\n\t}}\n\
         \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
         \t\toifname \"{NS_IF}\" snat ip to {ns_addr}\n\t}}\n}}\n",
        interval_set(&deny),
    )
}

/// What `policy` adds to the [`closed_table`], as additions only (rules appended to its
/// chains, new sets and chains): the user's lists, then the internet switch, at the end of
/// the forward chain; for named domains, the egress proxy's ports and the redirect to
/// them. Empty for a closed policy.
pub(super) fn policy_additions(policy: &ParsedPolicy) -> String {
    let v4 = |l: &[Cidr]| l.iter().filter(|c| c.addr.is_ipv4()).map(Cidr::to_string).collect::<Vec<_>>();
    let (user_deny, user_allow) = (v4(&policy.deny_out), v4(&policy.allow_out));
    let mut sets = String::new();
    let mut rules = vec![];
    if !user_deny.is_empty() {
        sets += &format!("add set inet lizard user_deny {}\n", interval_set(&user_deny));
        rules.push("add rule inet lizard forward ip daddr @user_deny drop".to_string());
    }
    if !user_allow.is_empty() {
        sets += &format!("add set inet lizard user_allow {}\n", interval_set(&user_allow));
        rules.push("add rule inet lizard forward ip daddr @user_allow accept".to_string());
    }
    if policy.allow_internet_access {
        rules.push("add rule inet lizard forward accept".to_string());
    }
    if policy.has_domains() {
        let (http, tls) = (super::egress::HTTP_PORT, super::egress::TLS_PORT);
        rules.extend([
            format!("add rule inet lizard input iifname \"{TAP_IF}\" ip daddr {GATEWAY} tcp dport {{ {http}, {tls} }} accept"),
            "add chain inet lizard prerouting { type nat hook prerouting priority dstnat; policy accept; }".to_string(),
            format!("add rule inet lizard prerouting iifname \"{TAP_IF}\" tcp dport 80 dnat ip to {GATEWAY}:{http}"),
            format!("add rule inet lizard prerouting iifname \"{TAP_IF}\" tcp dport 443 dnat ip to {GATEWAY}:{tls}"),
        ]);
    }
    sets + &rules.iter().map(|r| format!("{r}\n")).collect::<String>()
}

/// An IPv4 interval set's definition with `elems` in it.
fn interval_set(elems: &[String]) -> String {
    format!("{{ type ipv4_addr; flags interval; auto-merge; elements = {{ {} }} }}", elems.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_deny_comes_before_the_users_lists() {
        let policy = ParsedPolicy {
            allow_internet_access: false,
            allow_out: vec![
                "10.1.2.3/32".parse().unwrap(),
                "203.0.113.0/24".parse().unwrap(),
                "2001:db8::/32".parse().unwrap(),
            ],
            deny_out: vec!["203.0.113.9".parse().unwrap()],
            ..Default::default()
        };
        let pool = "10.200.0.0/16";
        let r = sandbox_ruleset(pool, Ipv4Addr::new(10, 200, 0, 2), &policy);
        let at = |s: &str| r.find(s).unwrap_or_else(|| panic!("{s} missing in\n{r}"));
        assert!(at("@platform_deny drop") < at("@user_deny drop"));
        assert!(at("@user_deny drop") < at("@user_allow accept"));
        assert!(r.contains("10.200.0.0/16"), "{r}");
        assert!(r.contains("169.254.0.0/16"));
        assert!(!r.contains("2001:db8"), "IPv6 is not forwarded at all: {r}");
        assert!(r.contains("snat ip to 10.200.0.2"));
        assert!(r.starts_with("table inet lizard {"), "a fresh namespace's rules delete nothing: {r}");
        assert!(!r.contains("forward accept"), "internet off: the forward chain's policy (drop) ends it: {r}");
        let open = sandbox_ruleset(
            pool,
            Ipv4Addr::new(10, 200, 0, 2),
            &ParsedPolicy { allow_internet_access: true, ..Default::default() },
        );
        assert!(open.trim_end().ends_with("add rule inet lizard forward accept") && !open.contains("@user_"), "{open}");
    }

    #[test]
    fn a_closed_policy_adds_nothing_and_a_policy_only_adds() {
        assert_eq!(policy_additions(&ParsedPolicy::default()), "");
        let policy = ParsedPolicy {
            allow_internet_access: true,
            allow_out: vec!["203.0.113.0/24".parse().unwrap()],
            deny_out: vec!["203.0.113.9".parse().unwrap()],
            allow_domains: vec!["registry.example".parse().unwrap()],
            ..Default::default()
        };
        let added = policy_additions(&policy);
        assert!(added.lines().all(|l| l.starts_with("add ")), "{added}");
        let pool = "10.200.0.0/16";
        let replaced = replacement_ruleset(pool, Ipv4Addr::new(10, 200, 0, 2), &policy);
        assert!(replaced.starts_with("table inet lizard\ndelete table inet lizard\ntable inet lizard {"), "{replaced}");
        assert!(replaced.ends_with(&added), "{replaced}");
    }

    #[test]
    fn the_host_table_drops_sandbox_traffic_to_the_host_and_the_pool() {
        let r = host_ruleset("lizard_lzv", "lzv", "10.200.0.0/16");
        assert!(r.starts_with("table ip lizard_lzv\ndelete table ip lizard_lzv\n"), "{r}");
        assert!(r.contains("iifname \"lzv*\" drop"), "{r}");
        assert!(r.contains("ip saddr 10.200.0.0/16 ip daddr != 10.200.0.0/16 masquerade"), "{r}");
    }

    #[test]
    fn domain_rules_send_web_traffic_to_the_egress_proxy() {
        let plain = sandbox_ruleset("10.200.0.0/16", Ipv4Addr::new(10, 200, 0, 2), &ParsedPolicy::default());
        assert!(!plain.contains("dnat"), "{plain}");
        let named = ParsedPolicy { allow_domains: vec!["registry.example".parse().unwrap()], ..Default::default() };
        let r = sandbox_ruleset("10.200.0.0/16", Ipv4Addr::new(10, 200, 0, 2), &named);
        assert!(r.contains("tcp dport 443 dnat ip to 10.0.2.1:15443"), "{r}");
        assert!(r.contains("tcp dport 80 dnat ip to 10.0.2.1:15080"), "{r}");
        assert!(r.contains("tcp dport { 15080, 15443 } accept"), "{r}");
    }
}
