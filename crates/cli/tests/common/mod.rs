pub mod cluster;
pub mod history;
