//! The Envoy YAML importer on any text: `envoy::config::parse` never panics, its errors name
//! the origin and a line inside the text, and an accepted configuration compiles into a
//! matcher that answers lookups, and imports into a rules file that `Rules::parse` accepts.

#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile::rules::Rules;
use turnstile_server::envoy::config::parse;
use turnstile_server::envoy::import_to_rules;
use turnstile_server::envoy::matcher::Matcher;

fn check(text: &str) {
    match parse("fuzz.yaml", text) {
        Err(e) => {
            assert_eq!(e.origin, "fuzz.yaml");
            assert!(!e.message.is_empty(), "an error says what is wrong");
            // YAML's line breaks: "\r\n", "\r" and "\n" (a bare "\r" starts a line too).
            let lines = text.replace("\r\n", "\n").split(['\n', '\r']).count() + 1;
            assert!(e.line <= lines, "error at line {} of {lines}: {e}", e.line);
        }
        Ok(cfg) => {
            let m = Matcher::new(&cfg);
            let (mut buf, mut key) = (String::new(), Vec::new());
            for (d, desc, _) in cfg.limits() {
                // Looking up the configured path itself (wildcards taken literally) never panics.
                let _ = m.lookup(
                    &d.name,
                    &[(desc.key.as_str(), desc.value.as_str())],
                    &mut buf,
                    &mut key,
                );
            }
            let rules = import_to_rules(&cfg);
            if let Err(e) = Rules::parse(&rules, "imported.toml") {
                panic!("the import does not parse: {e}\n{rules}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
});
