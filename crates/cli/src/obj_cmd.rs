//! `cairn obj`: put, get, remove, list and stat objects of a pool.

use crate::admin::block_on;
use anyhow::{Context, Result};
use cairn_client::Client;
use clap::Subcommand;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum ObjCmd {
    /// Store a file (or stdin with `-`) as an object, replacing it.
    Put {
        pool: String,
        name: String,
        /// File to read; `-` for stdin.
        file: PathBuf,
        /// Only create: fail (exit status 1, "already exists") if the object exists, so that
        /// of several concurrent puts of one name exactly one stores it. A put that finds
        /// the object holding exactly these bytes already succeeds.
        #[arg(long)]
        if_absent: bool,
    },
    /// Write an object's contents to a file (or stdout with `-`).
    Get {
        pool: String,
        name: String,
        /// File to write; `-` for stdout.
        file: PathBuf,
    },
    /// Remove an object.
    Rm { pool: String, name: String },
    /// List a pool's object names.
    Ls { pool: String },
    /// Show an object's size.
    Stat { pool: String, name: String },
}

/// Largest object `put` stores in one piece (the OSD's frame limit is 64 MiB).
const PIECE: usize = 16 << 20;

pub fn run(cmd: ObjCmd, conf: Option<&Path>) -> Result<()> {
    let mons = crate::conf::load(conf)?.cluster.mons;
    block_on(async move {
        let client = Client::connect(crate::conf::client_config(mons)).await?;
        match cmd {
            ObjCmd::Put {
                pool,
                name,
                file,
                if_absent,
            } => {
                let data = read_input(&file)?;
                let id = client.pool_id(&pool)?;
                let first = &data[..data.len().min(PIECE)];
                if if_absent {
                    // The first piece decides: the rest is written only by the winner.
                    client.create(id, name.as_bytes(), first).await?;
                } else {
                    client.write_full(id, name.as_bytes(), first).await?;
                }
                let mut off = first.len();
                while off < data.len() {
                    let end = (off + PIECE).min(data.len());
                    client
                        .write(id, name.as_bytes(), off as u64, &data[off..end])
                        .await?;
                    off = end;
                }
                eprintln!("stored {name} ({} bytes) in pool {pool}", data.len());
            }
            ObjCmd::Get { pool, name, file } => {
                let id = client.pool_id(&pool)?;
                let size = client.stat(id, name.as_bytes()).await?.size;
                let mut out = Vec::with_capacity(size as usize);
                while (out.len() as u64) < size {
                    let want = (size - out.len() as u64).min(PIECE as u64);
                    let piece = client
                        .read(id, name.as_bytes(), out.len() as u64, want)
                        .await?;
                    if piece.is_empty() {
                        break;
                    }
                    out.extend_from_slice(&piece);
                }
                write_output(&file, &out)?;
            }
            ObjCmd::Rm { pool, name } => {
                let id = client.pool_id(&pool)?;
                client.remove(id, name.as_bytes()).await?;
                eprintln!("removed {name} from pool {pool}");
            }
            ObjCmd::Ls { pool } => {
                let id = client.pool_id(&pool)?;
                let mut names = client.list(id).await?;
                names.sort();
                let mut out = std::io::stdout().lock();
                for n in names {
                    out.write_all(&n)?;
                    out.write_all(b"\n")?;
                }
            }
            ObjCmd::Stat { pool, name } => {
                let id = client.pool_id(&pool)?;
                let st = client.stat(id, name.as_bytes()).await?;
                println!("{name}: {} bytes", st.size);
            }
        }
        Ok::<(), anyhow::Error>(())
    })?
}

fn read_input(file: &Path) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    if file == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut data)
            .context("cannot read stdin")?;
    } else {
        data = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    }
    Ok(data)
}

fn write_output(file: &Path, data: &[u8]) -> Result<()> {
    if file == Path::new("-") {
        std::io::stdout()
            .write_all(data)
            .context("cannot write stdout")
    } else {
        std::fs::write(file, data).with_context(|| format!("cannot write {}", file.display()))
    }
}
