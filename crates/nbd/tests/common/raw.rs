//! A minimal blocking NBD client over a raw socket, for sending what real clients never send.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use cairn_nbd::proto::*;

pub struct Raw {
    pub s: TcpStream,
}

/// One option reply.
#[derive(Debug)]
pub struct OptReply {
    pub opt: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// One transmission reply: simple (error, data) or a structured chunk (flags, type, payload).
#[derive(Debug)]
pub enum Reply {
    Simple {
        cookie: u64,
        error: u32,
    },
    Chunk {
        cookie: u64,
        flags: u16,
        kind: u16,
        payload: Vec<u8>,
    },
}

impl Raw {
    /// Connects and reads the greeting (checking it); does not send client flags.
    pub fn greet(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        let mut r = Raw { s };
        let g = r.read_n(GREETING_LEN);
        assert_eq!(&g[..], &greeting()[..]);
        r
    }

    /// Connects and sends fixed-newstyle + no-zeroes client flags.
    pub fn connect(port: u16) -> Raw {
        let mut r = Raw::greet(port);
        r.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        r
    }

    /// Connects and enters transmission with NBD_OPT_GO on `name`.
    pub fn go(port: u16, name: &str, structured: bool, meta: bool) -> Raw {
        let mut r = Raw::connect(port);
        if structured {
            r.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(r.opt_reply().kind, REP_ACK);
        }
        if meta {
            r.option(OPT_SET_META_CONTEXT, &meta_data(name, &[BASE_ALLOCATION]));
            assert_eq!(r.opt_reply().kind, REP_META_CONTEXT);
            assert_eq!(r.opt_reply().kind, REP_ACK);
        }
        r.option(OPT_GO, &info_data(name, &[]));
        loop {
            let rep = r.opt_reply();
            match rep.kind {
                REP_INFO => continue,
                REP_ACK => return r,
                k => panic!("NBD_OPT_GO failed: reply {k:#x} {:?}", rep.data),
            }
        }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send");
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.s.read_exact(&mut b).expect("read");
        b
    }

    /// True once the server has closed the connection (EOF or reset within the timeout).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == ErrorKind::ConnectionReset,
        }
    }

    pub fn option(&mut self, opt: u32, data: &[u8]) {
        self.option_header(opt, data.len() as u32);
        self.send(data);
    }

    pub fn option_header(&mut self, opt: u32, len: u32) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        self.send(&b);
    }

    pub fn opt_reply(&mut self) -> OptReply {
        let h = self.read_n(20);
        assert_eq!(&h[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        OptReply {
            opt: u32::from_be_bytes(h[8..12].try_into().unwrap()),
            kind: u32::from_be_bytes(h[12..16].try_into().unwrap()),
            data: self.read_n(len),
        }
    }

    pub fn request(&mut self, kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        let r = Request {
            flags,
            kind,
            cookie,
            offset,
            len,
        };
        self.send(&encode_request(&r));
    }

    /// Reads one reply; `read_len` is the data length of a successful simple read reply
    /// (the client must know it: simple replies do not say).
    pub fn reply(&mut self, read_len: usize) -> (Reply, Vec<u8>) {
        let magic = u32::from_be_bytes(self.read_n(4).try_into().unwrap());
        if magic == SIMPLE_REPLY_MAGIC {
            let h = self.read_n(12);
            let error = u32::from_be_bytes(h[0..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
            let data = if error == 0 {
                self.read_n(read_len)
            } else {
                Vec::new()
            };
            return (Reply::Simple { cookie, error }, data);
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
        let h = self.read_n(16);
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
        let payload = self.read_n(len);
        let chunk = Reply::Chunk {
            flags: u16::from_be_bytes(h[0..2].try_into().unwrap()),
            kind: u16::from_be_bytes(h[2..4].try_into().unwrap()),
            cookie: u64::from_be_bytes(h[4..12].try_into().unwrap()),
            payload,
        };
        (chunk, Vec::new())
    }

    /// Reads a simple reply and returns (cookie, error).
    pub fn simple(&mut self, read_len: usize) -> (u64, u32, Vec<u8>) {
        match self.reply(read_len) {
            (Reply::Simple { cookie, error }, data) => (cookie, error, data),
            (other, _) => panic!("expected a simple reply, got {other:?}"),
        }
    }
}

pub fn info_data(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}
