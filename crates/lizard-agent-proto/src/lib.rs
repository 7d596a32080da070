//! The protocol between a Lizard node (the host) and `lizard-agent` (PID 1 in the guest).
//!
//! # Layers
//!
//! 1. **Transport**: any reliable byte stream into the guest. Under QEMU that is a
//!    virtio-serial port named [`SERIAL_PORT_NAME`] (virtio-serial survives QEMU
//!    migration, which snapshots rely on; vhost-user devices do not). Under Firecracker it
//!    is a vsock connection to [`VSOCK_PORT`] through the hybrid-vsock Unix socket.
//! 2. **Handshake** ([`handshake`]): the agent sends a fresh random challenge, the host
//!    answers with HMAC-SHA256(secret, challenge). Only a holder of the sandbox's secret can
//!    drive the agent; the secret itself never crosses the wire.
//! 3. **HTTP/2** (prior knowledge, the host is the client): multiplexes any number of
//!    concurrent operations over the one stream, with per-stream flow control so that
//!    100 MB files stream without being buffered whole on either side.
//! 4. **Operations**: the routes in [`routes`], JSON types in [`types`], and the framed
//!    exec stream in [`frame`]; TCP tunnels to ports in the guest are HTTP/2 `CONNECT`
//!    streams ([`routes`] walks through them). File contents can bypass the channel
//!    through the staging disk ([`staging`]), with only notices on the channel.
//!
//! After a snapshot restore the host side of the transport is a new connection: the agent
//! sees the old session end, drops it, and waits for the next handshake. Nothing in the
//! protocol outlives one connection.

pub mod frame;
pub mod handshake;
pub mod routes;
pub mod staging;
pub mod types;

/// Name of the virtio-serial port the agent listens on (`/dev/virtio-ports/<name>` in the guest).
pub const SERIAL_PORT_NAME: &str = "lizard.agent";

/// vsock port the agent listens on where the transport is vsock (Firecracker).
pub const VSOCK_PORT: u32 = 1024;

/// Protocol version; bumped on incompatible changes. Part of the handshake.
pub const PROTOCOL_VERSION: u32 = 1;

/// Kernel command-line keys the node passes to the agent on cold boot.
pub mod cmdline {
    /// Hex-encoded per-sandbox secret used by the handshake.
    pub const SECRET: &str = "lizard.secret";
    /// Guest hostname (the sandbox id).
    pub const HOSTNAME: &str = "lizard.hostname";
    /// Block device holding the root filesystem, e.g. `/dev/vda`.
    pub const ROOT: &str = "lizard.root";
    /// `probe`: print [`super::PROBE_OK`] on the console and power off (accelerator probe).
    pub const MODE: &str = "lizard.mode";
    /// Transport: `serial` (default) or `vsock`.
    pub const TRANSPORT: &str = "lizard.transport";
}

/// QEMU fw_cfg item that carries the secret (`-fw_cfg name=…,file=…`). It keeps the
/// secret out of the VMM's command line, which every host user can read in `ps`; the
/// agent reads it from `/sys/firmware/qemu_fw_cfg/by_name/<name>/raw` and falls back to
/// [`cmdline::SECRET`].
pub const FW_CFG_SECRET: &str = "opt/lizard/secret";

/// The guest's network, identical in every sandbox: a template snapshot carries the
/// configured interface, so every clone must find the same addresses on the host side.
/// The node gives each sandbox its own network namespace whose TAP device is the gateway;
/// the namespace translates the guest's address to one unique per sandbox.
pub mod net {
    use std::net::Ipv4Addr;
    /// The guest's interface (the first virtio-net device).
    pub const GUEST_IF: &str = "eth0";
    pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
    /// Gateway and DNS resolver: the TAP device's address in the sandbox's namespace.
    pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
    pub const PREFIX_LEN: u8 = 30;
    /// Locally administered MACs, fixed so that a snapshot's ARP cache stays valid.
    pub const GUEST_MAC: &str = "02:4c:5a:00:00:02";
    pub const GATEWAY_MAC: &str = "02:4c:5a:00:00:01";
}

/// Where an initramfs carries the static `lizard` CLI (optional), and where the agent
/// installs it in the guest's root filesystem at boot.
pub const GUEST_CLI_INITRAMFS_PATH: &str = "/bin/lizard";
pub const GUEST_CLI_INSTALL_PATH: &str = "/usr/local/bin/lizard";

/// Line the agent prints to the console in probe mode once it runs.
pub const PROBE_OK: &str = "LIZARD-PROBE-OK";

/// Parse `key=value` pairs out of a kernel command line.
pub fn parse_cmdline(cmdline: &str) -> std::collections::HashMap<String, String> {
    cmdline.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_cmdline_pairs() {
        let m = super::parse_cmdline("console=ttyS0 quiet lizard.secret=ab12 lizard.root=/dev/vda\n");
        assert_eq!(m["lizard.secret"], "ab12");
        assert_eq!(m["lizard.root"], "/dev/vda");
        assert!(!m.contains_key("quiet"));
    }
}
