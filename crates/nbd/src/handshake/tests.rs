use super::*;

/// Splits option replies into (option, reply type, data); panics on malformed bytes.
fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        assert_eq!(&b[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let opt = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(b[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(b[16..20].try_into().unwrap()) as usize;
        out.push((opt, kind, b[20..20 + len].to_vec()));
        b = &b[20 + len..];
    }
    out
}

fn kinds(step: &Step) -> Vec<u32> {
    replies(&step.replies).into_iter().map(|r| r.1).collect()
}

fn info_data(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

fn disk() -> ExportInfo {
    ExportInfo {
        size: 1 << 20,
        multi_conn: true,
        description: Some("a disk".into()),
        read_only: false,
    }
}

#[test]
fn client_flags() {
    assert!(Negotiation::new(0).is_ok());
    assert!(Negotiation::new(3).is_ok());
    assert_eq!(Negotiation::new(4), Err(HandshakeError::BadClientFlags(4)));
}

#[test]
fn go_with_structured_replies_and_meta_context() {
    let mut n = Negotiation::new(3).unwrap();
    assert_eq!(
        kinds(&n.on_option(OPT_STRUCTURED_REPLY, &[])),
        vec![REP_ACK]
    );
    let set = n.on_option(
        OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation", "x-y:z"]),
    );
    let r = replies(&set.replies);
    assert_eq!(r[0].1, REP_META_CONTEXT);
    assert_eq!(&r[0].2[0..4], &BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&r[0].2[4..], BASE_ALLOCATION.as_bytes());
    assert_eq!(r[1].1, REP_ACK);

    let step = n.on_option(OPT_GO, &info_data("disk", &[INFO_NAME, INFO_DESCRIPTION]));
    assert_eq!(
        step.outcome,
        Outcome::NeedExport {
            name: "disk".into(),
            description: true
        }
    );
    let step = n.on_export(Lookup::Found(disk()));
    let r = replies(&step.replies);
    let infos: Vec<u16> = r
        .iter()
        .filter(|x| x.1 == REP_INFO)
        .map(|x| u16::from_be_bytes([x.2[0], x.2[1]]))
        .collect();
    assert_eq!(
        infos,
        vec![INFO_EXPORT, INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]
    );
    assert_eq!(r[0].2.len(), 12);
    assert_eq!(&r[0].2[2..10], &(1u64 << 20).to_be_bytes());
    assert_eq!(r[1].2.len(), 14);
    assert_eq!(&r[3].2[2..], b"a disk");
    assert_eq!(r.last().unwrap().1, REP_ACK);
    let Outcome::Go(s) = step.outcome else {
        panic!("expected Go, got {:?}", step.outcome)
    };
    assert!(s.structured);
    assert_eq!(
        s.contexts,
        vec![MetaContext {
            id: BASE_ALLOCATION_ID,
            name: BASE_ALLOCATION.into()
        }]
    );
    assert_eq!(s.flags, transmission_flags(true, true, false));
    assert_ne!(s.flags & FLAG_SEND_DF, 0);
    assert_ne!(s.flags & FLAG_CAN_MULTI_CONN, 0);
}

#[test]
fn meta_context_for_another_export_selects_nothing() {
    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_STRUCTURED_REPLY, &[]);
    n.on_option(
        OPT_SET_META_CONTEXT,
        &meta_data("other", &["base:allocation"]),
    );
    n.on_option(OPT_GO, &info_data("disk", &[]));
    let Outcome::Go(s) = n.on_export(Lookup::Found(disk())).outcome else {
        panic!()
    };
    assert_eq!(s.contexts, vec![]);
}

#[test]
fn dirty_bitmaps_come_from_the_export_set_and_get_their_own_ids() {
    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_STRUCTURED_REPLY, &[]);
    let available = vec![
        "qemu:dirty-bitmap:mon".to_string(),
        "qemu:dirty-bitmap:tue".to_string(),
    ];
    // LIST of the namespace asks the export set, then lists both with id 0.
    let step = n.on_option(
        OPT_LIST_META_CONTEXT,
        &meta_data("disk", &["qemu:dirty-bitmap:"]),
    );
    assert_eq!(
        step.outcome,
        Outcome::NeedContexts {
            export: "disk".into()
        }
    );
    let r = replies(&n.on_contexts(available.clone()).replies);
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(&r[0].2[..4], &0u32.to_be_bytes());
    assert_eq!(&r[1].2[4..], b"qemu:dirty-bitmap:tue");
    // SET of one bitmap and base:allocation: ids 1 and 3, in id order.
    n.on_option(
        OPT_SET_META_CONTEXT,
        &meta_data(
            "disk",
            &["qemu:dirty-bitmap:tue", "base:allocation", "qemu:nope"],
        ),
    );
    let r = replies(&n.on_contexts(available).replies);
    assert_eq!(r.len(), 3, "{r:?}");
    n.on_option(OPT_GO, &info_data("disk", &[]));
    let Outcome::Go(s) = n.on_export(Lookup::Found(disk())).outcome else {
        panic!()
    };
    let ids: Vec<(u32, &str)> = s.contexts.iter().map(|c| (c.id, c.name.as_str())).collect();
    assert_eq!(
        ids,
        vec![(1, "base:allocation"), (3, "qemu:dirty-bitmap:tue")]
    );
    // A lookup answer nobody asked for closes the connection.
    assert!(matches!(n.on_contexts(vec![]).outcome, Outcome::Close(_)));
}

#[test]
fn meta_context_needs_structured_replies() {
    let mut n = Negotiation::new(1).unwrap();
    let q = meta_data("disk", &["base:allocation"]);
    assert_eq!(
        kinds(&n.on_option(OPT_SET_META_CONTEXT, &q)),
        vec![REP_ERR_INVALID]
    );
    assert_eq!(
        kinds(&n.on_option(OPT_LIST_META_CONTEXT, &q)),
        vec![REP_ERR_INVALID]
    );
}

#[test]
fn list_meta_context_queries() {
    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_STRUCTURED_REPLY, &[]);
    for (queries, found) in [
        (vec![], true),
        (vec!["base:"], true),
        (vec!["base:allocation"], true),
        (vec!["base:other", "qemu:dirty-bitmap:x"], false),
    ] {
        let mut step = n.on_option(OPT_LIST_META_CONTEXT, &meta_data("disk", &queries));
        if matches!(step.outcome, Outcome::NeedContexts { .. }) {
            step = n.on_contexts(Vec::new()); // an export without dirty bitmaps
        }
        let want = if found {
            vec![REP_META_CONTEXT, REP_ACK]
        } else {
            vec![REP_ACK]
        };
        assert_eq!(kinds(&step), want, "{queries:?}");
    }
    // "base:" only lists; it selects nothing.
    let step = n.on_option(OPT_SET_META_CONTEXT, &meta_data("disk", &["base:"]));
    assert_eq!(kinds(&step), vec![REP_ACK]);
    let bad = n.on_option(OPT_LIST_META_CONTEXT, &[0, 0, 0, 9]);
    assert_eq!(kinds(&bad), vec![REP_ERR_INVALID]);
}

