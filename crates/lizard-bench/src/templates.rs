//! Template pushes through the API, as `lizard push` makes them: a push with a cold cache
//! (every step runs), the same push with its last step changed (the others come from the
//! cache), push → first sandbox of the result, and what a pushed template adds on disk
//! over its base.

use crate::api::Bench;
use crate::ms;
use anyhow::{bail, ensure, Context as _, Result};
use lizard_api::routes;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// What [`Bench::template_pushes`] measured.
pub struct PushTimes {
    pub cold_ms: f64,
    pub one_changed_ms: f64,
    /// Steps the second push took from the cache, of all its steps.
    pub cached: (usize, usize),
    pub push_to_sandbox_ms: f64,
    /// Bytes of the pushed template's own layers.
    pub layer_mib: f64,
    /// Bytes the base template's image takes on disk.
    pub base_mib: f64,
}

/// The longest a bench build may take.
const BUILD_LIMIT: Duration = Duration::from_secs(1800);

const NAME: &str = "bench-app";

/// The recipe, with `marker` in its last step: an apt package, a copied directory, a run
/// step, env, and a web server started in the snapshot.
fn recipe(base: &str, marker: &str) -> String {
    format!(
        r#"name = "{NAME}"
from = "{base}"
[[steps]]
apt = ["jq"]
[[steps]]
copy = {{ src = "app", dest = "/srv/app" }}
[[steps]]
run = "jq --version > /srv/app/jq.txt"
[[steps]]
env = {{ APP = "bench" }}
[[steps]]
run = "echo {marker} > /srv/app/marker.txt"
[start]
cmd = "python3 -m http.server 8080 --directory /srv/app"
ready = {{ port = 8080 }}
"#
    )
}

impl Bench {
    /// Three pushes of one template (cold, last step changed, last step changed again and
    /// then a sandbox of it), and the sizes on disk.
    pub async fn template_pushes(&self, base: &str, base_image: &Path) -> Result<PushTimes> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("app"))?;
        std::fs::write(dir.path().join("app/index.html"), "<h1>bench</h1>\n")?;
        std::fs::write(dir.path().join("app/data.bin"), vec![7u8; 1 << 20])?;

        let (cold_ms, _) = self.push(dir.path(), &recipe(base, "one")).await?;
        let (one_changed_ms, build) = self.push(dir.path(), &recipe(base, "two")).await?;
        let steps = build["steps"].as_array().context("a build lists its steps")?;
        let cached = (steps.iter().filter(|s| s["cached"] == true).count(), steps.len());

        let started = Instant::now();
        self.push(dir.path(), &recipe(base, "three")).await?;
        let id = self.create(NAME).await?;
        let marker = self.exec(&id, "cat /srv/app/marker.txt").await?;
        let push_to_sandbox_ms = ms(started.elapsed());
        ensure!(marker.trim() == "three", "the sandbox runs an old build: {marker:?}");
        self.kill(&id).await?;

        let info = self.call_in_project(&routes::GET_TEMPLATE, &[NAME], None).await?;
        let layer_bytes = info["sizeBytes"].as_u64().context("a built template has a size")?;
        use std::os::unix::fs::MetadataExt;
        let base_bytes = std::fs::metadata(base_image)?.blocks() * 512;
        Ok(PushTimes {
            cold_ms,
            one_changed_ms,
            cached,
            push_to_sandbox_ms,
            layer_mib: mib(layer_bytes),
            base_mib: mib(base_bytes),
        })
    }

    /// One push of `dir` with `recipe_text` (upload what the server lacks, start the build,
    /// wait for it): its duration and the finished build.
    async fn push(&self, dir: &Path, recipe_text: &str) -> Result<(f64, Value)> {
        std::fs::write(dir.join(lizard_recipe::RECIPE_FILE), recipe_text)?;
        let started = Instant::now();
        let manifest = self.upload_dir(dir).await?;
        let body = json!({ "recipe": recipe_text, "files": manifest, "project": "bench" });
        let build = self.call(&routes::PUSH_TEMPLATE, &[], Some(body)).await?;
        let build_id = build["buildId"].as_str().context("a build id")?.to_string();
        loop {
            let build = self.call_in_project(&routes::GET_TEMPLATE_BUILD, &[NAME, &build_id], None).await?;
            match build["status"].as_str() {
                Some("ready") => return Ok((ms(started.elapsed()), build)),
                Some("failed" | "cancelled") => bail!("bench build failed: {}", build["error"]),
                _ if started.elapsed() > BUILD_LIMIT => bail!("bench build still running after {BUILD_LIMIT:?}"),
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Upload what the server lacks of `dir` (as `lizard push` does): its manifest.
    pub(crate) async fn upload_dir(&self, dir: &Path) -> Result<Vec<lizard_api::templates::ContextEntry>> {
        let context = lizard_recipe::Context::scan(dir, lizard_recipe::ContextLimits::default())?;
        let files: Vec<(String, std::path::PathBuf)> = context
            .entries
            .iter()
            .filter_map(|e| match &e.kind {
                lizard_recipe::EntryKind::File { sha256, .. } => Some((sha256.clone(), dir.join(&e.path))),
                _ => None,
            })
            .collect();
        let hashes: Vec<&str> = files.iter().map(|(h, _)| h.as_str()).collect();
        let missing =
            self.call_in_project(&routes::MISSING_TEMPLATE_BLOBS, &[], Some(json!({ "sha256": hashes }))).await?;
        for hash in missing["missing"].as_array().context("missing hashes")? {
            let hash = hash.as_str().context("a hash")?;
            let (_, path) = files.iter().find(|(h, _)| h == hash).context("the server asked for an unknown hash")?;
            self.upload(&routes::UPLOAD_TEMPLATE_BLOB, &[hash], std::fs::read(path)?).await?;
        }
        Ok(context.entries.iter().map(lizard_api::templates::ContextEntry::from).collect())
    }
}

fn mib(bytes: u64) -> f64 {
    // Sizes here are far below 2^52 bytes: exact in an f64.
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / f64::from(1u32 << 20)
}
