//! `turnstile rules check`: the binary validates the example file and reports a bad one as
//! `file:line:column:` with exit status 1.

#[test]
fn cli_check() {
    let bin = env!("CARGO_BIN_EXE_turnstile");
    let ok = std::process::Command::new(bin)
        .args([
            "rules",
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml"),
        ])
        .output()
        .unwrap();
    assert!(ok.status.success());
    let out = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(out.lines().count(), 1);
    assert!(out.contains(": ok: 6 rules"), "{out}");
    let dir = std::env::temp_dir().join(format!("turnstile-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.toml");
    std::fs::write(
        &f,
        "[[rule]]\nname = \"a\"\nkey = \"customer\"\nlimits = [{ limit = 5, window = \"5x\" }]\n",
    )
    .unwrap();
    let bad = std::process::Command::new(bin)
        .args(["rules", "check"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.starts_with(&format!("{}:4:33: ", f.display())), "{err}");
    // A Redis backend: what its scripts cannot run is refused where it is written.
    let f = dir.join("redis.toml");
    std::fs::write(
        &f,
        "[backend]\nredis = \"redis://127.0.0.1:6379\"\n[[rule]]\nname = \"a\"\nkey = \"customer\"\nlimits = [{ limit = 5, window = \"60d\" }]\n",
    )
    .unwrap();
    let bad = std::process::Command::new(bin)
        .args(["rules", "check"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.starts_with(&format!("{}:6:33: a window of", f.display())),
        "{err}"
    );
    let ok = std::process::Command::new(bin)
        .args([
            "rules",
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules-redis.toml"),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{out}");
    assert!(
        out.contains("; backend redis redis://127.0.0.1:6379"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
