//! cairn-gateway: the glue between Cairn's volumes and the protocol libraries that serve
//! them. The protocol libraries know nothing of Cairn (`cairn-nbd` serves any block export)
//! and a volume knows no protocol (`cairn-volume`); what joins them lives here.
//!
//! - [`nbd`]: a pool's volumes as NBD exports (`cairn nbd serve`).
//! - [`metrics`]: the NBD server's Prometheus metrics.
//! - [`users`]: the NBD users a gateway serves over TLS (their keys and caps).

pub mod metrics;
pub mod nbd;
pub mod users;
