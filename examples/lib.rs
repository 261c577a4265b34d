//! The command lines of the `qwen3_aot` and `generate` examples, as a library so tests parse and
//! run them exactly as a user does. The work itself is the `aot` crate's.

pub mod aot_cli;

pub mod generate_cli;
