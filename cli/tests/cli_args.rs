//! The command line as a clap user expects it: `--help` everywhere, exit status 2 and a
//! message naming the option for bad input, completions for the shells.

use std::process::{Command, Output};

fn turnstile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .output()
        .expect("the turnstile binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_for_every_subcommand() {
    let top = turnstile(&["--help"]);
    assert!(top.status.success());
    let out = text(&top.stdout);
    for cmd in [
        "demo",
        "bench",
        "memory",
        "accuracy",
        "rules",
        "limits",
        "replay",
        "completions",
    ] {
        assert!(out.contains(cmd), "`{cmd}` missing from --help:\n{out}");
        let h = turnstile(&[cmd, "--help"]);
        assert!(h.status.success(), "{cmd} --help failed");
        assert!(text(&h.stdout).contains("Usage: turnstile"), "{cmd} --help");
    }
    let h = turnstile(&["rules", "check", "--help"]);
    assert!(h.status.success());
    let b = text(&turnstile(&["bench", "--help"]).stdout);
    for opt in [
        "--keys",
        "--distribution",
        "--threads",
        "--json",
        "--atomics",
    ] {
        assert!(b.contains(opt), "bench --help lacks {opt}");
    }
}

#[test]
fn bad_input_exits_2_naming_the_option() {
    for (args, needle) in [
        (&["bench", "--keys", "banana"][..], "--keys"),
        (&["bench", "--keys", "0"][..], "--keys"),
        (&["bench", "--threads", "0"][..], "--threads"),
        (&["bench", "--seconds", "-1"][..], "--seconds"),
        (&["bench", "--seconds", "0"][..], "above 0"),
        (&["bench", "--plot", "/nonexistent/dir/x.svg"][..], "--plot"),
        (&["bench", "--engine", "redis-ish"][..], "--engine"),
        (&["bench", "--algorithm", "nope"][..], "--algorithm"),
        (&["bench", "--clocks", "--callgrind"][..], "--c"),
        (&["bench", "--atomics", "--keys", "5"][..], "--atomics"),
        (&["memory", "--users", "x"][..], "--users"),
        (
            &["accuracy", "--mix", "calm", "--requests", "10"][..],
            "--mix",
        ),
        (&["bench", "--no-such-flag"][..], "--no-such-flag"),
        (&["no-such-command"][..], "no-such-command"),
        (&["rules", "check"][..], "FILE"),
        (&["limits", "check"][..], "RULES"),
        (&["replay", "x.log"][..], "--rules"),
        (&["replay", "--key", "bogus=$x", "x.log"][..], "bogus"),
        (&["replay", "--key", "customer", "x.log"][..], "PART=$FIELD"),
        (&["replay", "--format", "xml", "x.log"][..], "--format"),
        (
            &[
                "replay",
                "--rules",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/replay-rules.toml"),
                "/nonexistent/x.log",
            ][..],
            "/nonexistent/x.log",
        ),
        (
            &[
                "replay",
                "--rules",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/replay-rules.toml"),
                "--log-format",
                "$a$b",
                "x.log",
            ][..],
            "--log-format",
        ),
    ] {
        let o = turnstile(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?} should name {needle}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn completions_for_bash() {
    let o = turnstile(&["completions", "bash"]);
    assert!(o.status.success());
    let s = text(&o.stdout);
    assert!(s.contains("_turnstile()") && s.contains("bench"), "{s}");
    assert_eq!(turnstile(&["completions", "tcsh"]).status.code(), Some(2));
}

/// `turnstile demo | head -1`: the reader gone, the command ends as a Unix filter does (by
/// SIGPIPE, or done), never with a panic.
#[test]
fn a_closed_output_pipe_is_no_panic() {
    use std::process::Stdio;
    for args in [&["demo"][..], &["accuracy", "--requests", "10k"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert!(
                out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
                "{args:?}: {:?} {err}",
                out.status
            );
        }
    }
}

#[test]
fn version_names_the_commit_the_target_and_the_features() {
    // The commit of the checkout the test binary was built in (git is a declared tool).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| text(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let short = turnstile(&["-V"]);
    assert!(short.status.success());
    let short = text(&short.stdout);
    assert!(short.starts_with("turnstile 0."), "{short}");
    assert!(short.contains(&format!("(commit {head})")), "{short}");
    let long = text(&turnstile(&["--version"]).stdout);
    for line in ["commit:   ", "target:   ", "features: rules"] {
        assert!(long.contains(line), "{long}");
    }
    if cfg!(target_os = "linux") {
        assert!(long.contains("io-uring"), "{long}");
    }
    if cfg!(target_feature = "cmpxchg16b") {
        assert!(long.contains("cmpxchg16b"), "{long}");
    }
}
