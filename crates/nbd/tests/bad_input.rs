//! The server against malformed and hostile input on raw sockets: it refuses or closes as the
//! protocol says, never writes anything it should not, and keeps serving other clients.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_nbd::handshake::{MAX_DISCARD_LEN, MAX_OPTIONS, MAX_OPTION_LEN};
use cairn_nbd::proto::*;
use common::mem::{MemExport, MemExports};
use common::raw::{info_data, Raw, Reply};
use common::TestServer;

const SIZE: u64 = 1 << 20;

fn server() -> (TestServer, Arc<MemExport>) {
    let mut exports = MemExports::new();
    let disk = exports.add(
        "disk",
        "",
        MemExport::new(SIZE).with_slow_reads(4096, Duration::from_millis(300)),
    );
    (TestServer::start(exports), disk)
}

/// A fresh connection can still read: the server survived whatever came before.
fn still_serving(port: u16) {
    let mut c = Raw::go(port, "disk", false, false);
    c.request(CMD_READ, 0, 1, 8192, 512);
    let (cookie, error, data) = c.simple(512);
    assert_eq!((cookie, error, data.len()), (1, 0, 512));
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    c.send(b"NOTIHAVEOPT....."); // 16 bytes
    assert!(c.closed());
    still_serving(server.port);
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let (server, _) = server();
    let mut c = Raw::greet(server.port);
    c.send(&0x8000_0001u32.to_be_bytes());
    assert!(c.closed());
}

#[test]
fn unknown_options_are_refused_and_haggling_continues() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    for (opt, data, want) in [
        (4242, &b"whatever"[..], REP_ERR_UNSUP),
        (OPT_EXTENDED_HEADERS, &[][..], REP_ERR_UNSUP),
        (OPT_STARTTLS, &[][..], REP_ERR_POLICY),
        (OPT_LIST, &[1, 2][..], REP_ERR_INVALID),
        (OPT_GO, &[0, 0, 0, 9, 1][..], REP_ERR_INVALID),
    ] {
        c.option(opt, data);
        let r = c.opt_reply();
        assert_eq!(
            (r.opt, r.kind),
            (opt, want),
            "{:?}",
            String::from_utf8_lossy(&r.data)
        );
    }
    c.option(OPT_INFO, &info_data("nope", &[]));
    assert_eq!(c.opt_reply().kind, REP_ERR_UNKNOWN);
    c.option(OPT_LIST, &[]);
    let r = c.opt_reply();
    assert_eq!(r.kind, REP_SERVER);
    assert_eq!(r.data, [&[0, 0, 0, 4][..], b"disk"].concat());
    assert_eq!(c.opt_reply().kind, REP_ACK);
    // And the connection still reaches transmission.
    c.option(OPT_GO, &info_data("disk", &[INFO_BLOCK_SIZE]));
    let export = c.opt_reply();
    assert_eq!(export.kind, REP_INFO);
    assert_eq!(&export.data[0..2], &INFO_EXPORT.to_be_bytes());
    assert_eq!(&export.data[2..10], &SIZE.to_be_bytes());
    let bs = c.opt_reply();
    assert_eq!(
        bs.data,
        [
            &[0, 3][..],
            &1u32.to_be_bytes(),
            &4096u32.to_be_bytes(),
            &(32u32 << 20).to_be_bytes()
        ]
        .concat()
    );
    assert_eq!(c.opt_reply().kind, REP_ACK);
    c.request(CMD_READ, 0, 7, 0, 0);
    assert_eq!(c.simple(0), (7, 0, vec![]));
}

#[test]
fn oversized_options() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    // Too long to parse but short enough to skip: NBD_REP_ERR_TOO_BIG, then carry on.
    c.option(OPT_INFO, &vec![0; MAX_OPTION_LEN as usize + 1]);
    assert_eq!(c.opt_reply().kind, REP_ERR_TOO_BIG);
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply().kind, REP_ACK);
    // Absurd: closed without reading it.
    c.option_header(OPT_INFO, MAX_DISCARD_LEN + 1);
    assert!(c.closed());
    // An export name longer than the protocol's limit cannot be answered: closed.
    let mut c = Raw::connect(server.port);
    c.option(OPT_EXPORT_NAME, &[b'x'; 5000]);
    assert!(c.closed());
    still_serving(server.port);
}

