//! The `desktop` template through the API, as the SDK's `sandbox.desktop` uses it: create →
//! the first screenshot back (scrot in the guest, the PNG read out through exec), and the
//! host memory of idle desktop sandboxes (Xvfb and the window manager running in each).

use crate::api::Bench;
use crate::ms;
use anyhow::{ensure, Result};
use std::time::Instant;

/// The SDK's screenshot, as one exec: the PNG in base64 on stdout.
const SCREENSHOT: &str = "f=/tmp/bench-shot.png; scrot -o $f && base64 -w0 $f; rm -f $f";
/// The start of any PNG's base64 form (its 8-byte signature).
const PNG_BASE64: &str = "iVBORw0KGgo";

pub struct DesktopTimes {
    /// The template's first create: a cold boot, the desktop started, the snapshot saved.
    pub first_create_ms: f64,
    /// Restored creates, each to its first screenshot.
    pub to_screenshot_ms: Vec<f64>,
    pub screenshot_kib: f64,
    /// PSS of each idle desktop sandbox's VMM.
    pub idle_pss_mib: Vec<f64>,
}

impl Bench {
    /// `creates` timed creates of `desktop` to their first screenshot, then `idle` idle
    /// sandboxes' memory.
    pub async fn desktop(&self, creates: usize, idle: usize) -> Result<DesktopTimes> {
        let t = Instant::now();
        let id = self.create("desktop").await?;
        let first_create_ms = ms(t.elapsed());
        self.kill(&id).await?;
        let mut to_screenshot_ms = vec![];
        let mut screenshot_kib = 0.0;
        for i in 0..creates {
            let t = Instant::now();
            let id = self.create("desktop").await?;
            let png = self.exec(&id, SCREENSHOT).await?;
            let took = ms(t.elapsed());
            ensure!(png.starts_with(PNG_BASE64), "not a PNG: {:?}", png.get(..40));
            // Base64 carries 3 bytes in 4 characters.
            screenshot_kib = png.len() as f64 * 3.0 / 4.0 / 1024.0;
            to_screenshot_ms.push(took);
            self.kill(&id).await?;
            eprintln!("desktop create → screenshot {}/{creates}: {took:.0} ms", i + 1);
        }
        let idle_pss_mib = if idle > 0 { self.idle_pss("desktop", idle).await? } else { vec![] };
        Ok(DesktopTimes { first_create_ms, to_screenshot_ms, screenshot_kib, idle_pss_mib })
    }
}
