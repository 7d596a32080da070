//! The node's volumes: making and deleting their disks, and which sandbox holds each
//! (one writer per volume).

use super::Node;
use crate::{volumes, NodeError, Result};
use std::path::PathBuf;

impl Node {
    /// Make the disk of a new volume on this node (see [`crate::volumes`]).
    pub async fn create_volume(&self, id: &str, size_gb: u32) -> Result<()> {
        volumes::create(&self.volumes_dir(), id, size_gb).await.map(drop)
    }

    /// Delete a volume's disk. Conflict while a sandbox of this node holds it.
    pub fn delete_volume(&self, id: &str) -> Result<()> {
        let holders = self.holders();
        if let Some(holder) = holders.get(id) {
            return Err(NodeError::VolumeInUse { volume: id.to_string(), holder: holder.clone() });
        }
        volumes::delete(&self.volumes_dir(), id)
    }

    /// The sandbox that holds volume `id` on this node, if any.
    pub fn volume_holder(&self, id: &str) -> Option<String> {
        self.holders().get(id).cloned()
    }

    /// Reserve volume `volume` for sandbox `id`: its image path, or Conflict naming the
    /// holder, or InvalidArgument when this node has no such volume.
    pub(super) fn claim_volume(&self, volume: &str, id: &str) -> Result<PathBuf> {
        let path = volumes::image_path(&self.volumes_dir(), volume)?;
        let mut holders = self.holders();
        if let Some(holder) = holders.get(volume) {
            return Err(NodeError::VolumeInUse { volume: volume.to_string(), holder: holder.clone() });
        }
        if !path.is_file() {
            return Err(NodeError::UnknownVolume { volume: volume.to_string() });
        }
        holders.insert(volume.to_string(), id.to_string());
        Ok(path)
    }

    /// Record that sandbox `id` (taken back after a restart) holds `volume`.
    pub(super) fn hold_volume(&self, volume: &str, id: &str) {
        self.holders().insert(volume.to_string(), id.to_string());
    }

    /// Give up `volume` if sandbox `id` holds it.
    pub(super) fn release_volume(&self, volume: Option<&str>, id: &str) {
        let Some(volume) = volume else { return };
        let mut holders = self.holders();
        if holders.get(volume).is_some_and(|h| h == id) {
            holders.remove(volume);
        }
    }
}
