//! Arguments → requests, and which mode the environment selects; no network.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use clap::Parser;
use lizard_cli::client::Endpoint;
use lizard_cli::sandbox::{local_create_request, server_create_body, CreateArgs, SandboxCmd};
use lizard_cli::tenancy::{key_create_request, project_list_uri, workspace_delete_uri};
use lizard_cli::{server_client, Cli, Command};
use serde_json::json;
use std::path::Path;

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("lizard").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn create_args(args: &[&str]) -> CreateArgs {
    match parse(&[&["sandbox", "create"], args].concat()).command {
        Command::Sandbox(SandboxCmd::Create(a)) => a,
        other => panic!("{other:?}"),
    }
}

#[test]
fn server_create_body_carries_project_timeout_env_metadata() {
    let a = create_args(&[
        "base",
        "--project",
        "my-project",
        "--timeout-ms",
        "600000",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--metadata",
        "owner=me",
    ]);
    let body = server_create_body(&a, None).unwrap();
    assert_eq!(
        body,
        json!({
            "template": "base",
            "project": "my-project",
            "timeoutMs": 600000,
            "env": {"A": "1", "B": "x=y"},
            "metadata": {"owner": "me"},
        })
    );
    // Optional fields appear only when given.
    let a = create_args(&["code-interpreter-v1", "--vcpus", "2", "--memory-mib", "1024", "--lizard-token", "lz_k"]);
    assert_eq!(
        server_create_body(&a, Some("prj_1")).unwrap(),
        json!({"template": "code-interpreter-v1", "project": "prj_1", "vcpus": 2, "memoryMib": 1024, "lizardToken": "lz_k"})
    );
}

#[test]
fn project_comes_from_the_flag_then_lizard_project() {
    let with_flag = create_args(&["base", "--project", "flag"]);
    assert_eq!(server_create_body(&with_flag, Some("env")).unwrap()["project"], "flag", "the flag wins");
    let without = create_args(&["base"]);
    assert_eq!(server_create_body(&without, Some("env")).unwrap()["project"], "env");
    for env in [None, Some(""), Some("  ")] {
        let e = server_create_body(&without, env).unwrap_err().to_string();
        assert!(e.contains("--project") && e.contains("LIZARD_PROJECT"), "{e}");
    }
}

#[test]
fn local_create_refuses_server_only_flags() {
    let r = local_create_request(&create_args(&["base", "--vcpus", "2", "--env", "K=V"])).unwrap();
    assert_eq!((r.template.as_str(), r.vcpus, r.env.get("K").map(String::as_str)), ("base", Some(2), Some("V")));
    for flags in [&["--project", "p"][..], &["--timeout-ms", "5"], &["--lizard-token", "lz_x"]] {
        let e = local_create_request(&create_args(&[&["base"], flags].concat())).unwrap_err().to_string();
        assert!(e.contains(flags[0]) && e.contains("server mode"), "{e}");
    }
}

#[test]
fn mode_selection() {
    assert!(server_client(None, Some("k")).unwrap().is_none(), "no URL: local mode");
    assert!(server_client(Some(""), Some("k")).unwrap().is_none(), "an empty URL is no URL");
    let e = server_client(Some("http://127.0.0.1:7171"), None).unwrap_err().to_string();
    assert!(e.contains("no API key") && e.contains("LIZARD_API_KEY") && e.contains("--api-key"), "{e}");
    assert!(server_client(Some("http://127.0.0.1:7171"), Some(" ")).is_err(), "a blank key is no key");
    let e = server_client(Some("https://lizard.build"), Some("k")).unwrap_err().to_string();
    assert!(e.contains("https://") && e.contains("TLS termination"), "{e}");
    let c = server_client(Some("http://127.0.0.1:7171/"), Some("lz_k")).unwrap().unwrap();
    assert!(c.is_server());
    assert_eq!(c.api_key.as_deref(), Some("lz_k"));
    assert_eq!(
        c.endpoint,
        Endpoint::Tcp {
            authority: "127.0.0.1:7171".into(),
            base_path: "".into(),
            url: "http://127.0.0.1:7171/".into()
        }
    );
}

