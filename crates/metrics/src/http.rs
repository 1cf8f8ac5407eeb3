//! The little HTTP a scrape needs: one request head read (at most [`MAX_HEAD`] bytes, parsed
//! by `httparse`), one response, the connection closed.

/// Largest request head read: a scrape's is a few hundred bytes.
pub const MAX_HEAD: usize = 8 << 10;

/// Most headers a request may carry.
const MAX_HEADERS: usize = 32;

/// A request's method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Whether the client asked for OpenMetrics (its `Accept` header); else it gets the
    /// classic Prometheus text format.
    pub openmetrics: bool,
    /// Bytes of the request head (its body, if any, follows).
    pub head_len: usize,
    /// The `Content-Length` header, if valid.
    pub content_length: Option<usize>,
    /// The `Cookie` header, if any (at most one is kept).
    pub cookie: Option<String>,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
}

impl Request {
    /// The value of cookie `name`, if the request carries it.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.cookie.as_deref()?.split(';').find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == name).then_some(v)
        })
    }
}

/// Why a request head was refused (answered 400 or 431, then closed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError {
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed HTTP request: {0}")]
    Malformed(String),
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is incomplete.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, HttpError> {
    let buf = &buf[..buf.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(head_len)) => {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            Ok(Some(Request {
                method: req.method.unwrap_or_default().to_string(),
                path: req.path.unwrap_or_default().to_string(),
                openmetrics: header("accept")
                    .is_some_and(|a| a.contains("application/openmetrics-text")),
                head_len,
                content_length: header("content-length").and_then(|l| l.trim().parse().ok()),
                cookie: header("cookie"),
                authorization: header("authorization"),
            }))
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => Err(HttpError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(HttpError::Malformed(e.to_string())),
    }
}

/// Content type of the metrics page in OpenMetrics (what `prometheus-client` writes).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the classic Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The response to `req`; `render` gives the metrics (OpenMetrics) when they are asked for.
pub fn respond(req: &Request, render: impl FnOnce() -> String) -> Vec<u8> {
    let path = req.path.split('?').next().unwrap_or_default();
    let head_only = req.method == "HEAD";
    if req.method != "GET" && !head_only {
        return response(405, "Method Not Allowed", "text/plain", "only GET\n", false);
    }
    match path {
        "/metrics" if req.openmetrics => response(200, "OK", OPENMETRICS, &render(), head_only),
        "/metrics" => {
            let text = crate::text::from_openmetrics(&render());
            response(200, "OK", PROMETHEUS_TEXT, &text, head_only)
        }
        "/" => response(
            200,
            "OK",
            "text/plain; charset=utf-8",
            "Cairn metrics: GET /metrics (Prometheus/OpenMetrics text format)\n",
            head_only,
        ),
        _ => response(
            404,
            "Not Found",
            "text/plain",
            "no such page; try /metrics\n",
            false,
        ),
    }
}

/// The response to a scrape without the token the endpoint wants.
pub fn unauthorized() -> Vec<u8> {
    response_with(
        401,
        "Unauthorized",
        "text/plain",
        b"a bearer token is required\n",
        &[("WWW-Authenticate", "Bearer")],
    )
}

/// The response to a request that could not be read.
pub fn refuse(e: &HttpError) -> Vec<u8> {
    match e {
        HttpError::TooLarge => response(
            431,
            "Request Header Fields Too Large",
            "text/plain",
            "request head too large\n",
            false,
        ),
        HttpError::Malformed(_) => {
            response(400, "Bad Request", "text/plain", "bad request\n", false)
        }
    }
}

fn response(code: u16, reason: &str, ctype: &str, body: &str, head_only: bool) -> Vec<u8> {
    let body = if head_only { "" } else { body };
    response_with(code, reason, ctype, body.as_bytes(), &[])
}

/// A whole response: status, content type, `extra` headers (names and values must be plain
/// tokens: they are written as given), the body; the connection is closed after it.
pub fn response_with(
    code: u16,
    reason: &str,
    ctype: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Most bytes of a form body read.
pub const MAX_FORM: usize = 4096;

/// The fields of an `application/x-www-form-urlencoded` body (`+` and `%XX` decoded; a
/// malformed escape is kept as written); `None` when larger than [`MAX_FORM`] or not UTF-8.
pub fn parse_form(body: &[u8]) -> Option<Vec<(String, String)>> {
    if body.len() > MAX_FORM {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    text.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((unescape(k)?, unescape(v)?))
        })
        .collect()
}

fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            openmetrics: false,
            head_len: 0,
            content_length: None,
            cookie: None,
            authorization: None,
        }
    }

    #[test]
    fn requests_are_parsed_when_complete_and_refused_when_bad_or_huge() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(parse_request(&head[..10]), Ok(None));
        let mut want = get("/metrics");
        want.head_len = head.len();
        assert_eq!(parse_request(head), Ok(Some(want)));
        let post =
            b"POST /login HTTP/1.1\r\nContent-Length: 12\r\nCookie: a=1; s=xyz\r\n\r\nentity=x&k=y";
        let r = parse_request(post).unwrap().unwrap();
        assert_eq!((r.content_length, r.head_len), (Some(12), post.len() - 12));
        assert_eq!(
            (r.cookie("s"), r.cookie("a"), r.cookie("b")),
            (Some("xyz"), Some("1"), None)
        );
        let om =
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n";
        assert!(parse_request(om).unwrap().unwrap().openmetrics);
        assert!(matches!(
            parse_request(b"\x00\x01 nonsense\r\n\r\n"),
            Err(HttpError::Malformed(_))
        ));
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse_request(&huge), Err(HttpError::TooLarge));
    }

    #[test]
    fn forms_are_decoded_and_bounded() {
        let f = parse_form(b"entity=client.admin&key=ab%2Bc+d&empty=&bad=%zz%4").unwrap();
        let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("entity"), Some("client.admin"));
        assert_eq!(get("key"), Some("ab+c d"));
        assert_eq!(get("empty"), Some(""));
        assert_eq!(get("bad"), Some("%zz%4"));
        assert_eq!(parse_form(&[b'a'; MAX_FORM + 1]), None);
        assert_eq!(parse_form(b"k=%ff"), None);
    }

    #[test]
    fn only_the_metrics_page_and_the_index_are_served() {
        let text = |r: Vec<u8>| String::from_utf8(r).unwrap();
        let ok = text(respond(&get("/metrics?x=1"), || "m 1\n# EOF\n".into()));
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(PROMETHEUS_TEXT), "{ok}");
        assert!(ok.ends_with("\r\n\r\nm 1\n"), "{ok}");
        assert!(text(respond(&get("/x"), String::new)).starts_with("HTTP/1.1 404"));
        let post = Request {
            method: "POST".into(),
            ..get("/metrics")
        };
        assert!(text(respond(&post, String::new)).starts_with("HTTP/1.1 405"));
    }
}
