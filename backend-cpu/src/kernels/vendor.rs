//! The CPU's vendor, for the memory hints whose best choice differs between AMD's and Intel's
//! caches (measured; see [`super::read_ahead::Policy`] and the int4 decode tile's prefetch).

/// Whether the CPU's vendor is AMD (CPUID leaf 0's `AuthenticAMD`); read once.
pub(crate) fn is_amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
            vendor == b"AuthenticAMD"
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
