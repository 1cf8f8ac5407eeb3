//! Block volumes.
