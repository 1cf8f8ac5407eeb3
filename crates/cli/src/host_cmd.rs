//! `cairn host set`: a host's rack and zone labels, the failure domains above hosts.

use crate::admin::{change, get_map};
use anyhow::{bail, Result};
use cairn_map::MapChange;
use clap::Subcommand;
use std::path::Path;

#[derive(Subcommand)]
pub enum HostCmd {
    /// Set where a host is: its rack and zone labels (pools with `--domain rack` or `zone`
    /// keep copies in distinct racks or zones). A flag left out keeps the host's current
    /// label; an empty value (`--rack ""`) removes it. Moves the data of rack and zone
    /// pools whose placement changes. Needs `mon w`.
    Set {
        /// Host name, as `cairn osd tree` shows it.
        host: String,
        /// Rack label: up to 64 letters, digits, '.', '_' or '-'.
        #[arg(long)]
        rack: Option<String>,
        /// Zone label (a room, a building, a site): same characters as a rack.
        #[arg(long)]
        zone: Option<String>,
    },
}

pub fn run(cmd: HostCmd, conf: Option<&Path>) -> Result<()> {
    match cmd {
        HostCmd::Set { host, rack, zone } => {
            if rack.is_none() && zone.is_none() {
                bail!("host {host}: nothing to set; give --rack and/or --zone");
            }
            let map = get_map(conf)?;
            let now = map.host_location(&host);
            let rack = rack.unwrap_or(now.rack);
            let zone = zone.unwrap_or(now.zone);
            let what = format!("host {host}: rack {rack:?} zone {zone:?}");
            change(conf, MapChange::HostLocation { host, rack, zone }, &what)
        }
    }
}
