//! The sandbox sizes a node runs. Every distinct (vCPUs, memory) pair of a template gets
//! its own template snapshot on disk (110–520 MB each, kept for good), so sizes come from
//! a short documented set: vCPUs a power of two (1, 2, 4, 8, 16), memory 128 MiB or a
//! multiple of 256 MiB — at most 5 × 65 shapes per template.

/// vCPU counts a sandbox may have.
pub const VCPUS: &str = "1, 2, 4, 8 or 16";
/// Memory sizes a sandbox may have.
pub const MEMORY_MIB: &str = "128 or a multiple of 256";

/// A size outside the set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {allowed}, got {got}")]
pub struct UnsupportedSize {
    pub field: &'static str,
    pub allowed: &'static str,
    pub got: u32,
}

/// `(vcpus, memory_mib)` if both are in the set (their bounds are checked apart).
pub fn check(vcpus: u32, memory_mib: u32) -> Result<(u32, u32), UnsupportedSize> {
    if !vcpus.is_power_of_two() {
        return Err(UnsupportedSize { field: "vcpus", allowed: VCPUS, got: vcpus });
    }
    if memory_mib != 128 && !memory_mib.is_multiple_of(256) {
        return Err(UnsupportedSize { field: "memoryMib", allowed: MEMORY_MIB, got: memory_mib });
    }
    Ok((vcpus, memory_mib))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_documented_sizes_pass() {
        for ok in [(1, 128), (2, 256), (4, 512), (8, 768), (16, 16384), (1, 1024)] {
            assert_eq!(check(ok.0, ok.1), Ok(ok));
        }
        assert_eq!(check(3, 512).unwrap_err().field, "vcpus");
        for bad in [129, 130, 131, 384 + 1, 1000] {
            assert_eq!(check(1, bad).unwrap_err().field, "memoryMib", "{bad}");
        }
    }
}
