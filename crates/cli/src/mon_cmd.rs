//! `cairn mon`: run a monitor daemon; list, add and remove monitors.

use anyhow::{bail, Context, Result};
use cairn_mon::MonConfig;
use cairn_proto::msg::mon::MembersRequest;
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum MonCmd {
    /// Run a monitor: it holds the cluster map, replicated with Raft across 1, 3 or 5
    /// monitors.
    ///
    /// Start every monitor of a new cluster with the same --fsid and the same --member list;
    /// on first start the monitor with the lowest id forms the cluster. To add a monitor to a
    /// running cluster, start it with --join (and the cluster's --fsid and the monitors'
    /// keyring), then `cairn mon add ID ADDR`. A restarted monitor resumes from --dir. Stop it
    /// with any signal (kill -9 included): everything it acknowledged is on disk.
    Run(Box<MonArgs>),
    /// List the monitors: id, address, which one leads.
    Ls(crate::admin::JsonFlag),
    /// Make a monitor started with `cairn mon run --join --id ID --listen ADDR` a member: it
    /// catches up with the cluster's log (a minute at most), then votes. Needs `mon x`.
    Add {
        /// The new monitor's id (not used by any monitor of the cluster).
        id: u64,
        /// Where it serves (IP:PORT), as clients and the other monitors reach it.
        addr: String,
    },
    /// Remove a monitor from the cluster (a dead one, or one to retire): the others go on
    /// without it. A quorum of the monitors before and after the change must be up. Stop the
    /// removed monitor's process and remove its address from the clients' configuration.
    Rm {
        /// The monitor's id (`cairn mon ls`).
        id: u64,
    },
}

#[derive(Args)]
pub struct MonArgs {
    /// This monitor's id, unique in the cluster (the lowest id forms a new cluster)
    /// [default: DIR/mon.toml's, written by `cairn cluster bootstrap`].
    #[arg(long)]
    pub id: Option<u64>,
    /// Data directory (created if missing); holds mon.redb. Never share it between monitors.
    #[arg(long)]
    pub dir: PathBuf,
    /// Address to serve clients and the other monitors on [default: DIR/mon.toml's, else
    /// 127.0.0.1:6789].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A monitor of the cluster as ID=IP:PORT (the address others reach it at). Repeat for
    /// every monitor, this one included; every monitor needs the same list. Default: this
    /// monitor alone, at --listen.
    #[arg(long = "member", value_name = "ID=IP:PORT", value_parser = parse_member)]
    pub members: Vec<(u64, String)>,
    /// Cluster identity, 32 hex digits, the same for every monitor. Default: the one stored in
    /// --dir; a new single-monitor cluster gets a random one (logged at start).
    #[arg(long)]
    pub fsid: Option<String>,
    /// Mark an OSD down after this many milliseconds without a heartbeat from it. OSDs should
    /// heartbeat at least 3 times per grace period.
    #[arg(long, default_value_t = 4000, value_name = "MS")]
    pub osd_grace_ms: u64,
    /// Mark an OSD out after it has been down this many seconds: its PGs move to other OSDs
    /// and are recovered there.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub down_out_interval: u64,
    /// Map epochs kept at least in the map history. The history (which peering reads to
    /// find every OSD that may hold a PG's newest writes) is otherwise trimmed to the oldest
    /// epoch a PG may still need: a PG down for long keeps it from being trimmed.
    #[arg(long, default_value_t = cairn_mon::DEFAULT_HISTORY_KEEP, value_name = "EPOCHS")]
    pub history_keep: u64,
    /// The keyring: the monitors' shared key (mon.N) and the keys of the entities this
    /// monitor admits, with their caps.
    #[command(flatten)]
    pub auth: crate::daemon_auth::DaemonAuth,
    #[command(flatten)]
    pub conns: crate::daemon_auth::ConnArgs,
    /// Join a running cluster instead of forming one: wait until `cairn mon add` makes this
    /// monitor a member (the fsid comes from --fsid, else from the cluster configuration;
    /// --member defaults to this monitor alone).
    #[arg(long)]
    pub join: bool,
    #[command(flatten)]
    pub metrics: crate::metrics_args::MetricsArgs,
}

/// Runs a `cairn mon` command.
pub fn run_cmd(cmd: MonCmd, conf: Option<&Path>) -> Result<()> {
    match cmd {
        MonCmd::Run(a) => run(*a, conf),
        MonCmd::Ls(j) => list(conf, j.json),
        MonCmd::Add { id, addr } => {
            addr.parse::<SocketAddr>()
                .map_err(|_| anyhow::anyhow!("monitor address {addr:?} is not IP:PORT"))?;
            eprintln!("adding monitor {id} at {addr}: it catches up, then votes...");
            members(conf, MembersRequest::Add { id, addr })
        }
        MonCmd::Rm { id } => members(conf, MembersRequest::Remove { id }),
    }
}

fn members(conf: Option<&Path>, req: MembersRequest) -> Result<()> {
    let mon = crate::admin::mon_client(conf)?;
    let now = crate::admin::block_on_mon(&mon.addrs(), mon.change_members(req))??;
    println!("monitors now:");
    for (id, addr) in now {
        println!("  mon.{id} {addr}");
    }
    Ok(())
}

