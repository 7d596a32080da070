//! `--workspace` / `--project`: which workspace a template, push or service command is
//! about.

use crate::client::Call;
use clap::Args;

/// Which workspace a template command is about.
#[derive(Args, Debug, Clone, Default)]
pub struct WorkspaceArgs {
    /// Workspace id, slug or name [default: the key's only workspace]
    #[arg(long)]
    pub workspace: Option<String>,
    /// A project (id, slug or name) whose workspace to use [default: $LIZARD_PROJECT]
    #[arg(long)]
    pub project: Option<String>,
}

impl WorkspaceArgs {
    /// `--workspace`, else `--project`, else `$LIZARD_PROJECT`.
    pub(crate) fn resolved(&self) -> (Option<String>, Option<String>) {
        if self.workspace.is_some() {
            return (self.workspace.clone(), None);
        }
        let project = self
            .project
            .clone()
            .or_else(|| std::env::var(crate::sandbox::PROJECT_ENV).ok())
            .filter(|p| !p.trim().is_empty());
        (None, project)
    }

    pub(crate) fn apply(&self, call: Call) -> Call {
        let (workspace, project) = self.resolved();
        call.param_opt("workspace", workspace).param_opt("project", project)
    }
}
