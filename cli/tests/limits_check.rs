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
