//! The TOML front end's tests: durations, and byte offsets as lines and columns.

use super::*;

#[test]
fn durations() {
    let ms = Duration::from_millis;
    assert_eq!(parse_duration("1s"), Ok(ms(1000)));
    assert_eq!(parse_duration("500ms"), Ok(ms(500)));
    assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
    assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
    assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("2d"), Ok(ms(172_800_000)));
    for bad in [
        "",
        "s",
        "1",
        "1 s",
        "1sec",
        "-1s",
        "1.5s",
        "99999999999999999999999d",
        "1s2",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn line_columns() {
    let t = "ab\ncdé\nf";
    assert_eq!(line_col(t, 0), (1, 1));
    assert_eq!(line_col(t, 3), (2, 1));
    assert_eq!(line_col(t, 7), (2, 4));
    assert_eq!(line_col(t, 8), (3, 1));
    assert_eq!(line_col(t, 99), (3, 2));
}