#[test]
fn global_flags_go_anywhere() {
    for args in [
        &["--json", "--api-url", "http://h:1", "--api-key", "k", "sandbox", "list"][..],
        &["sandbox", "list", "--json", "--api-url", "http://h:1", "--api-key", "k"],
        &["sandbox", "--api-key", "k", "list", "--api-url=http://h:1", "--json"],
    ] {
        let cli = parse(args);
        assert!(cli.json, "{args:?}");
        assert_eq!((cli.api_url.as_deref(), cli.api_key.as_deref()), (Some("http://h:1"), Some("k")), "{args:?}");
    }
    // The key's value never shows in help, even when it comes from the environment.
    let help = Cli::try_parse_from(["lizard", "--help"]).unwrap_err().to_string();
    assert!(help.contains("LIZARD_API_KEY") && help.contains("LIZARD_API_URL"), "{help}");
}

#[test]
fn tenancy_requests() {
    let unscoped = key_create_request("full", &[], &[]);
    assert_eq!(serde_json::to_value(&unscoped).unwrap(), json!({"name": "full"}));
    let scoped = key_create_request("u", &["ws_1".into(), "ws_2".into()], &[]);
    assert_eq!(serde_json::to_value(&scoped).unwrap(), json!({"name": "u", "workspaces": ["ws_1", "ws_2"]}));
    let both = key_create_request("u", &["ws_1".into()], &["prj_1".into()]);
    assert_eq!(
        serde_json::to_value(&both).unwrap(),
        json!({"name": "u", "workspaces": ["ws_1"], "projects": ["prj_1"]})
    );
    assert_eq!(project_list_uri(None).uri(), "/v1/projects");
    assert_eq!(project_list_uri(Some("ws 1&x")).uri(), "/v1/projects?workspaceId=ws%201%26x");
    assert_eq!(workspace_delete_uri("ws_1", false).uri(), "/v1/workspaces/ws_1");
    assert_eq!(workspace_delete_uri("ws_1", true).uri(), "/v1/workspaces/ws_1?force=true");

    match parse(&["key", "create", "k", "--workspace", "ws_1", "--workspace", "ws_2", "--project", "prj_1"]).command {
        Command::Key(lizard_cli::tenancy::KeyCmd::Create { name, workspaces, projects }) => {
            assert_eq!((name.as_str(), workspaces.len(), projects.len()), ("k", 2, 1))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(parse(&["api-key", "list"]).command, Command::Key(_)), "alias");
}

#[test]
fn server_flags_map_to_run_options() {
    let cli = parse(&[
        "--data-dir",
        "/d",
        "server",
        "--listen",
        "0.0.0.0:8080",
        "--proxy-listen",
        "0.0.0.0:8443",
        "--region",
        "eu-1",
        "--domain",
        "example.com",
        "--accel",
        "tcg",
    ]);
    let Command::Server(args) = cli.command else { panic!() };
    let o = lizard_cli::server::options(Path::new("/d"), &args).unwrap();
    assert_eq!(o.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(o.proxy_listen.map(|a| a.to_string()).as_deref(), Some("0.0.0.0:8443"));
    assert_eq!((o.server.region.as_str(), o.server.domain.as_str()), ("eu-1", "example.com"));
    assert_eq!(o.server.data_dir, Path::new("/d"));
    assert_eq!((o.node.data_dir.as_path(), o.node.image_root.as_path()), (Path::new("/d/server"), Path::new("/d")));
    assert_eq!(o.node.accel, Some(lizard_node::Accel::Tcg));

    let Command::Server(args) = parse(&["server"]).command else { panic!() };
    let o = lizard_cli::server::options(Path::new("/d"), &args).unwrap();
    assert_eq!(o.server.listen.to_string(), "127.0.0.1:7171");
    assert_eq!(o.server.billing, lizard_server::billing::BillingConfig::default(), "flag defaults are the config's");
    assert_eq!(o.proxy_listen.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:7172"));
    assert_eq!(o.server.region, "local");
    let Command::Server(args) = parse(&["server", "--no-proxy"]).command else { panic!() };
    assert_eq!(lizard_cli::server::options(Path::new("/d"), &args).unwrap().proxy_listen, None);
}

#[test]
fn metrics_and_log_flags() {
    let cli = parse(&["--log-format", "json", "server", "--metrics-listen", "127.0.0.1:9464"]);
    assert_eq!(cli.log_format, lizard_cli::LogFormat::Json);
    let Command::Server(args) = cli.command else { panic!() };
    let m = lizard_cli::server::options(Path::new("/d"), &args).unwrap().server.metrics.unwrap();
    assert_eq!((m.addr.to_string(), m.token), ("127.0.0.1:9464".into(), None));
    let Command::Server(args) = parse(&["server"]).command else { panic!() };
    assert_eq!(lizard_cli::server::options(Path::new("/d"), &args).unwrap().server.metrics, None, "off by default");
    assert_eq!(parse(&["server"]).log_format, lizard_cli::LogFormat::Text);
    // A token means nothing without the listener it guards.
    assert!(lizard_cli::Cli::try_parse_from(["lizard", "server", "--metrics-token", "t"]).is_err());
}

#[test]
fn billing_flags_map_to_the_billing_config() {
    let Command::Server(args) = parse(&[
        "server",
        "--vcpu-price",
        "3000",
        "--memory-price",
        "2048",
        "--paused-memory-price",
        "10",
        "--signup-credit",
        "0.25",
        "--billing-tick-ms",
        "1000",
        "--billing-grace",
        "7",
    ])
    .command
    else {
        panic!()
    };
    let b = lizard_cli::server::options(Path::new("/d"), &args).unwrap().server.billing;
    assert_eq!(b.pricing.running_rate(1, 512), 3000 + 1024);
    assert_eq!(b.pricing.paused_rate(1024), 10);
    assert_eq!(b.signup_credit_nanos, 250_000_000);
    assert_eq!((b.tick.as_millis(), b.grace.as_secs()), (1000, 7));
    for bad in
        [&["server", "--vcpu-price=-1"][..], &["server", "--volume-price=-5"], &["server", "--signup-credit", "1e3"]]
    {
        let Command::Server(args) = parse(bad).command else { panic!() };
        assert!(lizard_cli::server::options(Path::new("/d"), &args).is_err(), "{bad:?}");
    }
}

#[test]
fn billing_commands_parse() {
    use lizard_cli::billing::{metrics_uri, transactions_uri, BillingCmd, MetricsArgs};
    let c = parse(&["billing", "credit", "--account", "acc_1", "--amount", "25", "--idempotency-key", "k1"]);
    assert!(matches!(c.command, Command::Billing(BillingCmd::Credit { ref account, .. }) if account == "acc_1"));
    assert!(matches!(parse(&["billing", "live"]).command, Command::Billing(BillingCmd::Live)));
    assert_eq!(
        transactions_uri(10, Some("42"), true).uri(),
        "/v1/billing/transactions?limit=10&cursor=42&includeUsage=true"
    );
    assert_eq!(transactions_uri(50, None, false).uri(), "/v1/billing/transactions?limit=50");
    let m = MetricsArgs {
        workspace: Some("ws 1".into()),
        project: None,
        from: Some("2026-11-01T00:00:00Z".into()),
        to: None,
    };
    assert_eq!(metrics_uri(&m).uri(), "/v1/metrics?workspaceId=ws%201&from=2026-11-01T00%3A00%3A00Z");
    let Command::Metrics(m) = parse(&["metrics", "--project", "prj_1"]).command else { panic!() };
    assert_eq!(metrics_uri(&m).uri(), "/v1/metrics?projectId=prj_1");
}
