//! `Rules::parse` on any text: never panics, is deterministic, and its errors name the origin
//! and a line inside the text.

#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile::rules::Rules;

fn check(text: &str) {
    let a = Rules::parse(text, "fuzz.toml");
    let b = Rules::parse(text, "fuzz.toml");
    assert_eq!(
        format!("{a:?}"),
        format!("{b:?}"),
        "parsing is deterministic"
    );
    if let Err(e) = a {
        assert_eq!(e.origin, "fuzz.toml");
        assert!(!e.message.is_empty(), "an error says what is wrong");
        let lines = text.split('\n').count();
        assert!(
            e.line <= lines,
            "error at line {} of a {lines}-line text: {e}",
            e.line
        );
        let shown = e.to_string();
        assert!(shown.starts_with("fuzz.toml:"), "{shown}");
    }
}

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(s) => check(s),
        Err(_) => check(&String::from_utf8_lossy(data)),
    }
});
