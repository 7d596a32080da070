//! What this process keeps between the calls of an E2B template build (requested builds,
//! uploaded file sets, upload grants, each started build's step origins): bounded, and
//! forgotten after a while.

use lizard_api::templates::ContextEntry;
use lizard_store::WorkspaceRecord;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

/// How many uploaded file sets are remembered (oldest forgotten first: the SDK uploads
/// again).
const FILE_SETS_KEPT: usize = 4096;

/// What this process keeps between the calls of a build.
#[derive(Default)]
pub struct Pending {
    pub(super) requested: Mutex<HashMap<String, Requested>>,
    pub(super) files: Mutex<FileSets>,
    /// Each started build's steps' E2B instructions (see [`crate::template_steps::Translated`]).
    pub(super) origins: Mutex<HashMap<String, Vec<u32>>>,
    /// Upload tokens, each good for one upload of one file set into one workspace.
    pub(super) uploads: Mutex<HashMap<String, UploadGrant>>,
}

pub(super) struct UploadGrant {
    pub(super) account_id: String,
    pub(super) workspace_id: String,
    pub(super) hash: String,
    pub(super) until: Instant,
}

pub(super) struct Requested {
    pub(super) account_id: String,
    pub(super) workspace: WorkspaceRecord,
    pub(super) name: String,
    pub(super) size: lizard_recipe::recipe::SandboxSize,
    /// What the build is tagged with once ready.
    pub(super) tags: Vec<String>,
    pub(super) at: Instant,
}

/// Uploaded file sets by (workspace, files hash): their manifest, paths under
/// [`crate::template_steps::files_dir`].
#[derive(Default)]
pub(super) struct FileSets {
    pub(super) sets: HashMap<(String, String), Vec<ContextEntry>>,
    order: VecDeque<(String, String)>,
}

impl FileSets {
    pub(super) fn insert(&mut self, key: (String, String), entries: Vec<ContextEntry>) {
        if self.sets.insert(key.clone(), entries).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > FILE_SETS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.sets.remove(&old);
            }
        }
    }
}
