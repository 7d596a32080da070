//! What each step does inside the build VM: the exact command lines, as argv (a package
//! spec or a path is never spliced into a shell string), and the state (`env`, `workdir`,
//! `user`) that `run` steps and the template's sandboxes inherit.
//!
//! Package steps run as root whatever the current user is: they install system-wide, which
//! only root may do, and a recipe should not need a `user root` around each of them.

use crate::recipe::{Copy, Ready, Start, Step, TemplateConfig};
use std::collections::BTreeMap;

/// One command in the build VM (serializable: a built template stores its start command).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Command {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub user: String,
}

/// A template's start command as it runs in every sandbox of it, and when it counts as
/// running (stored with a finished template).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartSpec {
    pub command: Command,
    pub ready: Ready,
    pub ready_timeout_s: u32,
}

/// What a step asks of the build VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Exec(Command),
    /// Copy these context paths (see [`crate::Context::select`]) to `dest`, owned by `owner`.
    Copy(Copy),
    /// Only the build state changed (`env`, `workdir`, `user`): the disk is the parent's.
    State,
}

/// The state the steps run in, as they change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildState {
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub user: String,
}

impl BuildState {
    /// The state a build starts in over a base whose sandboxes start with `base`.
    pub fn new(base: &TemplateConfig) -> BuildState {
        BuildState {
            env: base.env.clone(),
            cwd: base.workdir.clone().unwrap_or_else(|| "/".into()),
            user: base.user.clone().unwrap_or_else(|| "root".into()),
        }
    }

    /// The action of `step`, updating the state for the steps after it.
    pub fn apply(&mut self, step: &Step) -> Action {
        let as_root = |argv: Vec<String>, env: &[(&str, &str)]| {
            let mut all = self.env.clone();
            all.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            Action::Exec(Command { argv, env: all, cwd: "/".into(), user: "root".into() })
        };
        let with = |head: &[&str], items: &[String]| -> Vec<String> {
            head.iter().map(|s| (*s).to_owned()).chain(items.iter().cloned()).collect()
        };
        match step {
            // `"$@"` keeps each package one argument; the leading `apt` is `$0`.
            Step::Apt(packages) => as_root(
                with(
                    &[
                        "sh",
                        "-c",
                        "apt-get update -q && apt-get install -y -q --no-install-recommends \"$@\" \
                         && apt-get clean && rm -rf /var/lib/apt/lists/*",
                        "apt",
                    ],
                    packages,
                ),
                &[("DEBIAN_FRONTEND", "noninteractive")],
            ),
            Step::Pip(specs) => as_root(
                with(&["python3", "-m", "pip", "install", "--no-cache-dir", "--root-user-action=ignore"], specs),
                &[("PIP_DISABLE_PIP_VERSION_CHECK", "1")],
            ),
            Step::Npm(specs) => as_root(with(&["npm", "install", "--global", "--no-fund", "--no-audit"], specs), &[]),
            Step::Run(cmd) => Action::Exec(Command {
                argv: vec!["sh".into(), "-c".into(), cmd.clone()],
                env: self.env.clone(),
                cwd: self.cwd.clone(),
                user: self.user.clone(),
            }),
            Step::Copy(copy) => Action::Copy(copy.clone()),
            Step::Env(vars) => {
                self.env.extend(vars.clone());
                Action::State
            }
            Step::Workdir(dir) => {
                self.cwd = dir.clone();
                Action::State
            }
            Step::User(user) => {
                self.user = user.clone();
                Action::State
            }
        }
    }

    /// The start command's process, in the state after every step (and the recipe's `[env]`).
    pub fn start(&self, cmd: &str, recipe_env: &BTreeMap<String, String>) -> Command {
        let mut env = self.env.clone();
        env.extend(recipe_env.clone());
        Command {
            argv: vec!["sh".into(), "-c".into(), cmd.to_owned()],
            env,
            cwd: self.cwd.clone(),
            user: self.user.clone(),
        }
    }

    /// The recipe's `[start]` as it runs after the steps that led to this state.
    pub fn start_spec(&self, start: &Start, recipe_env: &BTreeMap<String, String>) -> StartSpec {
        StartSpec {
            command: self.start(&start.cmd, recipe_env),
            ready: start.ready.clone(),
            ready_timeout_s: start.ready_timeout_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Recipe;

    #[test]
    fn packages_are_arguments_never_shell_text() {
        let mut state = BuildState::new(&TemplateConfig::default());
        let Action::Exec(apt) = state.apply(&Step::Apt(vec!["jq".into(), "ripgrep=14.1.1-1".into()])) else {
            panic!("apt is a command")
        };
        assert_eq!(apt.argv[..2], ["sh", "-c"]);
        assert!(!apt.argv[2].contains("jq"), "the package list is not in the script");
        assert_eq!(apt.argv[3..], ["apt", "jq", "ripgrep=14.1.1-1"]);
        assert_eq!(apt.env.get("DEBIAN_FRONTEND").map(String::as_str), Some("noninteractive"));
        let Action::Exec(pip) = state.apply(&Step::Pip(vec!["requests==2.32.3".into()])) else { panic!() };
        assert_eq!(pip.argv.last().map(String::as_str), Some("requests==2.32.3"));
        assert_eq!(pip.argv[..4], ["python3", "-m", "pip", "install"]);
    }

    #[test]
    fn run_steps_inherit_env_workdir_and_user_but_packages_run_as_root() {
        let recipe = Recipe::from_toml(
            r#"
            name = "t"
            from = "base"
            [[steps]]
            env = { A = "1" }
            [[steps]]
            workdir = "/srv"
            [[steps]]
            user = "user"
            [[steps]]
            run = "make"
            [[steps]]
            npm = ["typescript@5"]
            [env]
            B = "2"
            [start]
            cmd = "serve"
            "#,
        )
        .unwrap();
        let base = TemplateConfig { env: BTreeMap::from([("BASE".into(), "x".into())]), ..Default::default() };
        let mut state = BuildState::new(&base);
        let actions: Vec<Action> = recipe.steps.iter().map(|s| state.apply(s)).collect();
        assert_eq!(actions[..3], [Action::State, Action::State, Action::State]);
        let Action::Exec(run) = &actions[3] else { panic!() };
        assert_eq!((run.cwd.as_str(), run.user.as_str()), ("/srv", "user"));
        assert_eq!(run.env.keys().collect::<Vec<_>>(), ["A", "BASE"]);
        let Action::Exec(npm) = &actions[4] else { panic!() };
        assert_eq!(npm.user, "root");
        let start = state.start(&recipe.start.as_ref().unwrap().cmd, &recipe.env);
        assert_eq!(start.argv, ["sh", "-c", "serve"]);
        assert_eq!(start.env.keys().collect::<Vec<_>>(), ["A", "B", "BASE"]);
        assert_eq!((start.cwd.as_str(), start.user.as_str()), ("/srv", "user"));
    }
}
