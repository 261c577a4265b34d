//! Shared helpers for the runnable examples.
