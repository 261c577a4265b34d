//! backend-qnn

pub mod sdk;
