pub mod cluster;
pub mod history;
pub mod hosts;
pub mod nbd_server;
pub mod tools;
pub mod unique;
