//! The command table and the parsing of each family's arguments.

use super::*;

fn with<R>(parts: &[&str], f: impl FnOnce(Args<'_>) -> R) -> R {
    let mut buf = Vec::new();
    let mut ranges = Vec::new();
    for p in parts {
        let s = buf.len();
        buf.extend_from_slice(p.as_bytes());
        ranges.push(s..buf.len());
    }
    f(Args {
        buf: &buf,
        ranges: &ranges,
    })
}

fn err(parts: &[&str]) -> String {
    with(parts, |a| match Command::parse(a) {
        Ok(_) => "ok".into(),
        Err(e) => e.reply(a),
    })
}

#[test]
fn arity_from_the_table() {
    assert_eq!(err(&["PING"]), "ok");
    assert_eq!(err(&["ping", "a"]), "ok");
    assert_eq!(
        err(&["ping", "a", "b"]),
        "ERR wrong number of arguments for 'ping' command"
    );
    assert_eq!(
        err(&["CL.THROTTLE", "k", "1", "2"]),
        "ERR wrong number of arguments for 'cl.throttle' command"
    );
    assert_eq!(
        err(&["cl.throttle", "k", "1", "2", "3", "4", "5"]),
        "ERR wrong number of arguments for 'cl.throttle' command"
    );
    assert_eq!(err(&["cl.throttle", "k", "1", "2", "3", "4"]), "ok");
    assert_eq!(
        err(&["nope", "a", "b"]),
        "ERR unknown command 'nope', with args beginning with: 'a' 'b' "
    );
    assert_eq!(
        err(&["TURNSTILE.PEEK", "customer", "1", "2", "3"]),
        "ERR wrong number of arguments for 'turnstile.peek' command"
    );
}

#[test]
fn every_name_is_upper_case_and_unique() {
    for (i, s) in COMMANDS.iter().enumerate() {
        assert_eq!(s.name, s.name.to_uppercase());
        assert!(s.max_args >= s.arity.unsigned_abs() as usize, "{}", s.name);
        assert!(COMMANDS[..i].iter().all(|t| t.name != s.name));
    }
}

/// The commands Redis lets through before `AUTH`, and those it runs at once inside a
/// `MULTI`, as the table's flags and kinds give them.
#[test]
fn noauth_and_multi_commands_are_redis_s() {
    let names = |f: fn(&Spec) -> bool| -> Vec<&str> {
        COMMANDS.iter().filter(|s| f(s)).map(|s| s.name).collect()
    };
    assert_eq!(names(Spec::noauth), ["HELLO", "AUTH", "QUIT", "RESET"]);
    assert_eq!(
        names(Spec::runs_in_multi),
        ["QUIT", "RESET", "MULTI", "EXEC", "DISCARD", "WATCH"]
    );
}

#[test]
fn integers_as_redis_reads_them() {
    assert_eq!(parse_i64(b"12"), Ok(12));
    assert_eq!(parse_i64(b"-3"), Ok(-3));
    assert_eq!(parse_i64(b"+3"), Err(CmdError::NotInteger));
    assert_eq!(parse_i64(b"1.5"), Err(CmdError::NotInteger));
    assert_eq!(
        parse_i64(b"99999999999999999999"),
        Err(CmdError::NotInteger)
    );
    assert_eq!(
        CmdError::NotInteger.to_string(),
        "ERR value is not an integer or out of range"
    );
}

proptest::proptest! {
    /// The byte parser accepts what `str::parse::<i64>` accepts (but a leading `+`).
    #[test]
    fn parse_i64_is_str_parse(s in "[-+]?[0-9]{0,22}|[ -~]{0,6}|-?9223372036854775[0-9]{3}") {
        let want = if s.starts_with('+') { None } else { s.parse::<i64>().ok() };
        proptest::prop_assert_eq!(parse_i64(s.as_bytes()).ok(), want);
    }
}
