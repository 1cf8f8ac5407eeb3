//! Who may read a metrics page: anyone who reaches a loopback address, and off loopback only
//! a scraper that shows the configured bearer token (`Authorization: Bearer ...`, what
//! Prometheus sends with `authorization.credentials_file`).

use std::fmt;
use std::net::SocketAddr;
use subtle::ConstantTimeEq;

/// Shortest token accepted: 128 bits written as hex, or the like.
pub const MIN_TOKEN: usize = 16;
/// Longest token accepted (it travels in a header).
pub const MAX_TOKEN: usize = 1024;

/// A secret a scrape must show. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why a token or a metrics address was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccessError {
    #[error(
        "the metrics token must be {MIN_TOKEN} to {MAX_TOKEN} visible ASCII characters (e.g. \
         `openssl rand -hex 16`); this one is {0} bytes or holds other characters"
    )]
    BadToken(usize),
    #[error(
        "metrics on {0} would be readable by anyone who can reach it: give a token file \
         (--metrics-token-file; Prometheus sends it with authorization.credentials_file) or \
         serve them on a loopback address such as 127.0.0.1"
    )]
    OpenOffLoopback(SocketAddr),
}

impl Token {
    /// A token from a file's text (surrounding whitespace and a final newline dropped).
    pub fn parse(text: &str) -> Result<Token, AccessError> {
        let t = text.trim();
        let visible = t.bytes().all(|b| b.is_ascii_graphic());
        if !visible || !(MIN_TOKEN..=MAX_TOKEN).contains(&t.len()) {
            return Err(AccessError::BadToken(t.len()));
        }
        Ok(Token(t.to_string()))
    }

    /// Whether an `Authorization` header value shows this token (compared in constant time).
    pub fn admits(&self, authorization: Option<&str>) -> bool {
        let Some(shown) = authorization.and_then(|a| a.trim().strip_prefix("Bearer ")) else {
            return false;
        };
        bool::from(shown.trim().as_bytes().ct_eq(self.0.as_bytes()))
    }
}

/// Where a daemon serves its metrics, and the token a scrape must show, if any.
#[derive(Debug, Clone)]
pub struct Listen {
    pub addr: SocketAddr,
    pub token: Option<Token>,
}

impl Listen {
    /// Checks that the page is not open to everyone off loopback.
    pub fn new(addr: SocketAddr, token: Option<Token>) -> Result<Listen, AccessError> {
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(AccessError::OpenOffLoopback(addr));
        }
        Ok(Listen { addr, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_only_the_right_one_admits() {
        assert_eq!(Token::parse("short"), Err(AccessError::BadToken(5)));
        assert!(Token::parse("has a space in it, long enough").is_err());
        assert!(Token::parse(&"x".repeat(MAX_TOKEN + 1)).is_err());
        let t = Token::parse("  0123456789abcdef0123\n").expect("token");
        assert!(t.admits(Some("Bearer 0123456789abcdef0123")));
        assert!(!t.admits(Some("Bearer 0123456789abcdef0124")));
        assert!(!t.admits(Some("Bearer 0123456789abcdef012")));
        assert!(!t.admits(Some("Basic 0123456789abcdef0123")));
        assert!(!t.admits(None));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn off_loopback_a_token_is_required() {
        let any: SocketAddr = "0.0.0.0:9290".parse().expect("addr");
        let lo: SocketAddr = "127.0.0.1:9290".parse().expect("addr");
        let t = Token::parse("0123456789abcdef").expect("token");
        assert_eq!(
            Listen::new(any, None).err(),
            Some(AccessError::OpenOffLoopback(any))
        );
        assert!(Listen::new(any, Some(t)).is_ok());
        assert!(Listen::new(lo, None).is_ok());
        assert!(Listen::new("[::1]:9290".parse().expect("addr"), None).is_ok());
    }
}
