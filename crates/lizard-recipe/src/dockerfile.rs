//! The `Dockerfile` subset: what users already have, read into the same [`Recipe`] as
//! `lizard.template.toml`.
//!
//! | instruction | recipe |
//! |---|---|
//! | `FROM <lizard template>` | `from` (anything with `:`, `/` or `@` is a container image: refused, there is no registry; `AS name`: refused, there are no stages) |
//! | `RUN cmd` / `RUN ["a", "b"]` | `run` |
//! | `COPY [--chown=u:g] src… dest` | one `copy` per source |
//! | `ENV k=v …` / `ENV k v` | `env` |
//! | `WORKDIR dir` (relative to the previous one) | `workdir` |
//! | `USER name` | `user` |
//! | `CMD cmd` / `CMD ["a", "b"]` | `start.cmd` |
//! | `EXPOSE port` | `start.ready = { port }` when there is a `CMD` |
//!
//! Anything else is refused with its line number rather than ignored, so a build never
//! silently differs from what the file says.

use crate::recipe::{BuildVm, Copy, Ready, Recipe, RecipeError, Start, Step};
use std::collections::BTreeMap;

/// Reads a Dockerfile into a recipe named `name`.
pub fn parse(text: &str, name: &str) -> Result<Recipe, RecipeError> {
    let mut from: Option<String> = None;
    let mut steps = Vec::new();
    let mut workdir = String::from("/");
    let mut cmd: Option<String> = None;
    let mut port: Option<u16> = None;
    for (line, instruction) in logical_lines(text) {
        let err = |reason: String| RecipeError::Dockerfile { line, reason };
        let (keyword, rest) = instruction.split_once(char::is_whitespace).unwrap_or((instruction.as_str(), ""));
        let rest = rest.trim();
        let keyword = keyword.to_ascii_uppercase();
        if keyword != "FROM" && from.is_none() {
            return Err(err(format!("{keyword} before FROM")));
        }
        match keyword.as_str() {
            "FROM" => {
                if from.is_some() {
                    return Err(err("a second FROM: multi-stage builds are not supported".into()));
                }
                let words: Vec<&str> = rest.split_whitespace().collect();
                let image = match words.as_slice() {
                    [image] => *image,
                    // A stage name means stages to come, which this subset has not: a
                    // Dockerfile written for them would build something else.
                    [_, as_, stage] if as_.eq_ignore_ascii_case("as") => {
                        return Err(err(format!(
                            "FROM … AS {stage}: named stages belong to multi-stage builds, which are not supported"
                        )))
                    }
                    _ => return Err(err("FROM takes one template name".into())),
                };
                if image.starts_with("--") || image.contains([':', '/', '@']) || image == "scratch" {
                    return Err(err(format!(
                        "FROM {image}: a Lizard template is built from another Lizard template (e.g. FROM base); \
                         there is no container registry"
                    )));
                }
                from = Some(image.to_owned());
            }
            "RUN" => {
                if rest.starts_with("--") {
                    return Err(err("RUN options (--mount, --network, …) are not supported".into()));
                }
                steps.push(Step::Run(shell_or_exec(rest).map_err(err)?));
            }
            "COPY" => {
                let (owner, rest) = copy_flags(rest).map_err(err)?;
                let mut words = json_or_words(rest).map_err(err)?;
                if words.len() < 2 {
                    return Err(err("COPY takes at least a source and a destination".into()));
                }
                let dest = words.pop().unwrap_or_default();
                let dest = absolute(&workdir, &dest);
                if words.len() > 1 && !dest.ends_with('/') {
                    return Err(err("COPY with several sources needs a destination ending in '/'".into()));
                }
                for src in words {
                    steps.push(Step::Copy(Copy { src, dest: dest.clone(), owner: owner.clone() }));
                }
            }
            "ENV" => steps.push(Step::Env(env_pairs(rest).map_err(err)?)),
            "WORKDIR" => {
                if rest.is_empty() {
                    return Err(err("WORKDIR needs a directory".into()));
                }
                workdir = absolute(&workdir, rest);
                steps.push(Step::Workdir(workdir.clone()));
            }
            "USER" => steps.push(Step::User(rest.to_owned())),
            "CMD" => cmd = Some(shell_or_exec(rest).map_err(err)?),
            "EXPOSE" => {
                let first = rest.split_whitespace().next().unwrap_or_default();
                let number = first.strip_suffix("/tcp").unwrap_or(first);
                port = Some(number.parse().map_err(|_| err(format!("EXPOSE {first}: not a TCP port")))?);
            }
            "ADD" => return Err(err("ADD is not supported (no URLs or archives are fetched): use COPY".into())),
            "ENTRYPOINT" => return Err(err("ENTRYPOINT is not supported: use CMD".into())),
            other => {
                return Err(err(format!(
                    "{other} is not in Lizard's Dockerfile subset (FROM, RUN, COPY, ENV, WORKDIR, USER, CMD, EXPOSE)"
                )))
            }
        }
    }
    let from = from.ok_or(RecipeError::Dockerfile { line: 1, reason: "no FROM".into() })?;
    let start = cmd.map(|cmd| Start { cmd, ready: port.map_or(Ready::default(), Ready::Port), ready_timeout_s: 120 });
    let recipe = Recipe {
        name: name.to_owned(),
        description: String::new(),
        from: crate::recipe::Base::Template(from),
        build: BuildVm::default(),
        sandbox: crate::recipe::SandboxSize::default(),
        steps,
        env: BTreeMap::new(),
        start,
    };
    recipe.validate()?;
    Ok(recipe)
}

