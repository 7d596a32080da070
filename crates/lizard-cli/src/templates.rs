//! `lizard template …`: the built-in templates and the workspaces' pushed ones, their
//! builds (status, steps, output; followed live with `--follow`), cancel and delete.

use crate::client::{empty, ApiClient, Call};
use crate::follow::{follow, print_failure};
use crate::output::{print_fields, print_json, Table};
use crate::workspace_args::WorkspaceArgs;
use anyhow::{anyhow, Result};
use clap::Subcommand;
use lizard_api::routes;
use lizard_api::templates::{TemplateBuildInfo, TemplateInfo};
use std::collections::VecDeque;

#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// The built-in templates and your workspaces' own.
    List {
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Show a template.
    Get {
        name: String,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// A build's status, steps and output (the template's newest build by default).
    Logs {
        name: String,
        /// The build [default: the newest]
        #[arg(long)]
        build: Option<String>,
        /// Follow the build until it ends
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Delete a pushed template. Refused while sandboxes use it.
    Delete {
        name: String,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Cancel a queued or running build (the template's newest by default).
    Cancel {
        name: String,
        /// The build [default: the newest]
        #[arg(long)]
        build: Option<String>,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
}

fn template_fields(t: &TemplateInfo) -> Vec<(&'static str, String)> {
    vec![
        ("name", t.name.clone()),
        ("description", t.description.clone()),
        ("builtin", t.builtin.to_string()),
        ("workspace", t.workspace_id.clone().unwrap_or_default()),
        ("from", t.from.clone().unwrap_or_default()),
        ("ready", t.ready.to_string()),
        ("build", t.build_id.clone().unwrap_or_default()),
        ("latest build", t.latest_build_id.clone().unwrap_or_default()),
        ("start", t.start_cmd.clone().unwrap_or_default()),
        ("size", t.size_bytes.map(|b| indicatif::HumanBytes(b).to_string()).unwrap_or_default()),
        ("created", t.created_at.clone().unwrap_or_default()),
        ("updated", t.updated_at.clone().unwrap_or_default()),
    ]
}

/// The build `build`, else the template's newest.
async fn build_or_latest(api: &ApiClient, ws: &WorkspaceArgs, name: &str, build: Option<String>) -> Result<String> {
    if let Some(b) = build {
        return Ok(b);
    }
    let t: TemplateInfo = api.json(&ws.apply(Call::new(&routes::GET_TEMPLATE, &[name])), empty()).await?;
    t.latest_build_id.ok_or_else(|| anyhow!("template {name} has no builds"))
}

fn print_build(b: &TemplateBuildInfo) {
    print_fields(&[
        ("build", b.build_id.clone()),
        ("template", b.template.clone()),
        ("status", format!("{:?}", b.status).to_lowercase()),
        ("created", b.created_at.clone()),
        ("finished", b.finished_at.clone().unwrap_or_default()),
    ]);
    for s in &b.steps {
        let cached = if s.cached { " (cached)" } else { "" };
        let took = s.duration_ms.map(|ms| format!(" {:.1}s", ms as f64 / 1000.0)).unwrap_or_default();
        println!("  [{}] {:?} {}{cached}{took}", s.index, s.status, s.description);
    }
    if let Some(f) = &b.error {
        print_failure(f, &VecDeque::new());
    }
    if !b.log.is_empty() {
        println!("--- output ---");
        print!("{}", b.log);
    }
}

/// `lizard template …`: returns the exit status.
pub async fn run(api: &ApiClient, cmd: TemplateCmd, json: bool) -> Result<i32> {
    match cmd {
        TemplateCmd::List { workspace } => {
            let list: Vec<TemplateInfo> =
                api.json(&workspace.apply(Call::new(&routes::LIST_TEMPLATES, &[])), empty()).await?;
            if json {
                print_json(&list)?;
                return Ok(0);
            }
            let mut t = Table::new(&["NAME", "WORKSPACE", "READY", "FROM", "SIZE", "DESCRIPTION"]);
            for x in list {
                let owner = if x.builtin { "(built-in)".into() } else { x.workspace_id.unwrap_or_default() };
                let size = x.size_bytes.map(|b| indicatif::HumanBytes(b).to_string()).unwrap_or_else(|| "-".into());
                t.row(vec![
                    x.name,
                    owner,
                    x.ready.to_string(),
                    x.from.unwrap_or_else(|| "-".into()),
                    size,
                    x.description,
                ]);
            }
            t.print();
        }
        TemplateCmd::Get { name, workspace } => {
            let t: TemplateInfo =
                api.json(&workspace.apply(Call::new(&routes::GET_TEMPLATE, &[&name])), empty()).await?;
            if json {
                print_json(&t)?;
            } else {
                print_fields(&template_fields(&t));
            }
        }
        TemplateCmd::Logs { name, build, follow: true, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            return follow(api, &workspace, &name, &build, true, json, true).await;
        }
        TemplateCmd::Logs { name, build, follow: false, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            let call = workspace.apply(Call::new(&routes::GET_TEMPLATE_BUILD, &[&name, &build]));
            let b: TemplateBuildInfo = api.json(&call, empty()).await?;
            if json {
                print_json(&b)?;
            } else {
                print_build(&b);
            }
        }
        TemplateCmd::Delete { name, workspace } => {
            api.send(&workspace.apply(Call::new(&routes::DELETE_TEMPLATE, &[&name])), empty()).await?;
            eprintln!("deleted template {name}");
        }
        TemplateCmd::Cancel { name, build, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            api.send(&workspace.apply(Call::new(&routes::CANCEL_TEMPLATE_BUILD, &[&name, &build])), empty()).await?;
            eprintln!("cancelling build {build} of {name}");
        }
    }
    Ok(0)
}