#[test]
fn info_then_go_unknown_export() {
    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_INFO, &info_data("nope", &[]));
    let step = n.on_export(Lookup::Missing);
    assert_eq!(kinds(&step), vec![REP_ERR_UNKNOWN]);
    assert_eq!(step.outcome, Outcome::Continue);
    n.on_option(OPT_GO, &info_data("nope", &[]));
    let step = n.on_export(Lookup::Failed("backend down".into()));
    assert_eq!(kinds(&step), vec![REP_ERR_UNKNOWN]);
    n.on_option(OPT_INFO, &info_data("disk", &[]));
    let step = n.on_export(Lookup::Found(disk()));
    assert_eq!(kinds(&step), vec![REP_INFO, REP_INFO, REP_ACK]);
    assert_eq!(step.outcome, Outcome::Continue);
    // Without structured replies DF is not advertised.
    let r = replies(&step.replies);
    let flags = u16::from_be_bytes([r[0].2[10], r[0].2[11]]);
    assert_eq!(flags & FLAG_SEND_DF, 0);
}

#[test]
fn export_name_paths() {
    let mut n = Negotiation::new(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).unwrap();
    n.on_option(OPT_EXPORT_NAME, b"disk");
    let step = n.on_export(Lookup::Found(disk()));
    assert_eq!(step.replies.len(), 10);
    assert!(matches!(step.outcome, Outcome::Go(_)));

    let mut n = Negotiation::new(FLAG_C_FIXED_NEWSTYLE).unwrap();
    n.on_option(OPT_EXPORT_NAME, b"disk");
    assert_eq!(n.on_export(Lookup::Found(disk())).replies.len(), 134);

    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_EXPORT_NAME, b"nope");
    assert_eq!(
        n.on_export(Lookup::Missing).outcome,
        Outcome::Close(HandshakeError::UnknownExport("nope".into()))
    );
    let mut n = Negotiation::new(1).unwrap();
    assert!(matches!(
        n.on_option(OPT_EXPORT_NAME, &[0xff]).outcome,
        Outcome::Close(_)
    ));
    assert!(matches!(
        n.on_discarded(OPT_EXPORT_NAME).outcome,
        Outcome::Close(_)
    ));
}

