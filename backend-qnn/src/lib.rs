//! backend-qnn
