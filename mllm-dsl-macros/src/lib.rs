//! The `#[module]` attribute.
