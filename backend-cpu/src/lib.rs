//! backend-cpu

pub mod checkpoint;
