//! The sandbox-URL listener's TLS mode: one certificate chain and its key, from PEM files
//! (an operator's own, or the wildcard certificate `lizard tls init` mints under a local
//! CA). E2B's SDKs build `https://{port}-{id}.{domain}` themselves (the desktop's stream
//! URL among them), so a sandbox URL must be reachable over TLS without a front.
//!
//! ALPN offers HTTP/1.1 only: the proxy speaks HTTP/1.1 (and its upgrades) end to end.

use crate::ServerError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// Where the TLS mode's certificate chain and key are (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate first, then the chain up to (not necessarily including)
    /// the root.
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// The acceptor for [`TlsFiles`]; a file that is missing, unreadable, or holds no usable
/// certificate or key fails the server's start, naming the file.
pub fn acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    let invalid = |path: &Path, what: String| ServerError::Io {
        context: format!("the sandbox-URL listener's TLS {}", path.display()),
        cause: std::io::Error::new(std::io::ErrorKind::InvalidData, what),
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid(&files.cert, format!("certificate: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(&files.cert, "no certificate in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| invalid(&files.key, format!("private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| invalid(&files.cert, format!("certificate and key do not make a TLS server: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Why `acceptor` refused `files`.
    fn refusal(files: TlsFiles) -> String {
        match acceptor(&files) {
            Ok(_) => panic!("{files:?} made an acceptor"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_certificate_and_its_key_make_an_acceptor_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let minted = rcgen::generate_simple_self_signed(vec!["*.sandbox.local.lizard.localhost".into()]).unwrap();
        let cert = write(dir.path(), "cert.pem", &minted.cert.pem());
        let key = write(dir.path(), "key.pem", &minted.key_pair.serialize_pem());
        assert!(acceptor(&TlsFiles { cert: cert.clone(), key: key.clone() }).is_ok());

        let empty = write(dir.path(), "empty.pem", "");
        let err = refusal(TlsFiles { cert: empty.clone(), key: key.clone() });
        assert!(err.contains("empty.pem") && err.contains("no certificate"), "{err}");
        let err = refusal(TlsFiles { cert: cert.clone(), key: empty });
        assert!(err.contains("empty.pem") && err.contains("private key"), "{err}");
        let other = rcgen::generate_simple_self_signed(vec!["other.example".into()]).unwrap();
        let other_key = write(dir.path(), "other-key.pem", &other.key_pair.serialize_pem());
        let err = refusal(TlsFiles { cert, key: other_key });
        assert!(err.contains("do not make a TLS server"), "{err}");
        let err = refusal(TlsFiles { cert: dir.path().join("missing.pem"), key });
        assert!(err.contains("missing.pem"), "{err}");
    }
}
