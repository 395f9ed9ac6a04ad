//! `turnstile limits check`: the binary loads the example's limits file and reports a bad one
//! as `file:line:` with exit status 1.

#[test]
fn cli_limits_check() {
    let bin = env!("CARGO_BIN_EXE_turnstile");
    let ok = std::process::Command::new(bin)
        .args([
            "limits",
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules-limits.toml"),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        out.contains("class customers: ") && out.contains(": ok: 4 entries"),
        "{out}"
    );
    let dir = std::env::temp_dir().join(format!("turnstile-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("r.toml");
    std::fs::write(
        &rules,
        "[limits.c]\nkey = \"customer\"\nalgorithm = \"token_bucket\"\nfile = \"l.csv\"\nplans.pro = { limit = 5, window = \"1s\" }\n",
    )
    .unwrap();
    std::fs::write(dir.join("l.csv"), "1,pro\n2,gold\n").unwrap();
    let bad = std::process::Command::new(bin)
        .args(["limits", "check"])
        .arg(&rules)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.starts_with(&format!(
            "{}:2: class `c` has no plan `gold`",
            dir.join("l.csv").display()
        )),
        "{err}"
    );
}

/// `turnstile limits export`: a file's entries, exported in either format and loaded again,
/// are the same entries (exported again, the same text); hashed keys are refused.
#[test]
fn cli_limits_export_round_trips() {
    let bin = env!("CARGO_BIN_EXE_turnstile");
    let dir = std::env::temp_dir().join(format!("turnstile-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rules = |file: &str| {
        format!(
            "[limits.c]\nkey = \"customer\"\nalgorithm = \"token_bucket\"\nfile = \"{file}\"\n\
             plans.pro = {{ limit = 5, window = \"1s\" }}\n\
             [limits.ips]\nkey = \"ip/24\"\nalgorithm = \"fixed_window\"\nwindow = \"1m\"\nfile = \"ips.csv\"\n\
             [limits.keys]\nkey = \"api_key\"\nalgorithm = \"token_bucket\"\n"
        )
    };
    std::fs::write(dir.join("r.toml"), rules("l.csv")).unwrap();
    std::fs::write(
        dir.join("l.csv"),
        "key,plan\n42,5/1s burst=10\n241531,pro\n7,3/1h30m\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("ips.csv"),
        "10.1.2.3,100\n192.168.0.9,5/1m count_denied\n2001:db8::1,7\n",
    )
    .unwrap();
    let export = |rules: &str, args: &[&str]| {
        let o = std::process::Command::new(bin)
            .args(["limits", "export"])
            .arg(dir.join(rules))
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, csv, err) = export("r.toml", &["--class", "c"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(csv, "key,entry\n7,3/1h30m\n42,5/1s burst=10\n241531,pro\n");
    let (code, jsonl, err) = export("r.toml", &["--class", "c", "--format", "jsonl"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        jsonl,
        "{\"key\":\"7\",\"limit\":3,\"window\":\"1h30m\"}\n\
         {\"key\":\"42\",\"limit\":5,\"window\":\"1s\",\"burst\":10}\n\
         {\"key\":\"241531\",\"plan\":\"pro\"}\n"
    );
    // Each export loads back to the same entries.
    for (file, text) in [("back.csv", &csv), ("back.jsonl", &jsonl)] {
        std::fs::write(dir.join(file), text).unwrap();
        std::fs::write(dir.join(format!("{file}.toml")), rules(file)).unwrap();
        let (code, again, err) = export(&format!("{file}.toml"), &["--class", "c"]);
        assert_eq!(code, Some(0), "{file}: {err}");
        assert_eq!(again, csv, "{file}");
    }
    // IPv4 keys print as their group's first address, which reads back as the same group;
    // an IPv6 entry is a hash: not invented, but counted, and the exit status says so.
    let (code, ips, err) = export("r.toml", &["--class", "ips"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        ips,
        "key,entry\n10.1.2.0,100/1m\n192.168.0.0,5/1m count_denied\n"
    );
    assert!(err.contains("1 IPv6 entries not exported"), "{err}");
    // Hashed keys: refused, nothing invented.
    let (code, out, err) = export("r.toml", &["--class", "keys"]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert!(
        err.contains("keyed by api_key, which the engine keeps as hashes"),
        "{err}"
    );
    let (code, _, err) = export("r.toml", &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("choose one with --class NAME"), "{err}");
    let (code, _, err) = export("r.toml", &["--class", "nope"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("the classes: c, ips, keys"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
