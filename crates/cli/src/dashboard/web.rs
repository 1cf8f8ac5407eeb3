//! The dashboard's pages and its login: a browser signs in with a Cairn identity and its key
//! (checked by authenticating to the monitors with them and reading the map, so it takes
//! `mon r`), and gets a session cookie. A cluster without authentication needs no login.

use cairn_failstop::LockOrDie;
use cairn_metrics::http::{self, Request};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const INDEX: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const LOGIN: &str = include_str!("login.html");

/// How long a session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept (the oldest go first).
const MAX_SESSIONS: usize = 256;
/// The session cookie's name.
pub const COOKIE: &str = "cairn_session";

/// Pages the browser may not embed elsewhere, load nothing from other origins, not cache.
const SECURITY: [(&str, &str); 4] = [
    (
        "Content-Security-Policy",
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

/// Who may look.
pub struct Sessions {
    /// Whether a login is needed (the cluster has authentication).
    pub required: bool,
    live: Mutex<HashMap<String, (String, Instant)>>,
}

impl Sessions {
    pub fn new(required: bool) -> Sessions {
        Sessions {
            required,
            live: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.live.lock_or_die()
    }

    /// Whether `req` may see the cluster.
    pub fn allows(&self, req: &Request) -> bool {
        if !self.required {
            return true;
        }
        let Some(token) = req.cookie(COOKIE) else {
            return false;
        };
        let mut live = self.lock();
        live.retain(|_, (_, until)| *until > Instant::now());
        live.contains_key(token)
    }

    /// A new session for `entity`: its token.
    pub fn open(&self, entity: &str) -> anyhow::Result<String> {
        let token = crate::conf::hex16(&crate::dev::random_fsid()?);
        let mut live = self.lock();
        if live.len() >= MAX_SESSIONS {
            let oldest = live
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                live.remove(&k);
            }
        }
        live.insert(
            token.clone(),
            (entity.to_string(), Instant::now() + SESSION_TTL),
        );
        Ok(token)
    }

    /// Ends the session of `req`, if any.
    pub fn close(&self, req: &Request) {
        if let Some(t) = req.cookie(COOKIE) {
            self.lock().remove(t);
        }
    }
}

fn page(code: u16, reason: &str, ctype: &str, body: &str) -> Vec<u8> {
    http::response_with(code, reason, ctype, body.as_bytes(), &SECURITY)
}

fn redirect(to: &str, cookie: Option<&str>) -> Vec<u8> {
    let mut headers = SECURITY.to_vec();
    headers.push(("Location", to));
    if let Some(c) = cookie {
        headers.push(("Set-Cookie", c));
    }
    http::response_with(303, "See Other", "text/plain", b"", &headers)
}

/// The login page, with `error` shown when given.
pub fn login_page(code: u16, reason: &str, error: Option<&str>) -> Vec<u8> {
    let msg = error.map_or(String::new(), |e| {
        format!("<p class=\"error\" id=\"login-error\">{}</p>", escape(e))
    });
    page(
        code,
        reason,
        "text/html; charset=utf-8",
        &LOGIN.replace("<!--ERROR-->", &msg),
    )
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What to answer a request other than a login (handled by the caller, which checks keys):
/// `snapshot` gives the latest data.
pub fn route(req: &Request, sessions: &Sessions, snapshot: impl FnOnce() -> String) -> Vec<u8> {
    let path = req.path.split('?').next().unwrap_or_default();
    let allowed = sessions.allows(req);
    match (req.method.as_str(), path) {
        ("GET", "/login") => login_page(200, "OK", None),
        ("GET", "/logout") => {
            sessions.close(req);
            let gone = format!("{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
            redirect("/login", Some(&gone))
        }
        ("GET", "/") if !allowed => redirect("/login", None),
        ("GET", "/") => page(200, "OK", "text/html; charset=utf-8", INDEX),
        ("GET", "/app.js") => page(200, "OK", "text/javascript; charset=utf-8", APP_JS),
        ("GET", "/api/cluster") if !allowed => page(
            401,
            "Unauthorized",
            "application/json",
            "{\"error\":\"sign in first\"}",
        ),
        ("GET", "/api/cluster") => page(200, "OK", "application/json", &snapshot()),
        ("GET", _) => page(404, "Not Found", "text/plain", "no such page\n"),
        _ => page(
            405,
            "Method Not Allowed",
            "text/plain",
            "read-only: GET only\n",
        ),
    }
}

/// The answer to a successful login: the session cookie, then the dashboard.
pub fn logged_in(token: &str) -> Vec<u8> {
    let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    redirect("/", Some(&cookie))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, cookie: Option<&str>) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            openmetrics: false,
            head_len: 0,
            content_length: None,
            cookie: cookie.map(String::from),
            authorization: None,
        }
    }

    fn status(r: &[u8]) -> String {
        String::from_utf8_lossy(&r[..12]).into_owned()
    }

    #[test]
    fn without_a_session_only_the_login_page_is_served() {
        let s = Sessions::new(true);
        assert!(status(&route(&get("/", None), &s, String::new)).contains("303"));
        let api = route(&get("/api/cluster", None), &s, || "secret".into());
        assert!(status(&api).contains("401"));
        assert!(!String::from_utf8_lossy(&api).contains("secret"));
        let forged = format!("{COOKIE}=0123");
        let api = route(&get("/api/cluster", Some(&forged)), &s, || "x".into());
        assert!(status(&api).contains("401"));
        let token = s.open("client.admin").unwrap();
        let cookie = format!("other=1; {COOKIE}={token}");
        let api = route(&get("/api/cluster", Some(&cookie)), &s, || "data".into());
        assert!(status(&api).contains("200"));
        assert!(String::from_utf8_lossy(&api).ends_with("data"));
        s.close(&get("/logout", Some(&cookie)));
        assert!(!s.allows(&get("/", Some(&cookie))));
        // A cluster without authentication: no login.
        assert!(Sessions::new(false).allows(&get("/", None)));
    }

    #[test]
    fn login_errors_are_escaped() {
        let p = String::from_utf8(login_page(401, "Unauthorized", Some("<b>no</b>"))).unwrap();
        assert!(p.contains("&lt;b&gt;no&lt;/b&gt;") && !p.contains("<b>no"));
    }
}
