//! Volumes on a node that cold-boots every sandbox (no template snapshots): the disk is
//! attached as /dev/vdb and mounted at /workspace from the first boot, the node holds it
//! for one sandbox at a time, and deleting it is refused while it is held.

use crate::common;

use common::sh;
use lizard_api::{CreateSandboxRequest, ErrorCode};

#[tokio::test(flavor = "multi_thread")]
async fn a_cold_booted_sandbox_mounts_its_volume() {
    let t = common::node_with(|c| c.snapshots = false).await;
    t.node.create_volume("vol_cold", 1).await.unwrap();
    let req = CreateSandboxRequest { template: "base".into(), volume: Some("vol_cold".into()), ..Default::default() };
    let a = t.node.create(req.clone()).await.unwrap();
    assert!(!a.from_snapshot());
    assert_eq!(t.node.volume_holder("vol_cold").as_deref(), Some(a.id.as_str()));

    let r = a.exec_collect(sh("findmnt -n -o SOURCE,FSTYPE /workspace && echo kept > /workspace/f")).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "/dev/vdb ext4\n"), "{r:?}");

    // One holder: a second sandbox and a delete are refused, naming the holder.
    let e = t.node.create(req.clone()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Conflict);
    assert!(e.to_string().contains(&a.id), "{e}");
    let e = t.node.delete_volume("vol_cold").unwrap_err();
    assert!(e.to_string().contains(&a.id), "{e}");
    assert_eq!(t.node.list().len(), 1, "the refused create left a sandbox");

    // Killed (the node syncs first), the volume is free again and keeps the file.
    t.node.kill(&a.id).await.unwrap();
    assert_eq!(t.node.volume_holder("vol_cold"), None);
    let b = t.node.create(req).await.unwrap();
    let r = b.exec_collect(sh("cat /workspace/f")).await.unwrap();
    assert_eq!(r.stdout, "kept\n", "{r:?}");

    // A volume the node does not have boots nothing.
    let missing =
        CreateSandboxRequest { template: "base".into(), volume: Some("vol_none".into()), ..Default::default() };
    assert_eq!(t.node.create(missing).await.err().unwrap().code(), ErrorCode::InvalidArgument);
    t.node.kill(&b.id).await.unwrap();
    t.node.delete_volume("vol_cold").unwrap();
    assert!(!t.dir.path().join("volumes/vol_cold.img").exists());
    t.finish().await;
}