#[test]
fn too_many_options_close_the_connection() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    for _ in 0..MAX_OPTIONS {
        c.option(4242, &[]);
        assert_eq!(c.opt_reply().kind, REP_ERR_UNSUP);
    }
    c.option(4242, &[]);
    assert!(c.closed());
}

#[test]
fn export_name_honours_no_zeroes_and_closes_on_unknown_export() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    c.option(OPT_EXPORT_NAME, b"disk");
    let reply = c.read_n(10);
    assert_eq!(&reply[0..8], &SIZE.to_be_bytes());
    let flags = u16::from_be_bytes([reply[8], reply[9]]);
    assert_ne!(flags & FLAG_HAS_FLAGS, 0);
    assert_eq!(flags & FLAG_SEND_DF, 0, "DF without structured replies");
    // No zero padding: the next bytes are the reply to a request.
    c.request(CMD_FLUSH, 0, 3, 0, 0);
    assert_eq!(c.simple(0), (3, 0, vec![]));

    let mut c = Raw::greet(server.port);
    c.send(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    c.option(OPT_EXPORT_NAME, b"");
    assert_eq!(c.read_n(134)[10..], [0; 124]);

    let mut c = Raw::connect(server.port);
    c.option(OPT_EXPORT_NAME, b"nope");
    assert!(c.closed());
}

#[test]
fn abort_is_acknowledged() {
    let (server, _) = server();
    let mut c = Raw::connect(server.port);
    c.option(OPT_ABORT, &[]);
    assert_eq!(c.opt_reply().kind, REP_ACK);
    assert!(c.closed());
}

#[test]
fn out_of_range_requests_are_refused_and_write_nothing() {
    let (server, disk) = server();
    let mut c = Raw::go(server.port, "disk", false, false);
    // A write crossing the end: its payload is skipped, ENOSPC, nothing written.
    c.request(CMD_WRITE, 0, 1, SIZE - 512, 1024);
    c.send(&[0xee; 1024]);
    assert_eq!(c.simple(0), (1, 28, vec![]));
    c.request(CMD_WRITE, 0, 2, u64::MAX - 10, 100);
    c.send(&[0xee; 100]);
    assert_eq!(c.simple(0), (2, 28, vec![]));
    c.request(CMD_READ, 0, 3, SIZE, 1);
    assert_eq!(c.simple(0), (3, 22, vec![]));
    c.request(CMD_TRIM, 0, 4, SIZE - 1, 2);
    assert_eq!(c.simple(0), (4, 22, vec![]));
    c.request(CMD_WRITE_ZEROES, 0, 5, SIZE, 1);
    assert_eq!(c.simple(0), (5, 28, vec![]));
    // Unknown flag on a write: EINVAL, payload skipped.
    c.request(CMD_WRITE, 1 << 9, 6, 0, 16);
    c.send(&[0xee; 16]);
    assert_eq!(c.simple(0), (6, 22, vec![]));
    // The stream is still in step.
    c.request(CMD_READ, 0, 7, SIZE - 512, 512);
    assert_eq!(c.simple(512), (7, 0, vec![0; 512]));
    assert_eq!(disk.calls.writes.load(Ordering::SeqCst), 0);
    assert_eq!(disk.calls.trims.load(Ordering::SeqCst), 0);
    assert_eq!(disk.calls.zeroes.load(Ordering::SeqCst), 0);
    assert!(disk.contents().iter().all(|&b| b == 0));
}

#[test]
fn a_panicking_export_fails_that_request_with_eio_and_the_connection_goes_on() {
    let mut exports = MemExports::new();
    let at = 3 * 4096;
    exports.add("disk", "", MemExport::new(SIZE).with_panicking_reads_at(at));
    let server = TestServer::start(exports);
    let mut c = Raw::go(server.port, "disk", false, false);
    c.request(CMD_READ, 0, 1, at, 512);
    assert_eq!(
        c.simple(0),
        (1, 5, vec![]),
        "EIO for the read that panicked"
    );
    c.request(CMD_READ, 0, 2, 0, 512);
    let (cookie, error, data) = c.simple(512);
    assert_eq!((cookie, error, data.len()), (2, 0, 512));
    still_serving(server.port);
}