/// Instructions with their first line number: comments and blank lines dropped,
/// `\`-continued lines joined.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        let (body, continued) = match trimmed.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (trimmed, false),
        };
        let entry = current.get_or_insert_with(|| (i + 1, String::new()));
        if !entry.1.is_empty() && !body.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body);
        if !continued {
            out.extend(current.take());
        }
    }
    out.extend(current);
    out
}

/// The exec form `["a", "b c"]` as a shell command (each word quoted); else the text as is.
fn shell_or_exec(rest: &str) -> Result<String, String> {
    if rest.starts_with('[') {
        let words: Vec<String> = serde_json::from_str(rest).map_err(|e| format!("bad exec form: {e}"))?;
        shlex::try_join(words.iter().map(String::as_str)).map_err(|e| format!("bad exec form: {e}"))
    } else if rest.is_empty() {
        Err("a command is needed".into())
    } else {
        Ok(rest.to_owned())
    }
}

fn json_or_words(rest: &str) -> Result<Vec<String>, String> {
    if rest.starts_with('[') {
        serde_json::from_str(rest).map_err(|e| format!("bad JSON form: {e}"))
    } else {
        Ok(rest.split_whitespace().map(str::to_owned).collect())
    }
}

/// `--chown=user[:group]` (the only flag), and what follows it.
fn copy_flags(rest: &str) -> Result<(Option<String>, &str), String> {
    let mut owner = None;
    let mut rest = rest;
    while let Some(flag) = rest.strip_prefix("--") {
        let (flag, after) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
        match flag.split_once('=') {
            Some(("chown", value)) => owner = Some(value.to_owned()),
            _ => return Err(format!("COPY --{flag} is not supported (only --chown)")),
        }
        rest = after.trim_start();
    }
    Ok((owner, rest))
}

/// `ENV a=1 b="two words"` or the old `ENV a one value`.
fn env_pairs(rest: &str) -> Result<BTreeMap<String, String>, String> {
    let first = rest.split_whitespace().next().ok_or("ENV needs a variable")?;
    if !first.contains('=') {
        let value = rest[first.len()..].trim();
        return Ok(BTreeMap::from([(first.to_owned(), value.to_owned())]));
    }
    let words = shlex::split(rest).ok_or("ENV: unbalanced quotes")?;
    words
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
            None => Err(format!("ENV {w}: expected name=value")),
        })
        .collect()
}

/// `dir` against the current directory, as Docker resolves a relative WORKDIR or COPY
/// destination.
fn absolute(current: &str, dir: &str) -> String {
    if dir.starts_with('/') {
        dir.to_owned()
    } else {
        let trailing = if dir.ends_with('/') { "/" } else { "" };
        format!("{}/{}{trailing}", current.trim_end_matches('/'), dir.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKERFILE: &str = r#"
# the same template as the TOML below
FROM base
RUN apt-get update && \
    apt-get install -y jq
COPY --chown=user tools/ /opt/tools/
ENV TOOLS=/opt/tools MODE="two words"
WORKDIR /srv
WORKDIR app
USER user
RUN ["sh", "-c", "echo it's"]
EXPOSE 8080/tcp
CMD python3 -m http.server 8080
"#;

    const TWIN: &str = r#"
name = "web"
from = "base"
[[steps]]
run = "apt-get update && apt-get install -y jq"
[[steps]]
copy = { src = "tools/", dest = "/opt/tools/", owner = "user" }
[[steps]]
env = { TOOLS = "/opt/tools", MODE = "two words" }
[[steps]]
workdir = "/srv"
[[steps]]
workdir = "/srv/app"
[[steps]]
user = "user"
[[steps]]
run = "sh -c \"echo it's\""
[start]
cmd = "python3 -m http.server 8080"
ready = { port = 8080 }
"#;

    #[test]
    fn a_dockerfile_reads_as_its_toml_twin() {
        assert_eq!(parse(DOCKERFILE, "web").unwrap(), Recipe::from_toml(TWIN).unwrap());
    }

    #[test]
    fn several_sources_and_the_legacy_env_form() {
        let r = parse("FROM base\nCOPY a b /dst/\nENV GREETING hello world", "t").unwrap();
        assert_eq!(r.steps.len(), 3);
        assert_eq!(r.steps[1], Step::Copy(Copy { src: "b".into(), dest: "/dst/".into(), owner: None }));
        assert_eq!(r.steps[2], Step::Env(BTreeMap::from([("GREETING".into(), "hello world".into())])));
    }

    fn error(text: &str) -> String {
        parse(text, "t").unwrap_err().to_string()
    }

    #[test]
    fn what_is_outside_the_subset_is_refused_with_its_line() {
        for (text, want) in [
            ("FROM python:3.12", "line 1: FROM python:3.12: a Lizard template"),
            ("FROM docker.io/library/debian", "there is no container registry"),
            ("FROM scratch", "there is no container registry"),
            ("RUN true", "RUN before FROM"),
            ("FROM base\nFROM base", "line 2: a second FROM"),
            ("FROM base AS build", "line 1: FROM … AS build: named stages"),
            ("FROM base\n\nADD https://x/y /z", "line 3: ADD is not supported"),
            ("FROM base\nARG X=1", "ARG is not in Lizard's Dockerfile subset"),
            ("FROM base\nENTRYPOINT [\"x\"]", "use CMD"),
            ("FROM base\nCOPY --from=build /a /b", "COPY --from=build is not supported"),
            ("FROM base\nCOPY a b /dst", "ending in '/'"),
            ("FROM base\nCOPY ../secret /x", "copy.src"),
            ("FROM base\nRUN --mount=type=cache,target=/x true", "RUN options"),
            ("FROM base\nEXPOSE http", "not a TCP port"),
            ("FROM base\nRUN [\"unclosed\"", "bad exec form"),
            ("# only a comment", "no FROM"),
        ] {
            let e = error(text);
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
        }
    }
}
