//! Template recipes: the one format every template is described in, built-in or pushed.
//!
//! A recipe names a base (a Lizard template, or a Debian suite for a template from scratch),
//! ordered steps (apt, pip, npm, run, copy, env, workdir, user), the VM the build runs in and
//! an optional start command with a readiness check. It is written as `lizard.template.toml`
//! ([`recipe`]) or as a `Dockerfile` subset ([`dockerfile`]); both give the same [`Recipe`].
//! A push sends a directory, the build context ([`context`]); each step's result is a layer
//! whose cache key ([`layers`]) covers its parent, the step and the content of its inputs,
//! so an unchanged prefix of steps is never rebuilt.
//!
//! Nothing here runs anything: [`actions`] says what each step runs, and the builder runs
//! it inside a microVM.

pub mod actions;
pub mod context;
pub mod dockerfile;
pub mod layers;
pub mod recipe;

pub use actions::{Action, BuildState, Command, StartSpec};
pub use context::{Context, ContextError, ContextLimits, Entry, EntryKind};
pub use layers::{plan, LayerPlan, PlannedLayer};
pub use recipe::{
    Base, BuildVm, Copy, DebianBase, Ready, Recipe, RecipeError, SandboxSize, Start, Step, TemplateConfig,
};

/// The recipe file a pushed directory is read from, before a `Dockerfile`.
pub const RECIPE_FILE: &str = "lizard.template.toml";
/// The Dockerfile a pushed directory without [`RECIPE_FILE`] is read from.
pub const DOCKERFILE: &str = "Dockerfile";

/// Reads the recipe of a directory: `lizard.template.toml`, else a `Dockerfile` (whose
/// template takes `name`, as a Dockerfile has none).
pub fn load_dir(dir: &std::path::Path, name: Option<&str>) -> Result<Recipe, LoadError> {
    let toml_path = dir.join(RECIPE_FILE);
    let docker_path = dir.join(DOCKERFILE);
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|cause| LoadError::Read { file: file_name(path), cause })
    };
    if toml_path.is_file() {
        let mut recipe = Recipe::from_toml(&read(&toml_path)?)?;
        if let Some(name) = name {
            recipe.name = name.to_owned();
            recipe.validate()?;
        }
        Ok(recipe)
    } else if docker_path.is_file() {
        let name = name.ok_or(LoadError::DockerfileNeedsName)?;
        Ok(dockerfile::parse(&read(&docker_path)?, name)?)
    } else {
        Err(LoadError::NoRecipe)
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Why a directory's recipe could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the directory has neither {RECIPE_FILE} nor {DOCKERFILE}")]
    NoRecipe,
    #[error("a template built from a Dockerfile needs a name (a Dockerfile has none)")]
    DockerfileNeedsName,
    #[error("cannot read {file}: {cause}")]
    Read { file: String, cause: std::io::Error },
    #[error(transparent)]
    Recipe(#[from] RecipeError),
}