#[test]
fn unknown_commands_and_flags_get_einval() {
    let (server, _) = server();
    let mut c = Raw::go(server.port, "disk", false, false);
    c.request(42, 0, 1, 0, 4096);
    assert_eq!(c.simple(0), (1, 22, vec![]));
    c.request(CMD_READ, CMD_FLAG_DF, 2, 0, 512); // DF needs structured replies
    assert_eq!(c.simple(0), (2, 22, vec![]));
    c.request(CMD_TRIM, CMD_FLAG_NO_HOLE, 3, 0, 512);
    assert_eq!(c.simple(0), (3, 22, vec![]));
    c.request(CMD_BLOCK_STATUS, 0, 4, 0, 512); // no metadata context
    assert_eq!(c.simple(0), (4, 22, vec![]));
    c.request(CMD_FLUSH, 0, 5, 0, 0);
    assert_eq!(c.simple(0), (5, 0, vec![]));
}

#[test]
fn structured_errors_and_block_status() {
    let (server, disk) = server();
    disk.fill(8192, &[1; 4096]);
    let mut c = Raw::go(server.port, "disk", true, true);
    // A refused READ must get a structured error chunk, never a simple reply.
    c.request(CMD_READ, 0, 1, SIZE, 512);
    match c.reply(0).0 {
        Reply::Chunk {
            cookie: 1,
            flags,
            kind,
            payload,
        } => {
            assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR));
            assert_eq!(&payload[0..4], &22u32.to_be_bytes());
        }
        other => panic!("{other:?}"),
    }
    c.request(CMD_READ, CMD_FLAG_DF, 2, 8192, 4096);
    match c.reply(0).0 {
        Reply::Chunk {
            cookie: 2,
            flags,
            kind,
            payload,
        } => {
            assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
            assert_eq!(&payload[0..8], &8192u64.to_be_bytes());
            assert_eq!(&payload[8..], &[1; 4096][..]);
        }
        other => panic!("{other:?}"),
    }
    c.request(CMD_BLOCK_STATUS, 0, 3, 4096, 3 * 4096);
    match c.reply(0).0 {
        Reply::Chunk {
            cookie: 3,
            flags,
            kind,
            payload,
        } => {
            assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS));
            let words: Vec<u32> = payload
                .chunks(4)
                .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
                .collect();
            assert_eq!(words, vec![1, 4096, 3, 4096, 0, 4096, 3]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let (server, _) = server();
    let mut c = Raw::go(server.port, "disk", false, false);
    c.send(&[0x55; REQUEST_LEN]);
    assert!(c.closed());
    still_serving(server.port);
}

#[test]
fn oversized_write_closes_the_connection() {
    let (server, disk) = server();
    let mut c = Raw::go(server.port, "disk", false, false);
    c.request(CMD_WRITE, 0, 1, 0, (32 << 20) + 1);
    c.send(&[0; 4096]);
    assert!(c.closed());
    assert_eq!(disk.calls.writes.load(Ordering::SeqCst), 0);
    still_serving(server.port);
}

#[test]
fn disconnect_mid_write_payload_writes_nothing() {
    let (server, disk) = server();
    let mut c = Raw::go(server.port, "disk", false, false);
    c.request(CMD_WRITE, 0, 1, 0, 65536);
    c.send(&[0xab; 1000]);
    drop(c);
    // The server notices the disconnect; give it a moment, then check nothing was written.
    std::thread::sleep(Duration::from_millis(100));
    still_serving(server.port);
    assert_eq!(disk.calls.writes.load(Ordering::SeqCst), 0);
    assert!(disk.contents().iter().all(|&b| b == 0));
}

#[test]
fn disc_waits_for_in_flight_requests() {
    let (server, disk) = server();
    disk.fill(0, &[9; 512]);
    let mut c = Raw::go(server.port, "disk", false, false);
    let started = Instant::now();
    c.request(CMD_READ, 0, 1, 0, 512); // slow (300 ms)
    c.request(CMD_DISC, 0, 2, 0, 0);
    assert_eq!(c.simple(512), (1, 0, vec![9; 512]));
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(c.closed());
}

#[test]
fn shutdown_drains_in_flight_requests() {
    let (mut server, disk) = server();
    disk.fill(0, &[5; 512]);
    let mut c = Raw::go(server.port, "disk", false, false);
    c.request(CMD_READ, 0, 1, 0, 512); // slow (300 ms)
                                       // Shut down only once the read is running in the export.
    let deadline = Instant::now() + Duration::from_secs(5);
    while disk.calls.reads.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the read never reached the export"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(server.shutdown(), "serve did not return");
    assert_eq!(c.simple(512), (1, 0, vec![5; 512]));
    assert!(c.closed());
}
