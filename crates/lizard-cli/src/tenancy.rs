//! Server-mode commands: whoami, workspaces, projects, API keys, regions, volumes.
//!
//! Human output is decoded from [`lizard_api`]'s types; `--json` prints the server's answer
//! as it came, so fields a newer server adds are not lost.

use crate::client::{empty, json_body, ApiClient, Call};
use crate::output::{list_or_none, print_fields, print_json, text, Table};
use anyhow::{Context, Result};
use clap::Subcommand;
use lizard_api::routes;
use lizard_api::{
    ApiKey, CreateApiKeyRequest, CreateProjectRequest, CreateVolumeRequest, CreateWorkspaceRequest, CreatedApiKey,
    Project, Region, UpdateProjectRequest, Volume, WhoAmI, Workspace,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

#[derive(Subcommand, Debug)]
pub enum WorkspaceCmd {
    /// The workspaces the key sees.
    List,
    /// Create a workspace (unscoped keys only) and print its id.
    Create { name: String },
    /// Show a workspace by id, slug or name.
    Find { name_or_slug_or_id: String },
    /// Delete a workspace. Refused while any project, sandbox or volume remains in it.
    Delete {
        id: String,
        /// Delete everything in it too (projects, sandboxes, volumes), irreversibly.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ProjectCmd {
    /// The projects the key reaches.
    List {
        /// Only this workspace's projects (workspace id).
        #[arg(long, value_name = "ID")]
        workspace: Option<String>,
    },
    /// Show a project by id, slug or name.
    Get { id_or_slug_or_name: String },
    /// Create a project in a workspace and print its id.
    Create {
        /// The workspace's id.
        #[arg(long, value_name = "ID")]
        workspace: String,
        name: String,
    },
    /// Rename a project (its slug stays, so clients pinned to it keep working).
    Rename { id: String, name: String },
    /// Delete a project. Refused while sandboxes or volumes remain in it.
    Delete { id: String },
}

#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// The keys within this key's scope (never the secrets).
    List,
    /// Mint a key and print its secret, once. With neither --workspace nor --project the
    /// key is unscoped: full access to everything the account reaches.
    Create {
        name: String,
        /// Scope the key to this workspace id (repeatable).
        #[arg(long = "workspace", value_name = "ID")]
        workspaces: Vec<String>,
        /// Scope the key to this project id (repeatable).
        #[arg(long = "project", value_name = "ID")]
        projects: Vec<String>,
    },
    /// Revoke a key, at once.
    Delete { id: String },
}

#[derive(Subcommand, Debug)]
pub enum RegionCmd {
    /// The regions this server places sandboxes in.
    List,
}

#[derive(Subcommand, Debug)]
pub enum VolumeCmd {
    /// The volumes the key reaches (of one project with --project).
    List {
        /// Project id, slug or name [default: $LIZARD_PROJECT, else every project]
        #[arg(long)]
        project: Option<String>,
    },
    /// Create a volume in a project and print its id.
    Create {
        name: String,
        /// Project id, slug or name [default: $LIZARD_PROJECT]
        #[arg(long)]
        project: Option<String>,
        /// Size in GiB (1..=1024) [default: the server's, 10]
        #[arg(long)]
        size_gb: Option<u32>,
        /// Region to place it in [default: any]
        #[arg(long)]
        region: Option<String>,
    },
    /// Show a volume by name (in a project) or id.
    Get {
        name_or_id: String,
        /// Project id, slug or name [default: $LIZARD_PROJECT]
        #[arg(long)]
        project: Option<String>,
    },
    /// Delete a volume and its data. Refused while a sandbox has it mounted.
    Delete {
        name_or_id: String,
        /// Project id, slug or name [default: $LIZARD_PROJECT]
        #[arg(long)]
        project: Option<String>,
    },
}

/// `--project`, else `$LIZARD_PROJECT`.
fn volume_project(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var(crate::sandbox::PROJECT_ENV).ok()).filter(|p| !p.trim().is_empty())
}

/// `?project=…` or nothing.
pub fn with_project(call: Call, project: Option<&str>) -> Call {
    call.param_opt("project", project)
}

/// `POST /v1/api-keys` from `key create`'s flags: no flags, an unscoped key.
pub fn key_create_request(name: &str, workspaces: &[String], projects: &[String]) -> CreateApiKeyRequest {
    CreateApiKeyRequest {
        name: name.to_string(),
        workspaces: (!workspaces.is_empty()).then(|| workspaces.to_vec()),
        projects: (!projects.is_empty()).then(|| projects.to_vec()),
    }
}

/// `GET /v1/projects[?workspaceId=…]`.
pub fn project_list_uri(workspace: Option<&str>) -> Call {
    Call::new(&routes::LIST_PROJECTS, &[]).param_opt("workspaceId", workspace)
}

/// `DELETE /v1/workspaces/{id}[?force=true]`.
pub fn workspace_delete_uri(id: &str, force: bool) -> Call {
    Call::new(&routes::DELETE_WORKSPACE, &[id]).param_opt("force", force.then_some(true))
}

