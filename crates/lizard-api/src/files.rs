//! Types of the file routes shared by the node and the control plane.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Permission bits for a written file, given in octal on the wire (`?mode=755`): at most
/// `7777` (setuid, setgid, sticky and the nine rwx bits). Anything else is refused with
/// `INVALID_ARGUMENT`, on the node and on the control plane alike.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = String, example = "644"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(u32);

/// A `mode` that is not octal permission bits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mode must be octal permission bits (0 to 7777), got {0:?}")]
pub struct InvalidFileMode(pub String);

impl FileMode {
    /// The largest mode: every permission bit set.
    pub const MAX: u32 = 0o7777;

    /// The bits, for `chmod`.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// `bits` when they are permission bits only.
    pub fn from_bits(bits: u32) -> Result<FileMode, InvalidFileMode> {
        if bits <= Self::MAX {
            Ok(FileMode(bits))
        } else {
            Err(InvalidFileMode(format!("{bits:o}")))
        }
    }
}

impl FromStr for FileMode {
    type Err = InvalidFileMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Digits 0-7 only: `from_str_radix` alone would also take a sign.
        let octal = !s.is_empty() && s.bytes().all(|b| (b'0'..=b'7').contains(&b));
        let bits = if octal { u32::from_str_radix(s, 8).ok() } else { None };
        bits.filter(|b| *b <= Self::MAX).map(FileMode).ok_or_else(|| InvalidFileMode(s.to_string()))
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:o}", self.0)
    }
}

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Answer of `GET /v1/sandboxes/{id}/files/exists`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileExists {
    /// Whether anything is at the path (a dangling link counts).
    pub exists: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_octal_permission_bits_only() {
        assert_eq!("755".parse::<FileMode>().unwrap().bits(), 0o755);
        assert_eq!("0644".parse::<FileMode>().unwrap().bits(), 0o644);
        assert_eq!("7777".parse::<FileMode>().unwrap().bits(), 0o7777);
        assert_eq!("0".parse::<FileMode>().unwrap().bits(), 0);
        for bad in ["", "8", "17777", "+7", "-1", "0x1ff", "493 ", "rwx", "99999999999999999999"] {
            let e = bad.parse::<FileMode>().unwrap_err();
            assert_eq!(e, InvalidFileMode(bad.to_string()));
        }
        assert!(FileMode::from_bits(0o10000).is_err());
        assert_eq!(FileMode::from_bits(0o600).unwrap().to_string(), "600");
    }

    #[test]
    fn is_a_string_on_the_wire() {
        #[derive(Deserialize)]
        struct Q {
            mode: Option<FileMode>,
        }
        let q: Q = serde_json::from_str(r#"{"mode":"640"}"#).unwrap();
        assert_eq!(q.mode, Some(FileMode(0o640)));
        let e = serde_json::from_str::<Q>(r#"{"mode":"999"}"#).err().unwrap();
        assert!(e.to_string().contains("mode must be octal permission bits"), "{e}");
        assert_eq!(serde_json::to_string(&FileMode(0o755)).unwrap(), r#""755""#);
    }
}
