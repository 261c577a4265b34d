//! `#[module]` misuse is a compile error with a clear message at the offending tokens, and several
//! misuses are reported in one build. The expected compiler output is checked in next to each case
//! (`tests/ui/fail/*.stderr`); regenerate with `TRYBUILD=overwrite cargo test -p mllm-dsl --test compile_fail`
//! and review the diff.

#[test]
fn module_attribute() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