/// How a key's scope reads.
pub fn scope_text(workspaces: Option<&[String]>, projects: Option<&[String]>) -> String {
    match (workspaces, projects) {
        (None, None) => "unscoped (everything the account reaches)".into(),
        (w, p) => format!(
            "workspaces: {}; projects: {}",
            list_or_none(w.unwrap_or_default()),
            list_or_none(p.unwrap_or_default())
        ),
    }
}

fn short_scope(k: &ApiKey) -> String {
    match (&k.workspaces, &k.projects) {
        (None, None) => "unscoped".into(),
        (w, p) => {
            let mut parts = Vec::new();
            if let Some(w) = w.as_ref().filter(|w| !w.is_empty()) {
                parts.push(format!("ws:{}", w.join(",")));
            }
            if let Some(p) = p.as_ref().filter(|p| !p.is_empty()) {
                parts.push(format!("prj:{}", p.join(",")));
            }
            parts.join(" ")
        }
    }
}

fn decode<T: DeserializeOwned>(v: &Value) -> Result<T> {
    serde_json::from_value(v.clone()).context("decode the server's answer")
}

pub async fn whoami(api: &ApiClient, json: bool) -> Result<()> {
    let v: Value = api.json(&Call::new(&routes::WHOAMI, &[]), empty()).await?;
    if json {
        return print_json(&v);
    }
    let me: WhoAmI = decode(&v)?;
    let scope = if me.scoped {
        scope_text(Some(me.workspaces.as_deref().unwrap_or_default()), Some(me.projects.as_deref().unwrap_or_default()))
    } else {
        scope_text(None, None)
    };
    print_fields(&[
        ("account", me.account_id),
        ("key", format!("{} ({})", me.key_id, me.key_name)),
        ("email", me.email.unwrap_or_default()),
        ("plan", me.plan.unwrap_or_default()),
        ("scope", scope),
    ]);
    Ok(())
}

fn workspace_fields(w: Workspace) -> Vec<(&'static str, String)> {
    vec![("id", w.id), ("name", w.name), ("slug", w.slug), ("created", w.created_at)]
}

pub async fn workspace(api: &ApiClient, cmd: WorkspaceCmd, json: bool) -> Result<()> {
    match cmd {
        WorkspaceCmd::List => {
            let v: Value = api.json(&Call::new(&routes::LIST_WORKSPACES, &[]), empty()).await?;
            if json {
                return print_json(&v);
            }
            let mut t = Table::new(&["ID", "NAME", "SLUG", "CREATED"]);
            for w in decode::<Vec<Workspace>>(&v)? {
                t.row(vec![w.id, w.name, w.slug, w.created_at]);
            }
            t.print();
        }
        WorkspaceCmd::Create { name } => {
            let v: Value = api
                .json(&Call::new(&routes::CREATE_WORKSPACE, &[]), json_body(&CreateWorkspaceRequest { name }))
                .await?;
            if json {
                return print_json(&v);
            }
            println!("{}", text(&v, "id"));
        }
        WorkspaceCmd::Find { name_or_slug_or_id } => {
            let v: Value = api.json(&Call::new(&routes::FIND_WORKSPACE, &[&name_or_slug_or_id]), empty()).await?;
            if json {
                return print_json(&v);
            }
            print_fields(&workspace_fields(decode(&v)?));
        }
        WorkspaceCmd::Delete { id, force } => {
            api.send(&workspace_delete_uri(&id, force), empty()).await?;
            if force {
                eprintln!("deleted workspace {id} and everything in it");
            } else {
                eprintln!("deleted workspace {id}");
            }
        }
    }
    Ok(())
}

fn project_fields(p: Project) -> Vec<(&'static str, String)> {
    vec![("id", p.id), ("name", p.name), ("slug", p.slug), ("workspace", p.workspace_id), ("created", p.created_at)]
}

pub async fn project(api: &ApiClient, cmd: ProjectCmd, json: bool) -> Result<()> {
    match cmd {
        ProjectCmd::List { workspace } => {
            let v: Value = api.json(&project_list_uri(workspace.as_deref()), empty()).await?;
            if json {
                return print_json(&v);
            }
            let mut t = Table::new(&["ID", "NAME", "SLUG", "WORKSPACE", "CREATED"]);
            for p in decode::<Vec<Project>>(&v)? {
                t.row(vec![p.id, p.name, p.slug, p.workspace_id, p.created_at]);
            }
            t.print();
        }
        ProjectCmd::Get { id_or_slug_or_name } => {
            let v: Value = api.json(&Call::new(&routes::GET_PROJECT, &[&id_or_slug_or_name]), empty()).await?;
            if json {
                return print_json(&v);
            }
            print_fields(&project_fields(decode(&v)?));
        }
        ProjectCmd::Create { workspace, name } => {
            let req = CreateProjectRequest { workspace_id: workspace, name };
            let v: Value = api.json(&Call::new(&routes::CREATE_PROJECT, &[]), json_body(&req)).await?;
            if json {
                return print_json(&v);
            }
            println!("{}", text(&v, "id"));
        }
        ProjectCmd::Rename { id, name } => {
            let v: Value = api
                .json(&Call::new(&routes::RENAME_PROJECT, &[&id]), json_body(&UpdateProjectRequest { name }))
                .await?;
            if json {
                return print_json(&v);
            }
            print_fields(&project_fields(decode(&v)?));
        }
        ProjectCmd::Delete { id } => {
            api.send(&Call::new(&routes::DELETE_PROJECT, &[&id]), empty()).await?;
            eprintln!("deleted project {id}");
        }
    }
    Ok(())
}

