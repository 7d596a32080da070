//! `lizard tls init`: a local CA and a wildcard certificate for the sandbox-URL listener's
//! TLS mode (`lizard server --proxy-tls-listen`), for a machine with no certificate of its
//! own. Clients trust the CA: `SSL_CERT_FILE=<data-dir>/tls/bundle.pem` (Python; the
//! system's roots plus the CA, since the variable replaces the system store) and
//! `NODE_EXTRA_CA_CERTS=<data-dir>/tls/ca.pem` (Node.js).
//!
//! A second run keeps the CA (clients that trust it go on trusting) and mints a new
//! certificate for the names given now. Keys are written 0600; nothing is logged.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum TlsCmd {
    /// Mint (or re-mint) the local CA and the listener's wildcard certificate in
    /// <data-dir>/tls: ca.pem, cert.pem, key.pem, and bundle.pem (the system's roots plus
    /// ca.pem, for SSL_CERT_FILE).
    Init(InitArgs),
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The server's --domain [default: lizard.localhost]
    #[arg(long, value_name = "D", default_value = "lizard.localhost")]
    pub domain: String,
    /// The server's --region [default: local]
    #[arg(long, value_name = "R", default_value = "local")]
    pub region: String,
}

/// The CA's name: the same on every run, so a re-minted certificate names the CA that
/// clients already trust.
const CA_NAME: &str = "Lizard local CA";
/// The system's roots, for bundle.pem.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where `lizard tls init` writes, and where `--proxy-tls-listen` looks by default.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

pub fn run(data_dir: &Path, cmd: TlsCmd) -> Result<()> {
    match cmd {
        TlsCmd::Init(args) => init(data_dir, &args),
    }
}

fn init(data_dir: &Path, args: &InitArgs) -> Result<()> {
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let ca_key_path = dir.join("ca-key.pem");
    let ca_key = match std::fs::read_to_string(&ca_key_path) {
        Ok(pem) => KeyPair::from_pem(&pem).with_context(|| format!("read the CA's key {}", ca_key_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = KeyPair::generate()?;
            write_private(&ca_key_path, &key.serialize_pem())?;
            key
        }
        Err(e) => return Err(e).with_context(|| format!("read {}", ca_key_path.display())),
    };
    let ca = ca_params()?.self_signed(&ca_key)?;
    let ca_path = dir.join("ca.pem");
    if !ca_path.exists() {
        std::fs::write(&ca_path, ca.pem())?;
    }
    let names =
        [format!("*.sandbox.{}.{}", args.region, args.domain), format!("*.svc.{}.{}", args.region, args.domain)];
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name.push(DnType::CommonName, names[0].clone());
    // A leaf valid for more than 398 days is refused by browsers.
    let now = time::OffsetDateTime::now_utc();
    leaf.not_before = now - time::Duration::days(1);
    leaf.not_after = now + time::Duration::days(390);
    let leaf_key = KeyPair::generate()?;
    let cert = leaf.signed_by(&leaf_key, &ca, &ca_key)?;
    write_private(&dir.join("key.pem"), &leaf_key.serialize_pem())?;
    std::fs::write(dir.join("cert.pem"), cert.pem())?;
    let ca_pem = std::fs::read_to_string(&ca_path)?;
    let roots = std::fs::read_to_string(SYSTEM_ROOTS).unwrap_or_default();
    std::fs::write(dir.join("bundle.pem"), format!("{roots}{ca_pem}"))?;
    println!("certificate for {} in {}", names.join(", "), dir.display());
    println!("serve it:  lizard server --proxy-tls-listen 127.0.0.1:7173");
    println!(
        "trust it:  SSL_CERT_FILE={}  NODE_EXTRA_CA_CERTS={}",
        dir.join("bundle.pem").display(),
        ca_path.display()
    );
    Ok(())
}

fn ca_params() -> Result<CertificateParams> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, CA_NAME);
    ca.distinguished_name.push(DnType::OrganizationName, "Lizard");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = rcgen::date_time_ymd(2024, 1, 1);
    ca.not_after = rcgen::date_time_ymd(2050, 1, 1);
    Ok(ca)
}

/// Write `text` to `path` readable by its owner only (replacing it).
fn write_private(path: &Path, text: &str) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}
