//! The metrics endpoint's request reader: `http::parse_request` on arbitrary bytes never
//! panics, never looks past `MAX_HEAD`, and whatever it accepts gets a well-formed answer.
#![no_main]

use cairn_metrics::http::{parse_form, parse_request, refuse, respond, HttpError, MAX_FORM, MAX_HEAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The dashboard's login form decoder, on the same bytes.
    if let Some(fields) = parse_form(data) {
        assert!(data.len() <= MAX_FORM);
        for (k, v) in fields {
            assert!(k.len() + v.len() <= data.len());
        }
    }
    let answer = match parse_request(data) {
        Ok(Some(req)) => respond(&req, || "m 1\n# EOF\n".to_string()),
        Ok(None) => {
            assert!(data.len() < MAX_HEAD);
            return;
        }
        Err(e) => {
            if data.len() < MAX_HEAD {
                assert_ne!(e, HttpError::TooLarge);
            }
            refuse(&e)
        }
    };
    assert!(answer.starts_with(b"HTTP/1.1 "));
    // Only the first MAX_HEAD bytes matter.
    if data.len() > MAX_HEAD {
        assert_eq!(parse_request(data), parse_request(&data[..MAX_HEAD]));
    }
});