pub async fn key(api: &ApiClient, cmd: KeyCmd, json: bool) -> Result<()> {
    match cmd {
        KeyCmd::List => {
            let v: Value = api.json(&Call::new(&routes::LIST_API_KEYS, &[]), empty()).await?;
            if json {
                return print_json(&v);
            }
            let mut t = Table::new(&["ID", "NAME", "PREFIX", "SCOPE", "CREATED"]);
            for k in decode::<Vec<ApiKey>>(&v)? {
                let scope = short_scope(&k);
                t.row(vec![k.id, k.name, k.prefix, scope, k.created_at]);
            }
            t.print();
        }
        KeyCmd::Create { name, workspaces, projects } => {
            let req = key_create_request(&name, &workspaces, &projects);
            let v: Value = api.json(&Call::new(&routes::CREATE_API_KEY, &[]), json_body(&req)).await?;
            if json {
                return print_json(&v);
            }
            let k: CreatedApiKey = decode(&v)?;
            eprintln!(
                "Created API key {} ({}), scope: {}.",
                k.id,
                k.name,
                scope_text(k.workspaces.as_deref(), k.projects.as_deref())
            );
            if k.workspaces.is_none() && k.projects.is_none() {
                eprintln!("warning: this key is unscoped: it has full access to the account.");
            }
            eprintln!("This is the only time the secret is shown (the server keeps only its hash). Store it now:");
            println!("LIZARD_API_KEY={}", k.key);
        }
        KeyCmd::Delete { id } => {
            api.send(&Call::new(&routes::DELETE_API_KEY, &[&id]), empty()).await?;
            eprintln!("revoked API key {id}");
        }
    }
    Ok(())
}

pub async fn region(api: &ApiClient, cmd: RegionCmd, json: bool) -> Result<()> {
    match cmd {
        RegionCmd::List => {
            let v: Value = api.json(&Call::new(&routes::LIST_REGIONS, &[]), empty()).await?;
            if json {
                return print_json(&v);
            }
            let mut t = Table::new(&["ID", "NAME", "SANDBOX_DOMAIN"]);
            for r in decode::<Vec<Region>>(&v)? {
                t.row(vec![r.id, r.name, r.sandbox_domain]);
            }
            t.print();
        }
    }
    Ok(())
}

fn volume_fields(v: &Volume) -> Vec<(&'static str, String)> {
    vec![
        ("id", v.id.clone()),
        ("name", v.name.clone()),
        ("project", v.project_id.clone()),
        ("size_gb", v.size_gb.to_string()),
        ("region", v.region.clone()),
        ("attached_to", v.attached_to.clone().unwrap_or_else(|| "-".into())),
        ("created", v.created_at.clone()),
    ]
}

pub async fn volume(api: &ApiClient, cmd: VolumeCmd, json: bool) -> Result<()> {
    match cmd {
        VolumeCmd::List { project } => {
            let call = with_project(Call::new(&routes::LIST_VOLUMES, &[]), volume_project(project).as_deref());
            let v: Value = api.json(&call, empty()).await?;
            if json {
                return print_json(&v);
            }
            let mut t = Table::new(&["ID", "NAME", "SIZE_GB", "REGION", "PROJECT", "ATTACHED_TO", "CREATED"]);
            for v in decode::<Vec<Volume>>(&v)? {
                let attached = v.attached_to.unwrap_or_else(|| "-".into());
                t.row(vec![v.id, v.name, v.size_gb.to_string(), v.region, v.project_id, attached, v.created_at]);
            }
            t.print();
        }
        VolumeCmd::Create { name, project, size_gb, region } => {
            let project = volume_project(project);
            let req = CreateVolumeRequest { name, project, project_id: None, size_gb, region };
            let v: Value = api.json(&Call::new(&routes::CREATE_VOLUME, &[]), json_body(&req)).await?;
            if json {
                return print_json(&v);
            }
            println!("{}", text(&v, "id"));
        }
        VolumeCmd::Get { name_or_id, project } => {
            let call = with_project(Call::new(&routes::GET_VOLUME, &[&name_or_id]), volume_project(project).as_deref());
            let v: Value = api.json(&call, empty()).await?;
            if json {
                return print_json(&v);
            }
            print_fields(&volume_fields(&decode(&v)?));
        }
        VolumeCmd::Delete { name_or_id, project } => {
            let call =
                with_project(Call::new(&routes::DELETE_VOLUME, &[&name_or_id]), volume_project(project).as_deref());
            api.send(&call, empty()).await?;
            eprintln!("deleted volume {name_or_id}");
        }
    }
    Ok(())
}
