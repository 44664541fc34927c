//! Property tests for the frontend message reader: whatever bytes a client sends, the checks
//! in [`framed`] either refuse them with a clean error or pass a message that pgwire's decoder
//! takes without panicking. Messages are random bytes under every type byte, and valid
//! messages of every kind mutated (truncated, bytes flipped or inserted, counts and lengths
//! overwritten with extreme values); the startup phase gets random and mutated startup
//! packets. Promised: no panic, no case longer than [`CASE_LIMIT`], no allocation beyond a
//! small multiple of the input, and a refusal only with the SQLSTATEs the reader documents.
//! The SCRAM exchange behind the SASL messages ([`sluice_server::scram::Exchange`]) gets
//! random and mutated client-first and client-final messages, for a real and an unknown
//! user, on plain and TLS connections: no panic, and no client-final accepted without the
//! password's proof.
//!
//! `SLUICE_FUZZ_CASES` sets the cases per property (default [`DEFAULT_CASES`]);
//! `SLUICE_FUZZ_SEED` the seed. See `docs/fuzzing.md`.

#[path = "../../storage/tests/harness/mod.rs"]
mod harness;

use bytes::BytesMut;
use harness::*;
use pgwire::messages::{DecodeContext, PgWireFrontendMessage, ProtocolVersion};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use sluice_server::wire::framed;

/// The limit the reader is given (a small `max_statement_bytes`).
const MAX_MESSAGE: usize = 64 << 10;

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// One valid message of every kind a client sends after startup.
fn valid_messages() -> Vec<Vec<u8>> {
    let parse = [cstr("s1"), cstr("SELECT $1::int"), vec![0, 1, 0, 0, 0, 23]].concat();
    let bind = [
        cstr("p1"),
        cstr("s1"),
        vec![0, 1, 0, 1],             // one format: binary
        vec![0, 2, 0, 0, 0, 2, 7, 7], // two parameters: 2 bytes
        vec![0xff, 0xff, 0xff, 0xff], // and NULL
        vec![0, 2, 0, 0, 0, 1],       // two result formats
    ]
    .concat();
    let password = cstr("secret");
    let sasl_initial = [
        cstr("SCRAM-SHA-256"),
        4i32.to_be_bytes().to_vec(),
        b"n,,x".to_vec(),
    ]
    .concat();
    vec![
        message(b'Q', &cstr("SELECT 1; INSERT INTO t VALUES ('x')")),
        message(b'P', &parse),
        message(b'B', &bind),
        message(b'E', &[cstr("p1"), 100i32.to_be_bytes().to_vec()].concat()),
        message(b'E', &[cstr(""), (-1i32).to_be_bytes().to_vec()].concat()),
        message(b'D', &[vec![b'S'], cstr("s1")].concat()),
        message(b'D', &[vec![b'P'], cstr("p1")].concat()),
        message(b'C', &[vec![b'S'], cstr("s1")].concat()),
        message(b'S', &[]),
        message(b'H', &[]),
        message(b'X', &[]),
        message(b'd', b"1,a\n2,b\n"),
        message(b'c', &[]),
        message(b'f', &cstr("client gave up")),
        message(b'p', &password),
        message(b'p', &sasl_initial),
        message(b'F', &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
    ]
}

/// A startup packet, an SSL request, a cancel request.
fn valid_startups() -> Vec<Vec<u8>> {
    let mut startup = 196608i32.to_be_bytes().to_vec();
    for kv in ["user", "alice", "database", "db", "options", "-c x=1"] {
        startup.extend(cstr(kv));
    }
    startup.push(0);
    let with_len = |body: Vec<u8>| [(body.len() as u32 + 4).to_be_bytes().to_vec(), body].concat();
    vec![
        with_len(startup),
        with_len(80877103i32.to_be_bytes().to_vec()),
        with_len(
            [
                80877102i32.to_be_bytes(),
                42i32.to_be_bytes(),
                7i32.to_be_bytes(),
            ]
            .concat(),
        ),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    /// An Int16 or Int32 field overwritten with an extreme value.
    Extreme(usize, u8),
    /// The length header made to lie.
    Length(u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1..=255u8).prop_map(|(at, x)| Mutation::Flip(at, x)),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), 0..6u8).prop_map(|(at, k)| Mutation::Extreme(at, k)),
        prop_oneof![Just(0u32), Just(3), Just(4), Just(5), any::<u32>()].prop_map(Mutation::Length),
    ]
}