#[test]
fn list_and_misc_options() {
    let mut n = Negotiation::new(1).unwrap();
    assert_eq!(n.on_option(OPT_LIST, &[]).outcome, Outcome::NeedList);
    let step = n.on_list(Ok(vec![
        ("a".into(), "first".into()),
        ("b".into(), String::new()),
    ]));
    let r = replies(&step.replies);
    assert_eq!(r.len(), 3);
    assert_eq!(r[0].2, [&[0, 0, 0, 1][..], b"afirst"].concat());
    assert_eq!(r[1].2, [&[0, 0, 0, 1][..], b"b"].concat());
    assert_eq!(r[2].1, REP_ACK);
    assert_eq!(kinds(&n.on_option(OPT_LIST, &[1])), vec![REP_ERR_INVALID]);
    assert_eq!(kinds(&n.on_option(OPT_STARTTLS, &[])), vec![REP_ERR_POLICY]);
    assert_eq!(
        kinds(&n.on_option(OPT_EXTENDED_HEADERS, &[])),
        vec![REP_ERR_UNSUP]
    );
    assert_eq!(kinds(&n.on_option(4242, &[1, 2, 3])), vec![REP_ERR_UNSUP]);
    assert_eq!(
        kinds(&n.on_option(OPT_STRUCTURED_REPLY, &[0])),
        vec![REP_ERR_INVALID]
    );
    assert_eq!(kinds(&n.on_option(OPT_GO, &[0, 0])), vec![REP_ERR_INVALID]);
    assert_eq!(kinds(&n.on_discarded(OPT_INFO)), vec![REP_ERR_TOO_BIG]);
    let abort = n.on_option(OPT_ABORT, &[]);
    assert_eq!(kinds(&abort), vec![REP_ACK]);
    assert_eq!(abort.outcome, Outcome::Abort);
}

#[test]
fn limits() {
    let mut n = Negotiation::new(1).unwrap();
    assert_eq!(n.admit(OPT_INFO, MAX_OPTION_LEN), Admit::Read);
    assert_eq!(n.admit(OPT_INFO, MAX_OPTION_LEN + 1), Admit::Discard);
    assert!(matches!(
        n.admit(OPT_INFO, MAX_DISCARD_LEN + 1),
        Admit::Close(_)
    ));
    for _ in 3..MAX_OPTIONS {
        assert_eq!(n.admit(OPT_LIST, 0), Admit::Read);
    }
    assert_eq!(
        n.admit(OPT_LIST, 0),
        Admit::Close(HandshakeError::TooManyOptions)
    );
}

#[test]
fn out_of_order_driving_closes() {
    let mut n = Negotiation::new(1).unwrap();
    assert!(matches!(n.on_list(Ok(vec![])).outcome, Outcome::Close(_)));
    assert!(matches!(
        n.on_export(Lookup::Missing).outcome,
        Outcome::Close(_)
    ));
    n.on_option(OPT_LIST, &[]);
    assert!(matches!(
        n.on_option(OPT_LIST, &[]).outcome,
        Outcome::Close(_)
    ));
}

#[test]
fn tls_required_refuses_everything_but_starttls_and_abort() {
    let mut n = Negotiation::requiring_tls(1).unwrap();
    for opt in [OPT_LIST, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY, 4242] {
        assert_eq!(
            kinds(&n.on_option(opt, &[])),
            vec![REP_ERR_TLS_REQD],
            "{opt}"
        );
    }
    assert_eq!(
        n.on_option(OPT_EXPORT_NAME, b"disk").outcome,
        Outcome::Close(HandshakeError::TlsRequired)
    );
    assert_eq!(
        kinds(&n.on_option(OPT_STARTTLS, &[1])),
        vec![REP_ERR_INVALID]
    );
    let start = n.on_option(OPT_STARTTLS, &[]);
    assert_eq!(kinds(&start), vec![REP_ACK]);
    assert_eq!(start.outcome, Outcome::StartTls);
    let mut n = Negotiation::requiring_tls(1).unwrap();
    assert_eq!(n.on_option(OPT_ABORT, &[]).outcome, Outcome::Abort);
}

#[test]
fn after_tls_options_start_over() {
    let mut n = Negotiation::requiring_tls(1).unwrap();
    n.on_option(OPT_STARTTLS, &[]);
    n.tls_started();
    assert_eq!(
        kinds(&n.on_option(OPT_STARTTLS, &[])),
        vec![REP_ERR_INVALID]
    );
    assert_eq!(
        kinds(&n.on_option(OPT_STRUCTURED_REPLY, &[])),
        vec![REP_ACK]
    );
    n.on_option(OPT_GO, &info_data("disk", &[]));
    let mut ro = disk();
    ro.read_only = true;
    let Outcome::Go(s) = n.on_export(Lookup::Found(ro)).outcome else {
        panic!()
    };
    assert_ne!(s.flags & FLAG_READ_ONLY, 0);
    assert!(s.structured);
}

#[test]
fn denied_export_is_a_policy_error_with_the_reason() {
    let mut n = Negotiation::new(1).unwrap();
    n.on_option(OPT_GO, &info_data("disk", &[]));
    let step = n.on_export(Lookup::Denied("permission denied: client.x lacks r".into()));
    let r = replies(&step.replies);
    assert_eq!(r[0].1, REP_ERR_POLICY);
    assert_eq!(r[0].2, b"permission denied: client.x lacks r");
    assert_eq!(step.outcome, Outcome::Continue);
    n.on_option(OPT_EXPORT_NAME, b"disk");
    assert!(matches!(
        n.on_export(Lookup::Denied("no".into())).outcome,
        Outcome::Close(HandshakeError::UnknownExport(_))
    ));
}
