//! The CPU's vendor, for the memory hints whose best choice differs between AMD's and Intel's
//! caches (measured; the int4 decode tile's prefetch), and the environment variables that pick a
//! hint ([`super::read_ahead::Policy`] too, whose default is now the same on both).

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

/// The memory hint the environment variable `env` names among `choices` (or the value
/// [`crate::knobs::set`] gave it); unset, `amd` on AMD CPUs and `other` elsewhere. A value not
/// among the choices is reported on stderr (naming the variable and what it accepts) and the
/// vendor's default is used: a hint only moves speed, never results.
pub(crate) fn hint_from_env<T: Copy>(env: &str, choices: &[(&str, T)], amd: T, other: T) -> T {
    let default = if is_amd() { amd } else { other };
    let Some(value) = crate::knobs::var(env) else { return default };
    match choices.iter().find(|(name, _)| *name == value) {
        Some(&(_, hint)) => hint,
        None => {
            let accepted: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            eprintln!("warning: {env}={value:?} is not one of {}; using the default", accepted.join(", "));
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_the_named_choice_else_the_vendors_default() {
        // A variable of this test's own, so no other test reads it.
        const ENV: &str = "MLLM_CPU_TEST_HINT_FROM_ENV";
        let choices = [("a", 1), ("b", 2)];
        let default = if is_amd() { 10 } else { 20 };
        std::env::remove_var(ENV);
        assert_eq!(hint_from_env(ENV, &choices, 10, 20), default);
        std::env::set_var(ENV, "b");
        assert_eq!(hint_from_env(ENV, &choices, 10, 20), 2);
        std::env::set_var(ENV, "B");
        assert_eq!(hint_from_env(ENV, &choices, 10, 20), default, "names are exact");
        std::env::remove_var(ENV);
    }
}