fn list(conf: Option<&Path>, json: bool) -> Result<()> {
    let mon = crate::admin::mon_client(conf)?;
    let st = crate::admin::block_on_mon(&mon.addrs(), mon.status())??;
    if json {
        let v: Vec<_> = st
            .members
            .iter()
            .map(|(id, addr)| {
                serde_json::json!({"id": id, "addr": addr, "leader": st.leader == Some(*id)})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for (id, addr) in &st.members {
        let lead = if st.leader == Some(*id) {
            "  leader"
        } else {
            ""
        };
        println!("mon.{id} {addr}{lead}");
    }
    Ok(())
}

fn parse_member(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not ID=IP:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("monitor id {id:?} is not a number"))?;
    let addr = addr.trim();
    addr.parse::<SocketAddr>()
        .map_err(|_| format!("monitor address {addr:?} is not IP:PORT"))?;
    Ok((id, addr.to_string()))
}

/// Runs the monitor until the process is killed (the binary installs logging first).
pub fn run(args: MonArgs, conf: Option<&Path>) -> Result<()> {
    let mut args = with_mon_toml(args)?;
    if args.join && args.fsid.is_none() && cairn_mon::stored_identity(&args.dir)?.is_none() {
        // The cluster this host's configuration names.
        let c = crate::conf::load(conf)
            .context("--join needs the cluster's fsid: give --fsid, or the configuration")?;
        args.fsid = Some(c.cluster.fsid);
    }
    if let Some(id) = args.id {
        cairn_failstop::name_daemon(&format!("mon.{id}"));
    }
    let cfg = config(&args)?;
    let listen = args
        .listen
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 6789)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cairn-mon")
        .enable_all()
        .build()
        .context("cannot start the monitor's runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}: is another monitor running there?",
                    listen
                )
            })?;
        // No shutdown signal: the monitor runs until killed, which is always safe.
        cairn_mon::run(cfg, listener, std::future::pending()).await?;
        Ok(())
    })
}

/// Fills what the flags leave out from DIR/mon.toml (`cairn cluster bootstrap`).
fn with_mon_toml(mut args: MonArgs) -> Result<MonArgs> {
    if let Some(t) = crate::bootstrap::MonToml::load(&args.dir)? {
        args.id = args.id.or(Some(t.id));
        args.listen = args.listen.or(Some(t.listen));
        args.fsid = args.fsid.or(Some(t.fsid));
        if args.members.is_empty() {
            args.members = t
                .members
                .iter()
                .map(|m| parse_member(m).map_err(|e| anyhow::anyhow!("mon.toml members: {e}")))
                .collect::<Result<_>>()?;
        }
        if args.auth.frames == cairn_transport::FrameMode::Plain {
            if let Some(f) = t.frames.as_deref() {
                args.auth.frames = crate::daemon_auth::parse_frames(f)
                    .map_err(|e| anyhow::anyhow!("mon.toml frames: {e}"))?;
            }
        }
    }
    Ok(args)
}

fn config(args: &MonArgs) -> Result<MonConfig> {
    let Some(id) = args.id else {
        bail!(
            "give the monitor's --id (or a --dir holding mon.toml, from `cairn cluster bootstrap`)"
        );
    };
    let listen = args
        .listen
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 6789)));
    let mut members = BTreeMap::new();
    for (m, addr) in &args.members {
        if let Some(prev) = members.insert(*m, addr.clone()) {
            bail!("monitor {m} is given twice (--member {m}={prev} and --member {m}={addr})");
        }
    }
    if members.is_empty() {
        if listen.port() == 0 {
            bail!("a monitor needs a fixed port that clients can be told: give --listen IP:PORT");
        }
        members.insert(id, listen.to_string());
    }
    let Some(me) = members.get(&id) else {
        bail!("this monitor (--id {id}) is not in the --member list: add --member {id}={listen}");
    };
    if me.parse::<SocketAddr>().map(|a| a.port()).ok() != Some(listen.port()) {
        tracing::warn!(
            "--listen {} and this monitor's --member address {me} have different ports: \
             the other monitors and clients will not reach it",
            listen
        );
    }
    let stored = cairn_mon::stored_identity(&args.dir)?;
    let fsid = match (&args.fsid, stored) {
        (Some(hex), _) => crate::conf::parse_fsid(hex).context("--fsid")?,
        (None, Some(s)) => s.fsid,
        (None, None) if args.join => {
            bail!("--join needs --fsid: the cluster's fsid (`cairn status` shows it)")
        }
        (None, None) if members.len() == 1 => {
            let fsid: [u8; 16] = rand::random();
            tracing::info!(
                fsid = %cairn_mon::fsid_hex(&fsid),
                "new single-monitor cluster with a random fsid"
            );
            fsid
        }
        (None, None) => bail!(
            "--fsid is required to create a cluster of {} monitors: give every monitor the \
             same 32 hex digits",
            members.len()
        ),
    };
    let mut cfg = MonConfig::new(id, members, args.dir.clone(), fsid);
    cfg.osd_grace = Duration::from_millis(args.osd_grace_ms);
    cfg.down_out_interval = Duration::from_secs(args.down_out_interval);
    cfg.history_keep = args.history_keep;
    cfg.keyring = args.auth.keyring(&args.dir)?;
    cfg.frames = args.auth.frames;
    cfg.conn_limits = args.conns.limits()?;
    cfg.join = args.join;
    cfg.metrics_listen = args.metrics.listen()?;
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_are_checked() {
        assert_eq!(
            parse_member("2=10.0.0.2:6789"),
            Ok((2, "10.0.0.2:6789".to_string()))
        );
        assert!(parse_member("2:10.0.0.2:6789").is_err());
        assert!(parse_member("x=10.0.0.2:6789").is_err());
        assert!(parse_member("2=host:6789").is_err());
    }
}