fn apply(msg: &mut Vec<u8>, m: &Mutation, typed: bool) {
    let len = msg.len();
    match m {
        Mutation::Truncate(at) => msg.truncate(at % (len + 1)),
        Mutation::Flip(at, x) => msg[at % len] ^= x,
        Mutation::Insert(at, b) => {
            let at = at % (len + 1);
            msg.splice(at..at, b.iter().copied());
        }
        Mutation::Extreme(at, k) => {
            let values: [&[u8]; 6] = [
                &[0x7f, 0xff],
                &[0xff, 0xff],
                &[0x80, 0x00],
                &[0x7f, 0xff, 0xff, 0xff],
                &[0xff, 0xff, 0xff, 0xfe],
                &[0x80, 0, 0, 0],
            ];
            let v = values[*k as usize];
            if len >= v.len() {
                let at = at % (len - v.len() + 1);
                msg[at..at + v.len()].copy_from_slice(v);
            }
        }
        Mutation::Length(n) => {
            let head = usize::from(typed);
            if len >= head + 4 {
                msg[head..head + 4].copy_from_slice(&n.to_be_bytes());
            }
        }
    }
}

/// The reader's verdict on `bytes`, and pgwire's decode of what it passes.
fn read(bytes: &[u8], typed: bool) -> Result<(), TestCaseError> {
    let verdict = within_budget(ALLOC_SLACK + 4 * bytes.len(), || {
        framed(bytes, typed, MAX_MESSAGE)
    });
    match verdict {
        Err(refused) => {
            let code = refused.0.code.as_str();
            prop_assert!(
                ["08P01", "22021", "54000"].contains(&code),
                "refused with {code}: {}",
                refused.0.message
            );
        }
        Ok(None) => {
            // Incomplete: the header is not all there, or announces more than was sent.
            let head = usize::from(typed);
            if let Some(h) = bytes.get(head..head + 4) {
                let total = head + u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                prop_assert!(total > bytes.len(), "a complete message was not taken");
            }
        }
        Ok(Some(len)) => {
            let mut buf = BytesMut::from(&bytes[..len]);
            let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
            // The reader takes over once SSL negotiation is done: a startup or cancel packet.
            ctx.awaiting_frontend_ssl = false;
            ctx.awaiting_frontend_startup = !typed;
            // No catch_unwind here: the server has one as a last resort, this checks it is
            // never needed.
            let decoded = within_budget(ALLOC_SLACK + 4 * bytes.len(), || {
                PgWireFrontendMessage::decode(&mut buf, &ctx)
            });
            if let Ok(Some(_)) = decoded {
                prop_assert_eq!(buf.len(), 0, "the decoder left bytes of the message");
            }
        }
    }
    Ok(())
}

fn run(strategy: impl Strategy<Value = (Vec<u8>, bool)>) {
    let _serial = serial();
    let mut runner = TestRunner::new(config(cases()));
    runner
        .run(&strategy, |(bytes, typed)| timed(|| read(&bytes, typed)))
        .expect("a property failed");
}

#[test]
fn random_bytes_under_every_type_byte() {
    let kinds = b"QPBEDCSHXdcfpFZ\0\xff".to_vec();
    run((
        proptest::sample::select(kinds),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(kind, body)| (message(kind, &body), true)));
}

#[test]
fn mutated_valid_messages() {
    let valid = valid_messages();
    run((
        proptest::sample::select(valid),
        proptest::collection::vec(mutation(), 1..4),
    )
        .prop_map(|(mut msg, ms)| {
            for m in &ms {
                if !msg.is_empty() {
                    apply(&mut msg, m, true);
                }
            }
            (msg, true)
        }));
}

#[test]
fn random_and_mutated_startup_packets() {
    let valid = valid_startups();
    let random = proptest::collection::vec(any::<u8>(), 0..400)
        .prop_map(|body| [(body.len() as u32 + 4).to_be_bytes().to_vec(), body].concat());
    let mutated = (
        proptest::sample::select(valid),
        proptest::collection::vec(mutation(), 1..4),
    )
        .prop_map(|(mut msg, ms)| {
            for m in &ms {
                if !msg.is_empty() {
                    apply(&mut msg, m, false);
                }
            }
            msg
        });
    run(prop_oneof![random, mutated].prop_map(|b| (b, false)));
}

