//! Parsers for the payloads of NBD_OPT_INFO/GO and NBD_OPT_{LIST,SET}_META_CONTEXT. Pure and
//! bounds-checked: every length is checked against the bytes actually present before use.

/// Longest export name or query string (the protocol's string limit).
pub const MAX_NAME_LEN: usize = 4096;

/// The payload of NBD_OPT_INFO or NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" is the default export).
    pub name: String,
    /// NBD_INFO_* items the client asked for (unknown ones included; they are ignored).
    pub items: Vec<u16>,
}

/// The payload of NBD_OPT_LIST_META_CONTEXT or NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name the contexts are for.
    pub export: String,
    /// Query strings ("namespace:leaf").
    pub queries: Vec<String>,
}

/// Why an option payload is malformed (answered with NBD_REP_ERR_INVALID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// A length points past the end of the option data.
    #[error("option data is truncated")]
    Truncated,
    /// Bytes left over after the last field.
    #[error("option data has trailing bytes")]
    Trailing,
    /// A string longer than 4096 bytes.
    #[error("string longer than 4096 bytes")]
    TooLong,
    /// A string that is not UTF-8 or contains NUL.
    #[error("string is not valid UTF-8 without NUL")]
    BadString,
}

/// A cursor over option data that never reads past its end.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DataError> {
        let (head, rest) = self.0.split_at_checked(n).ok_or(DataError::Truncated)?;
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, DataError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DataError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A string preceded by its 32-bit length.
    fn string(&mut self) -> Result<String, DataError> {
        let len = self.u32()?;
        let len = usize::try_from(len).map_err(|_| DataError::TooLong)?;
        if len > MAX_NAME_LEN {
            return Err(DataError::TooLong);
        }
        parse_string(self.take(len)?)
    }

    fn finish(&self) -> Result<(), DataError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DataError::Trailing)
        }
    }
}

/// Checks a protocol string: at most 4096 bytes of UTF-8 without NUL.
pub fn parse_string(b: &[u8]) -> Result<String, DataError> {
    if b.len() > MAX_NAME_LEN {
        return Err(DataError::TooLong);
    }
    let s = std::str::from_utf8(b).map_err(|_| DataError::BadString)?;
    if s.contains('\0') {
        return Err(DataError::BadString);
    }
    Ok(s.to_owned())
}

/// Parses NBD_OPT_INFO/GO data: u32 name length, name, u16 count, count x u16 items.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, DataError> {
    let mut c = Cursor(data);
    let name = c.string()?;
    let count = c.u16()?;
    let items = (0..count).map(|_| c.u16()).collect::<Result<_, _>>()?;
    c.finish()?;
    Ok(InfoRequest { name, items })
}

/// Parses meta context data: u32 name length, name, u32 count, count x (u32 length, query).
pub fn parse_meta_request(data: &[u8]) -> Result<MetaRequest, DataError> {
    let mut c = Cursor(data);
    let export = c.string()?;
    let count = c.u32()?;
    // Each query takes at least 4 bytes, so a count the data cannot hold fails here instead
    // of reserving memory for it.
    if u64::from(count) * 4 > c.0.len() as u64 {
        return Err(DataError::Truncated);
    }
    let queries = (0..count).map(|_| c.string()).collect::<Result<_, _>>()?;
    c.finish()?;
    Ok(MetaRequest { export, queries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_bytes(name: &[u8], items: &[u16]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name);
        b.extend_from_slice(&(items.len() as u16).to_be_bytes());
        for i in items {
            b.extend_from_slice(&i.to_be_bytes());
        }
        b
    }

    #[test]
    fn info_request() {
        let r = parse_info_request(&info_bytes(b"disk", &[3, 1, 77])).unwrap();
        assert_eq!(r.name, "disk");
        assert_eq!(r.items, vec![3, 1, 77]);
        assert_eq!(parse_info_request(&info_bytes(b"", &[])).unwrap().name, "");
    }

    #[test]
    fn info_request_malformed() {
        let mut b = info_bytes(b"disk", &[1]);
        b.push(0);
        assert_eq!(parse_info_request(&b), Err(DataError::Trailing));
        assert_eq!(
            parse_info_request(&info_bytes(b"disk", &[1])[..9]),
            Err(DataError::Truncated)
        );
        assert_eq!(
            parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]),
            Err(DataError::TooLong)
        );
        assert_eq!(
            parse_info_request(&info_bytes(b"a\0b", &[])),
            Err(DataError::BadString)
        );
        assert_eq!(
            parse_info_request(&info_bytes(&[0xc3], &[])),
            Err(DataError::BadString)
        );
        assert_eq!(
            parse_info_request(&info_bytes(&[b'x'; 4097], &[])),
            Err(DataError::TooLong)
        );
    }

    #[test]
    fn meta_request() {
        let mut b = 1u32.to_be_bytes().to_vec();
        b.push(b'd');
        b.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:", "base:allocation"] {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        let r = parse_meta_request(&b).unwrap();
        assert_eq!(r.export, "d");
        assert_eq!(r.queries, vec!["base:", "base:allocation"]);
    }

    #[test]
    fn meta_request_count_beyond_data() {
        let mut b = 0u32.to_be_bytes().to_vec();
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_meta_request(&b), Err(DataError::Truncated));
    }
}
