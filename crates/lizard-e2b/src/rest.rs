//! The control plane's JSON: what `POST /v2/sandboxes` takes and every sandbox route
//! answers. Field names are E2B's (camelCase, one snake_case exception it kept).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v2/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox ends (E2B's default: 300).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// The timeout pauses instead of killing.
    #[serde(default)]
    pub auto_pause: bool,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub network: Option<Network>,
    /// A request for one of its ports (or a connect) resumes it when paused.
    #[serde(default)]
    pub auto_resume: Option<AutoResume>,
}

/// `autoResume` of a create.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

/// `network` of a create (E2B's `SandboxNetworkConfig`) and the body of `PUT
/// /sandboxes/{id}/network` (its update shape, which adds `allow_internet_access`).
/// E2B's rule: `allowOut` wins over `denyOut`; `0.0.0.0/0` in `denyOut` denies all the
/// rest.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Whether the sandbox's URLs answer without its traffic token (E2B's default: yes).
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Every other field (`dnsServers`, `egressProxy`, `maskRequestHost`, `httpsPorts`,
    /// `rules`…): not served, so refused by name when given.
    #[serde(flatten)]
    pub others: BTreeMap<String, serde_json::Value>,
}

/// The value `0.0.0.0/0`: in `denyOut`, all traffic but what `allowOut` names.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

impl Network {
    /// The first field given (not null or empty) that Lizard does not serve.
    pub fn unserved(&self) -> Option<&str> {
        let empty = |v: &serde_json::Value| match v {
            serde_json::Value::Null => true,
            serde_json::Value::Array(a) => a.is_empty(),
            serde_json::Value::Object(o) => o.is_empty(),
            _ => false,
        };
        self.others.iter().find(|(_, v)| !empty(v)).map(|(k, _)| k.as_str())
    }
}

/// Seconds a sandbox lives when the create names none.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// The answer of create and connect.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by E2B but required by its parser.
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    /// What envd requests carry as `X-Access-Token` (shown at create and connect only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// What requests to a private sandbox's ports carry as `E2B-Traffic-Access-Token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    /// Port P of the sandbox is served at `{P}-{sandboxID}.{domain}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `running` or `paused`: E2B's parser knows no other state.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Running,
    Paused,
}

/// `GET /sandboxes/{id}` and each item of `GET /v2/sandboxes`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339: when the timeout ends it.
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub state: State,
    pub metadata: BTreeMap<String, String>,
    /// Older SDKs read the envd token here after connecting (newer ones from connect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// What ends a sandbox and what wakes it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: String,
}

/// `GET /v2/sandboxes`'s query, as the SDKs send it (arrays comma-joined; `metadata` a
/// form-encoded `k=v&…` whose keys and values are percent-encoded once more).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub metadata: BTreeMap<String, String>,
    /// The states asked for (none: every state).
    pub states: Vec<String>,
    pub template: Option<String>,
    pub descending: bool,
    pub limit: Option<usize>,
    /// Where the page starts: the `x-next-token` of the page before.
    pub next_token: Option<String>,
}

/// The header carrying the next page's token; absent on the last page.
pub const NEXT_TOKEN_HEADER: &str = "x-next-token";

/// Most sandboxes one page lists (and how many when the query names no limit).
pub const MAX_PAGE: usize = 100;

impl ListQuery {
    /// Read a raw query string.
    pub fn parse(query: &str) -> ListQuery {
        let mut q = ListQuery::default();
        for (key, value) in form_pairs(query) {
            match key.as_str() {
                "metadata" => q.metadata = form_pairs(&value).collect(),
                "state" => q.states = value.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
                "template" => q.template = Some(value),
                "order" => q.descending = value == "desc",
                "limit" => q.limit = value.parse().ok(),
                "nextToken" => q.next_token = Some(value),
                _ => {}
            }
        }
        q
    }
}

/// The `k=v` pairs of a form-encoded string, each side decoded (`+` is a space).
fn form_pairs(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    let decode = |s: &str| {
        let spaced = s.replace('+', " ");
        urlencoding::decode(&spaced).map_or(spaced.clone(), |d| d.into_owned())
    };
    text.split('&').filter(|p| !p.is_empty()).map(move |pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k), decode(v))
    })
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct SetTimeout {
    pub timeout: u64,
}

/// `POST /v2/sandboxes/{id}/connect`, and older SDKs' `POST /sandboxes/{id}/resume`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Connect {
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// One sample of `GET /sandboxes/{id}/metrics` (bytes, and a percentage of all CPUs).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// RFC 3339.
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// The guest command whose one line of output [`Metric::parse`] reads: CPUs, the CPU
/// time busy over 0.2 s (per mille), memory and root disk in bytes.
pub const METRICS_SCRIPT: &str = r#"set -eu
cpu() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat; }
a=$(cpu); sleep 0.2; b=$(cpu)
set -- $a $b
busy=$(( ($3 - $1) - ($4 - $2) )); all=$(( $3 - $1 ))
[ "$all" -gt 0 ] || all=1
mem() { awk -v k="$1:" '$1 == k {print $2 * 1024}' /proc/meminfo; }
disk=$(df -B1 --output=used,size / | tail -1)
echo "$(nproc) $(( busy * 1000 / all )) $(mem MemTotal) $(mem MemAvailable) $(mem Cached) $disk""#;

