//! Templates and builds as the API shows them.

use crate::builds::Progress;
use lizard_api::ids;
use lizard_api::templates::{TemplateBuildInfo, TemplateInfo};
use lizard_node_client::BuiltinTemplate;
use lizard_store::{BuildRecord, TemplateRecord};

/// A build as the API shows it; `live` is the progress of one in flight.
pub fn build_info(build: &BuildRecord, live: Option<Progress>) -> TemplateBuildInfo {
    let (steps, log) = match live {
        Some(p) if !build.status.is_final() => (p.steps, p.log),
        _ => (build.steps.clone(), build.log.clone()),
    };
    TemplateBuildInfo {
        build_id: build.id.clone(),
        template: build.template_name.clone(),
        status: build.status,
        steps,
        error: build.error.clone(),
        created_at: ids::rfc3339(build.created_at),
        finished_at: build.finished_at.map(ids::rfc3339),
        log,
    }
}

/// A pushed template as the API shows it.
pub fn template_info(t: &TemplateRecord) -> TemplateInfo {
    TemplateInfo {
        name: t.name.clone(),
        description: t.description.clone(),
        builtin: false,
        workspace_id: Some(t.workspace_id.clone()),
        from: Some(t.base.clone()),
        ready: t.current_build_id.is_some(),
        build_id: t.current_build_id.clone(),
        latest_build_id: t.latest_build_id.clone(),
        start_cmd: t.start_cmd.clone(),
        size_bytes: t.layer_bytes,
        created_at: Some(ids::rfc3339(t.created_at)),
        updated_at: Some(ids::rfc3339(t.updated_at)),
    }
}

/// A built-in template as the API shows it.
pub fn builtin_info(b: &BuiltinTemplate) -> TemplateInfo {
    TemplateInfo {
        name: b.name.clone(),
        description: b.description.clone(),
        builtin: true,
        workspace_id: None,
        from: None,
        ready: true,
        build_id: None,
        latest_build_id: None,
        start_cmd: None,
        size_bytes: None,
        created_at: None,
        updated_at: None,
    }
}
