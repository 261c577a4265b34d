//! Configuration files the compiler reads.

pub mod aot;
