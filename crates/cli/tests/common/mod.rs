pub mod cluster;
pub mod history;
pub mod hosts;
pub mod tools;