/// Client-first messages as drivers send them (plain, "y" binding flag, channel binding).
const CLIENT_FIRSTS: &[&str] = &[
    "n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL",
    "n,,n=,r=rOprNGfwEbeRWgbNEkqO",
    "y,,n=,r=abcdefghijklmnop",
    "p=tls-server-end-point,,n=,r=0123456789abcdef",
    "n,a=alice,n=alice,r=x",
];

/// Client-final templates; `{r}` becomes the nonce the server sent (so the message gets
/// past the nonce check and its proof is what is tried).
const CLIENT_FINALS: &[&str] = &[
    "c=biws,r={r},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    "c=eSws,r={r},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    "c=cD10bHMtc2VydmVyLWVuZC1wb2ludCwsAAAA,r={r},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    "c=biws,r={r},e=invalid-proof",
    "c=biws,r={r},p=",
    "c=biws,r={r}",
];

#[test]
fn scram_exchanges_take_any_client_messages_and_accept_no_forged_proof() {
    use sluice_server::scram::{Exchange, Verifier};
    let _serial = serial();
    // one iteration: the exchange's parsing is under test, not PBKDF2's cost
    let verifier = Verifier::with_salt("pencil", b"fuzz-salt-16byte", 1);
    let end_point = std::sync::Arc::new(vec![7u8; 32]);
    let bytes = |templates: &'static [&'static str]| {
        prop_oneof![
            1 => proptest::collection::vec(any::<u8>(), 0..200),
            3 => proptest::sample::select(templates).prop_map(|t| t.as_bytes().to_vec()),
            3 => (
                proptest::sample::select(templates),
                proptest::collection::vec(mutation(), 0..4)
            )
                .prop_map(|(t, ms)| {
                    let mut m = t.as_bytes().to_vec();
                    for mu in &ms {
                        if !m.is_empty() && !matches!(mu, Mutation::Length(_)) {
                            apply(&mut m, mu, false);
                        }
                    }
                    m
                }),
        ]
    };
    let mechanism = prop_oneof![
        6 => Just("SCRAM-SHA-256"),
        2 => Just("SCRAM-SHA-256-PLUS"),
        1 => Just("PLAIN"),
        1 => Just(""),
    ];
    let strategy = (
        mechanism,
        bytes(CLIENT_FIRSTS),
        proptest::sample::select(CLIENT_FINALS),
        proptest::collection::vec(mutation(), 0..3),
        any::<bool>(),
        any::<bool>(),
    );
    let finals = std::sync::atomic::AtomicU32::new(0);
    let mut runner = TestRunner::new(config(cases()));
    runner
        .run(
            &strategy,
            |(mechanism, first, final_template, mutations, real, tls)| {
                timed(|| {
                    let mut ex = Exchange::new(
                        "alice",
                        real.then(|| verifier.clone()),
                        &[9u8; 32],
                        tls.then(|| end_point.clone()),
                    );
                    let server_first = within_budget(ALLOC_SLACK + 8 * first.len(), || {
                        ex.client_first(mechanism, &first)
                    });
                    let Ok(server_first) = server_first else {
                        return Ok(());
                    };
                    let server_first = String::from_utf8_lossy(&server_first).into_owned();
                    let nonce = server_first
                        .split(',')
                        .find_map(|f| f.strip_prefix("r="))
                        .unwrap_or_default()
                        .to_string();
                    let mut last = final_template.replace("{r}", &nonce).into_bytes();
                    for mu in &mutations {
                        if !last.is_empty() && !matches!(mu, Mutation::Length(_)) {
                            apply(&mut last, mu, false);
                        }
                    }
                    finals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let verdict =
                        within_budget(ALLOC_SLACK + 8 * last.len(), || ex.client_final(&last));
                    prop_assert!(
                        verdict.is_err(),
                        "a client-final without the password's proof was accepted: {:?}",
                        String::from_utf8_lossy(&last)
                    );
                    Ok(())
                })
            },
        )
        .expect("a property failed");
    // the exchange got as far as a client-final in a fair share of the cases
    let reached = finals.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        reached >= cases() / 20,
        "only {reached} cases reached client-final"
    );
}