impl Metric {
    /// A sample from [`METRICS_SCRIPT`]'s output, taken at `unix_ms`.
    pub fn parse(line: &str, timestamp: String, unix_ms: i64) -> Option<Metric> {
        let n: Vec<u64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
        let [cpus, busy_permille, mem_total, mem_available, mem_cache, disk_used, disk_total] = n[..] else {
            return None;
        };
        Some(Metric {
            timestamp,
            timestamp_unix: unix_ms / 1000,
            cpu_count: u32::try_from(cpus).ok()?,
            cpu_used_pct: (busy_permille as f64) / 10.0,
            mem_used: mem_total.saturating_sub(mem_available),
            mem_total,
            mem_cache,
            disk_used,
            disk_total,
        })
    }
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Fork {
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub count: Option<u32>,
}

/// One copy of a fork: the sandbox, or why it is not there.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
}

/// `POST /sandboxes/{id}/snapshots`. `memory: false` asks for the disk alone.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct NewSnapshot {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub memory: Option<bool>,
}

/// A snapshot as `create_snapshot` and `list_snapshots` answer it: `Sandbox.create` takes
/// its id (or a name) as the template.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `GET /snapshots`'s query.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct SnapshotQuery {
    #[serde(default, rename = "sandboxID")]
    pub sandbox_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default, rename = "nextToken")]
    pub next_token: Option<String>,
}

/// Every error: the HTTP status again as `code` (E2B's JS SDK branches on it, not on the
/// status), and a message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Error {
    pub code: u16,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_takes_what_the_sdks_send() {
        let python = r#"{"templateID":"base","autoPause":false,"metadata":{},"envVars":{"A":"1"},"secure":true,"allow_internet_access":true}"#;
        let new: NewSandbox = serde_json::from_str(python).unwrap();
        assert_eq!((new.template_id.as_str(), new.timeout, new.allow_internet_access), ("base", None, Some(true)));
        assert_eq!(new.env_vars["A"], "1");
        let js: NewSandbox = serde_json::from_str(r#"{"templateID":"t","timeout":30}"#).unwrap();
        assert_eq!(js.timeout, Some(30));
    }

    #[test]
    fn a_list_query_reads_as_the_python_sdk_writes_it() {
        // metadata={"team": "a b", "k&": "v="}: each side quoted, then form-encoded again.
        let q = ListQuery::parse("metadata=team%3Da%2520b%26k%2526%3Dv%253D&state=running,paused&limit=2&nextToken=4");
        assert_eq!(q.metadata["team"], "a b");
        assert_eq!(q.metadata["k&"], "v=");
        assert_eq!(q.states, ["running", "paused"]);
        assert_eq!((q.limit, q.next_token.as_deref()), (Some(2), Some("4")));
    }

    #[test]
    fn a_metrics_line_reads_into_a_sample() {
        let m = Metric::parse("2 125 536870912 402653184 1048576 1000 4000\n", "t".into(), 1_700_000_000_123).unwrap();
        assert_eq!((m.cpu_count, m.cpu_used_pct, m.mem_used, m.disk_total), (2, 12.5, 134217728, 4000));
        assert_eq!(m.timestamp_unix, 1_700_000_000);
        assert!(Metric::parse("2 x", "t".into(), 0).is_none());
        let v = serde_json::to_value(&m).unwrap();
        assert!(v.get("cpuUsedPct").is_some() && v.get("timestampUnix").is_some() && v.get("memCache").is_some());
    }

    #[test]
    fn answers_use_e2bs_names() {
        let s = Sandbox {
            template_id: "base".into(),
            sandbox_id: "sbx_1".into(),
            client_id: "lizard".into(),
            envd_version: crate::ENVD_VERSION.into(),
            envd_access_token: None,
            traffic_access_token: None,
            domain: Some("sandbox.local.lizard.localhost".into()),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["sandboxID"], "sbx_1");
        assert_eq!(v["templateID"], "base");
        assert_eq!(v["envdVersion"], crate::ENVD_VERSION);
        assert!(v.get("envdAccessToken").is_none() && v.get("trafficAccessToken").is_none());
        assert_eq!(v["domain"], "sandbox.local.lizard.localhost");
    }

    #[test]
    fn a_network_names_what_it_asks_that_is_not_served() {
        let n: Network = serde_json::from_str(
            r#"{"allowPublicTraffic":false,"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"],"rules":{},"dnsServers":null}"#,
        )
        .unwrap();
        assert_eq!((n.allow_public_traffic, n.allow_out.len(), n.deny_out[0].as_str()), (Some(false), 1, ALL_TRAFFIC));
        assert_eq!(n.unserved(), None);
        let n: Network = serde_json::from_str(r#"{"egressProxy":{"address":"p:1080"}}"#).unwrap();
        assert_eq!(n.unserved(), Some("egressProxy"));
        let new: NewSandbox = serde_json::from_str(r#"{"templateID":"t","autoResume":{"enabled":true}}"#).unwrap();
        assert_eq!(new.auto_resume, Some(AutoResume { enabled: true }));
    }
}
